"""Greedy on the last gain: tune again the task whose last slot cut the weighted latency the most.

Untried tasks come first (in index order). Among tried tasks the score is
``weight x (best before its last slot - best after it)``; ties (e.g. every last gain is 0) go to the
task with the fewest visits, then the lowest index, so a stalled greedy degrades to round robin.
"""

from __future__ import annotations

import math

from dynatune.schedulers.base import Belief, RoundContext
from dynatune.schedulers.common import ParamScheduler, best_history


def last_gain(task) -> float:
    """Weighted drop of the best latency brought by the task's last slot (0 if never tuned)."""
    h = best_history(task)
    if not h:
        return 0.0
    before = h[-2] if len(h) >= 2 else task.default_s
    if not (math.isfinite(before) and math.isfinite(h[-1])):
        return 0.0
    return task.weight * max(before - h[-1], 0.0)


class GreedyScheduler(ParamScheduler):
    name = "greedy"
    defaults: dict = {}

    def choose(self, ctx: RoundContext) -> int | None:
        alive = [t for t in ctx.tasks if not t.exhausted]
        if not alive:
            return None
        fresh = [t for t in alive if t.visits == 0]
        if fresh:
            return fresh[0].index
        return max(alive, key=lambda t: (last_gain(t), -t.visits, -t.index)).index

    def beliefs(self, ctx: RoundContext) -> list[Belief]:
        return [
            Belief(
                t.index,
                t.name,
                t.weight,
                t.best_s,
                last_gain(t),
                0.0,
                float("inf") if t.visits == 0 else last_gain(t),
                t.visits,
                t.exhausted,
                "last gain",
            )
            for t in ctx.tasks
        ]
