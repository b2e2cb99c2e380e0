"""MetaSchedule's gradient-based task scheduler (``GradientBasedNode::NextTaskId``), rule for rule.

1. Warm-up: the first ``n_tasks`` calls return task 0, 1, ..., n-1 in index order (a task already
   exhausted is skipped, as MetaSchedule terminates it without spending time on it).
2. Then, over the tasks still alive, with ``h`` the task's best latency after each of its ``n`` slots::

       g1 = (h[n-1-window] - h[n-1]) / window   if n >= 1 + window else 0     (backward gradient)
       g2 = h[n-1] / n                                                         (forward estimate)
       score = weight * (alpha * g1 + (1 - alpha) * g2)

   and pick the argmax (first one on ties); if every score is equal, a seeded random alive task.

Difference from the C++: MetaSchedule's history starts at +inf and only holds measured latencies; ours
starts from the untuned default (a task whose slot measured nothing keeps its default, not 1e100; a
task with no valid latency at all scores +inf, as MetaSchedule's 1e100 would).
"""

from __future__ import annotations

import math

import numpy as np

from dynatune.schedulers.base import Belief, RoundContext
from dynatune.schedulers.common import ParamScheduler, best_history


def gradient_score(task, alpha: float, window: int) -> float:
    h = best_history(task)
    n = len(h)
    if n == 0:
        return float("inf")  # never tuned (only possible after a restore): tune it first
    best = h[-1]
    if not math.isfinite(best):
        return math.inf  # like MetaSchedule's 1e100 "nothing measured yet": such a task is picked
    g1 = (h[n - 1 - window] - best) / window if n >= 1 + window else 0.0
    g2 = best / n
    return task.weight * (alpha * g1 + (1.0 - alpha) * g2)


class GradientScheduler(ParamScheduler):
    name = "gradient"
    defaults = {"alpha": 0.2, "window": 3}

    def __init__(self, seed: int = 0, **params):
        super().__init__(seed, **params)
        self.rounds_done = 0  # num_rounds_already_

    def _warmup_pick(self, ctx: RoundContext) -> int | None:
        """The round-robin warm-up's next task (exhausted ones skipped), None once it is over."""
        return next((i for i in range(self.rounds_done, len(ctx.tasks)) if not ctx.tasks[i].exhausted), None)

    def choose(self, ctx: RoundContext) -> int | None:
        i = self._warmup_pick(ctx)
        if i is not None:
            return i
        alive = [t for t in ctx.tasks if not t.exhausted]
        if not alive:
            return None
        grad = [gradient_score(t, self.alpha, self.window) for t in alive]
        hi, lo = max(grad), min(grad)
        if hi == lo:  # a seeded draw, the same for the same round
            return alive[int(np.random.default_rng([self.seed, self.rounds_done]).integers(len(alive)))].index
        return alive[grad.index(hi)].index

    def after_round(self, ctx: RoundContext, choice: int) -> None:
        i = self._warmup_pick(ctx)
        self.rounds_done = i + 1 if i is not None else max(self.rounds_done, len(ctx.tasks)) + 1

    def beliefs(self, ctx: RoundContext) -> list[Belief]:
        return [
            Belief(
                t.index,
                t.name,
                t.weight,
                t.best_s,
                0.0,
                0.0,
                gradient_score(t, self.alpha, self.window),
                t.visits,
                t.exhausted,
                "gradient",
            )
            for t in ctx.tasks
        ]

    def state_dict(self) -> dict:
        return {"rounds_done": self.rounds_done}

    def load_state_dict(self, state: dict) -> None:
        self.rounds_done = int(state.get("rounds_done", 0))
