"""Deterministic replay of recorded tuning traces: compare schedulers without tuning anything.

A trace file (``dynatune/bench/data/traces/<model>.json``, written by ``bench.record_traces``) holds,
per task, ``trace = [[seconds, trials, best_s], ...]`` with ``trace[0] = [0, 0, default_s]``: the best
latency after that many seconds of tuning that task alone (one point per batch of trials). A replay gives the
scheduler a budget ``B`` and a slot length ``S``; each round the chosen task runs as a live slot does: whole
batches until ``S`` seconds have passed, at least one. So it advances to the first recorded point at or after
(its seconds so far + ``S``) -- a slot that starts a task's slow first batch (which also builds its design
space) lasts that whole batch -- and the replay clock advances by those real seconds. Past the end of its
trace a task advances exactly ``S``. The model latency ``sum weight x best`` after every round is the
objective curve. A task without a valid untuned latency (it could not run) is marked exhausted and left
out of the objective (listed in ``skipped``).

End of a trace: beyond its last recorded time a task's curve is flat. The recorder stops a task either
at ``seconds_per_task`` (its own budget: the curve was still going, flat is the pessimistic guess) or
earlier because its search space was exhausted; in the second case the task becomes ``exhausted`` once
its trace is used up (``exhaust_at_end=None``, the default). ``True`` exhausts every task at the end of
its trace, ``False`` none.

A trace document may hold several traces per task (one per search seed, :mod:`dynatune.bench.traces`); the
replay plays one per task: give it ``traces.draw(doc, rng)``, or the whole document for the first of each.
The benchmark over draws is :mod:`dynatune.bench.replay_bench`.
"""

from __future__ import annotations

import math
import statistics
import time
from bisect import bisect_right
from dataclasses import dataclass, field

from dynatune.bench.traces import draw, task_bound, task_traces
from dynatune.errors import DynatuneError
from dynatune.schedulers.base import RoundContext, TaskView, running_best


class _ReplayTask(TaskView):
    """A TaskView whose best is kept up to date as points are appended (O(1) ``best_s``)."""

    @property
    def best_s(self) -> float:
        return self._best

    def append(self, point) -> None:
        self.history.append(point)
        self._best = min(self._best, point[2])


@dataclass
class ReplayResult:
    curve: list  # [(elapsed_s, objective_s)], starting at (0, untuned objective)
    choices: list  # task index chosen each round
    decision_s_per_round: float  # mean wall seconds per choose()
    decision_s_max: float = 0.0
    final: float = math.nan  # objective at the end
    skipped: list = field(
        default_factory=list
    )  # tasks without a valid untuned latency (not in the objective)
    stop: dict | None = None  # the stopping rule's check that ended the replay (None: it did not)


def _rows(traces) -> list[dict]:
    """The task rows of a trace document (or of a bare list of rows)."""
    return traces["tasks"] if isinstance(traces, dict) else list(traces)


def _tasks_of(traces) -> list[dict]:
    rows = _rows(traces)
    if any("trace" not in r for r in rows):  # several traces per task: replay the first of each
        rows = draw({"tasks": rows}, None)["tasks"]
    return rows


def _ends_early(traces, row) -> bool:
    """Did the recorder stop this task before its time budget (search space exhausted)?"""
    cap = traces.get("seconds_per_task") if isinstance(traces, dict) else None
    return cap is not None and float(row["trace"][-1][0]) < float(cap) - 1e-9


def running_bests(row: dict) -> list[float]:
    """Best latency after each point of a task's trace (running minimum from its ``default_s``)."""
    return running_best(
        float(row["default_s"]), [None if p[2] is None else float(p[2]) for p in row["trace"]]
    )


def timed_pick(scheduler, ctx) -> tuple[int | None, float]:
    """The scheduler's pick for ``ctx`` and the seconds it took to decide."""
    t0 = time.perf_counter()
    i = scheduler.pick(ctx)
    return i, time.perf_counter() - t0


