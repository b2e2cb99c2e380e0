"""How long does one DynaTune decision take? 253 synthetic tasks with histories, 200 rounds.

Each round the scheduler chooses a task and that task gets one more history point (as in real tuning),
so only its belief is refitted. Prints the cold first decision (every task fitted from scratch, as after
a restart) and the mean / max seconds per choose() over the rounds.

    python bench/decision_speed.py [--tasks 253] [--rounds 200] [--scheduler dynatune]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

from dynatune.bench.replay import timed_pick  # noqa: E402
from dynatune.schedulers import make_scheduler  # noqa: E402
from dynatune.schedulers.base import RoundContext, TaskView  # noqa: E402


def make_tasks(n: int, slot_s: float, rng) -> tuple[list[TaskView], list]:
    """Tasks with 0..40 slots of history each, on random power-law curves (and the curves themselves)."""
    tasks, curves = [], []
    for i in range(n):
        default = float(10 ** rng.uniform(-6, -2.5))
        floor, drop, rate = rng.uniform(0.1, 0.5), rng.uniform(0.1, 0.5), rng.uniform(0.2, 1.5)

        def curve(k, floor=floor, drop=drop, rate=rate, default=default):
            noise = 1 + 0.03 * abs(rng.standard_normal())
            return default * (floor + drop * k**-rate) * noise

        t = TaskView(i, f"task{i}", f"k{i}", int(rng.integers(1, 6)), 1e6, default)
        best = default
        for k in range(1, int(rng.integers(0, 41)) + 1):
            best = min(best, curve(k))
            t.history.append((k * slot_s, 8 * k, best))
        tasks.append(t)
        curves.append(curve)
    return tasks, curves


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--tasks", type=int, default=253)
    ap.add_argument("--rounds", type=int, default=200)
    ap.add_argument("--slot", type=float, default=5.0)
    ap.add_argument("--scheduler", default="dynatune")
    args = ap.parse_args()
    rng = np.random.default_rng(0)
    tasks, curves = make_tasks(args.tasks, args.slot, rng)
    sched = make_scheduler(args.scheduler)
    times = []
    for r in range(args.rounds):
        i, dt = timed_pick(sched, RoundContext(tasks, r, args.slot, sum(t.seconds for t in tasks)))
        times.append(dt)
        if i is None:
            break
        t = tasks[i]
        t.history.append((t.seconds + args.slot, t.trials + 8, min(t.best_s, curves[i](t.visits + 1))))
    warm = times[1:]
    print(
        f"scheduler={args.scheduler} tasks={args.tasks} rounds={len(times)} "
        f"points={sum(t.visits for t in tasks)}"
    )
    print(f"cold first decision (fit every task): {times[0]:.4f} s")
    print(
        f"per decision after that: mean {statistics.fmean(warm):.5f} s, "
        f"median {statistics.median(warm):.5f} s, max {max(warm):.5f} s"
    )
    fits = getattr(getattr(sched, "model", None), "fits", None)
    if fits is not None:
        print(
            f"curve fits: {fits} (every task with enough points at the cold start, "
            "then at most one per round)"
        )


if __name__ == "__main__":
    main()