def replay(
    traces,
    scheduler,
    budget_s: float,
    slot_s: float,
    *,
    exhaust_at_end: bool | None = None,
    stop_at: float | None = None,
    stop_after_s: float = 0.0,
    stopping=None,
) -> ReplayResult:
    """Replay ``scheduler`` on ``traces`` for ``budget_s`` seconds of slots of ``slot_s`` seconds.

    ``stop_at``: also stop once the objective is <= this value and at least ``stop_after_s`` elapsed.
    ``stopping``: a :class:`~dynatune.run.stopping.StoppingRule`, checked after every round as a live run
    checks it; the replay ends when it says stop (:attr:`ReplayResult.stop`).
    """
    rows = _tasks_of(traces)
    tasks, times, trials, bests = [], [], [], []
    for k, r in enumerate(rows):
        default = float(r["default_s"])
        t = _ReplayTask(
            int(r.get("index", k)),
            r.get("name", f"task{k}"),
            r.get("key", str(k)),
            int(r.get("weight", 1)),
            float(r.get("flops", 0.0)),
            default,
            bound_s=task_bound(traces, r),
            anchor_s=float(r.get("anchor_s", 0.0)),
        )
        t._best = default
        tasks.append(t)
        tr = r["trace"]
        times.append([float(p[0]) for p in tr])
        trials.append([int(p[1]) for p in tr])
        bests.append(running_bests(r))
        if not (math.isfinite(default) and default > 0):
            t.exhausted = True  # untuned latency unknown (the task could not run): left out of the objective
    if [t.index for t in tasks] != list(range(len(tasks))):
        raise DynatuneError("trace task indices must be 0..n-1 in order", "re-record the trace file")
    weights = [t.weight for t in tasks]
    skipped = [t.name for t in tasks if t.exhausted]
    exhausts = [_ends_early(traces, r) if exhaust_at_end is None else bool(exhaust_at_end) for r in rows]

    def objective() -> float:
        return math.fsum(w * t._best for w, t in zip(weights, tasks) if math.isfinite(t._best))

    spent = [0.0] * len(tasks)  # tuning seconds each task has had
    elapsed, rnd, stop = 0.0, 0, None
    if stopping is not None:
        stopping.attach(scheduler)
    curve, choices, dts = [(0.0, objective())], [], []
    while elapsed < budget_s - 1e-9:
        if stop_at is not None and curve[-1][1] <= stop_at and elapsed >= stop_after_s - 1e-9:
            break
        i, dt = timed_pick(scheduler, RoundContext(tasks, rnd, slot_s, elapsed, budget_s))
        dts.append(dt)
        if i is None:
            break
        start = spent[i]
        spent[i] = slot_end(times[i], start, slot_s)
        k = bisect_right(times[i], spent[i] + 1e-9) - 1
        tasks[i].append((spent[i], trials[i][k], bests[i][k]))
        if exhausts[i] and spent[i] >= times[i][-1] - 1e-9:
            tasks[i].exhausted = True
        rnd += 1
        elapsed += spent[i] - start
        choices.append(i)
        curve.append((elapsed, objective()))
        if stopping is not None:
            check = stopping.check(RoundContext(tasks, rnd, slot_s, elapsed, budget_s))
            if check.stop:
                stop = check.as_dict()
                break
    dt_mean = statistics.fmean(dts) if dts else 0.0
    return ReplayResult(curve, choices, dt_mean, max(dts, default=0.0), curve[-1][1], skipped, stop)


def slot_end(times: list, start: float, slot_s: float) -> float:
    """Where a slot that starts at ``start`` seconds of a task's trace ends, as a live slot would.

    A live slot (:meth:`TuningSession.tune`) runs whole batches until ``slot_s`` has passed, and always at
    least one: it ends at the first recorded batch end at or after ``start + slot_s``. Past the end of
    the trace the curve is flat and a slot lasts exactly ``slot_s``.
    """
    k = bisect_right(times, start + slot_s - 1e-9)  # first point >= start + slot_s
    if k < len(times):
        return times[k]
    return start + slot_s


def time_to_quality(curve, target: float, rtol: float = 1e-9) -> float:
    """First elapsed time at which the objective is <= ``target`` (inf if never)."""
    for t, obj in curve:
        if obj <= target * (1.0 + rtol):
            return t
    return math.inf


def objective_at(curve, t: float) -> float:
    """Objective of the curve at elapsed time ``t`` (last point at or before ``t``)."""
    val = curve[0][1]
    for s, obj in curve:
        if s > t + 1e-9:
            break
        val = obj
    return val


def total_trace_seconds(traces) -> float:
    """Recorded tuning seconds of the model: per task, the mean length of its traces, summed."""
    return math.fsum(
        statistics.fmean(float(x["trace"][-1][0]) for x in task_traces(r)) for r in _rows(traces)
    )


def default_slot(traces) -> float:
    """The median spacing of recorded trace points (one recorded step per slot), over every trace."""
    steps = [
        float(x["trace"][-1][0]) / (len(x["trace"]) - 1)
        for r in _rows(traces)
        for x in task_traces(r)
        if len(x["trace"]) > 1
    ]
    return statistics.median(steps) if steps else 1.0


def ttq_ratio(a: float, b: float, cap: float):
    """TTQ ratio a / b; a TTQ never reached counts as ``cap`` (the run's horizon), None if undefined."""
    a, b = min(a, cap), min(b, cap)
    return None if b == 0 else a / b
