"""Deterministic replay of recorded tuning traces: compare schedulers without tuning anything.

A trace file (``dynatune/data/traces/<model>.json``, written by ``bench/record_traces.py``) holds, per task,
``trace = [[seconds, trials, best_s], ...]`` with ``trace[0] = [0, 0, default_s]``: the best latency after
that many seconds of tuning that task alone (one point per batch of trials). A replay gives the scheduler
a budget ``B`` and a slot length ``S``; each round the chosen task runs as a live slot does: whole batches
until ``S`` seconds have passed, at least one. So it advances to the first recorded point at or after
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

Benchmark (:func:`run_replay_benchmark`): for each model and budget fraction ``f`` of the total recorded
time ``T = sum of per-task trace lengths``, the gradient scheduler (MetaSchedule's default) runs for
``B = f T``; its final objective ``Q`` is the quality target. Every scheduler then runs (up to
``horizon x B``) and its time-to-quality TTQ is the first elapsed time at which its objective <= Q.
The ratios ``TTQ_gradient / TTQ_dynatune`` and ``TTQ_round_robin / TTQ_dynatune`` (> 1: DynaTune is
faster; a target never reached counts as ``horizon x B``, listed under ``censored``) are summarised by
their medians over models.
"""

from __future__ import annotations

import glob
import json
import math
import os
import statistics
import time
from bisect import bisect_right
from dataclasses import dataclass, field

from .errors import DynatuneError
from .schedulers import make_scheduler
from .schedulers.base import RoundContext, TaskView, running_best

TRACE_DIR = os.path.join(os.path.dirname(__file__), "data", "traces")
BENCH_SCHEDULERS = ("dynatune", "gradient", "round_robin", "greedy", "random")


def load_traces(path_or_name: str) -> dict:
    """A trace document from a path, or from a model name in ``dynatune/data/traces/``."""
    path = path_or_name
    if not os.path.exists(path):
        path = os.path.join(TRACE_DIR, os.path.basename(path_or_name).removesuffix(".json") + ".json")
    if not os.path.exists(path):
        raise DynatuneError(f"no traces for {path_or_name!r}", "available: " + (", ".join(available_traces())
                                                                              or "none recorded yet"))
    with open(path) as f:
        doc = json.load(f)
    if not doc.get("tasks"):
        raise DynatuneError(f"trace file {path} has no tasks", "re-record it with bench/record_traces.py")
    return doc


def available_traces() -> list[str]:
    return sorted(os.path.basename(p)[:-5] for p in glob.glob(os.path.join(TRACE_DIR, "*.json")))


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
    skipped: list = field(default_factory=list)  # tasks without a valid untuned latency (not in the objective)


def _tasks_of(traces) -> list[dict]:
    return traces["tasks"] if isinstance(traces, dict) else list(traces)


def _ends_early(traces, row) -> bool:
    """Did the recorder stop this task before its time budget (search space exhausted)?"""
    cap = traces.get("seconds_per_task") if isinstance(traces, dict) else None
    return cap is not None and float(row["trace"][-1][0]) < float(cap) - 1e-9


def running_bests(row: dict) -> list[float]:
    """Best latency after each point of a task's trace (running minimum from its ``default_s``)."""
    return running_best(float(row["default_s"]), [None if p[2] is None else float(p[2]) for p in row["trace"]])


def timed_pick(scheduler, ctx) -> tuple[int | None, float]:
    """The scheduler's pick for ``ctx`` and the seconds it took to decide."""
    t0 = time.perf_counter()
    i = scheduler.pick(ctx)
    return i, time.perf_counter() - t0


def replay(traces, scheduler, budget_s: float, slot_s: float, *, exhaust_at_end: bool | None = None,
           stop_at: float | None = None, stop_after_s: float = 0.0) -> ReplayResult:
    """Replay ``scheduler`` on ``traces`` for ``budget_s`` seconds of slots of ``slot_s`` seconds.

    ``stop_at``: also stop once the objective is <= this value and at least ``stop_after_s`` elapsed.
    """
    rows = _tasks_of(traces)
    tasks, times, trials, bests = [], [], [], []
    for k, r in enumerate(rows):
        default = float(r["default_s"])
        t = _ReplayTask(int(r.get("index", k)), r.get("name", f"task{k}"), r.get("key", str(k)),
                        int(r.get("weight", 1)), float(r.get("flops", 0.0)), default)
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
    elapsed, rnd = 0.0, 0
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
    return ReplayResult(curve, choices, statistics.fmean(dts) if dts else 0.0, max(dts, default=0.0),
                        curve[-1][1], skipped)


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
    return math.fsum(float(r["trace"][-1][0]) for r in _tasks_of(traces))


def default_slot(traces) -> float:
    """The median spacing of recorded trace points (one recorded step per slot)."""
    steps = [float(r["trace"][-1][0]) / (len(r["trace"]) - 1) for r in _tasks_of(traces) if len(r["trace"]) > 1]
    return statistics.median(steps) if steps else 1.0


def ttq_ratio(a: float, b: float, cap: float):
    """TTQ ratio a / b; a TTQ never reached counts as ``cap`` (the run's horizon), None if undefined."""
    a, b = min(a, cap), min(b, cap)
    return None if b == 0 else a / b


def _median(xs):
    xs = [x for x in xs if x is not None]
    return statistics.median(xs) if xs else None


def _json_num(x):
    return None if x is None or (isinstance(x, float) and not math.isfinite(x)) else x


def run_replay_benchmark(models=None, budgets=(0.25, 0.5, 1.0), slot_s: float | None = None,
                         schedulers=BENCH_SCHEDULERS, horizon: float = 3.0, seed: int = 0,
                         params: dict | None = None, rtol: float = 0.0) -> dict:
    """TTQ of every scheduler to the gradient scheduler's final quality, per model and budget fraction.

    ``models``: names, paths or already-loaded trace documents (default: every recorded trace).
    ``slot_s``: slot length (default: per model, the median spacing of its trace points).
    ``params``: optional ``{scheduler: {param: value}}``. ``rtol``: the quality target is
    ``Q x (1 + rtol)`` (0: exactly gradient's final objective, down to its last micro-gain).
    Returns a JSON-able dict.
    """
    if models is None:
        models = available_traces()
        if not models:
            raise DynatuneError("no recorded traces in " + TRACE_DIR, "record some with bench/record_traces.py")
    params = params or {}
    schedulers = list(dict.fromkeys(["gradient", "dynatune", "round_robin", *schedulers]))
    out_models = []
    for m in models:
        doc = m if isinstance(m, dict) else load_traces(m)
        slot = slot_s or default_slot(doc)
        total = total_trace_seconds(doc)
        rows = []
        for frac in budgets:
            budget = frac * total
            ref = replay(doc, make_scheduler("gradient", seed, **params.get("gradient", {})), budget, slot)
            target = ref.final * (1.0 + rtol)
            ttq, final, dec = {}, {}, {}
            for name in schedulers:
                sch = make_scheduler(name, seed, **params.get(name, {}))
                res = replay(doc, sch, horizon * budget, slot, stop_at=target, stop_after_s=budget)
                ttq[name] = time_to_quality(res.curve, target)
                final[name] = objective_at(res.curve, budget)
                dec[name] = res.decision_s_per_round
            rows.append({
                "fraction": frac, "budget_s": budget, "target_s": target,
                "ttq_s": {k: _json_num(v) for k, v in ttq.items()},
                "objective_at_budget_s": final, "decision_s_per_round": dec,
                "censored": [k for k, v in ttq.items() if math.isinf(v)],  # never reached: TTQ counted as horizon
                "ttq_vs_gradient": ttq_ratio(ttq["gradient"], ttq["dynatune"], horizon * budget),
                "ttq_vs_round_robin": ttq_ratio(ttq["round_robin"], ttq["dynatune"], horizon * budget),
            })
        out_models.append({"model": doc.get("model", "?"), "n_tasks": len(doc["tasks"]), "total_s": total,
                           "slot_s": slot, "untuned_s": ref.curve[0][1], "skipped_tasks": ref.skipped,
                           "budgets": rows})
    per_budget = {}
    for j, frac in enumerate(budgets):
        per_budget[str(frac)] = {
            "ttq_vs_gradient": _median(m["budgets"][j]["ttq_vs_gradient"] for m in out_models),
            "ttq_vs_round_robin": _median(m["budgets"][j]["ttq_vs_round_robin"] for m in out_models),
        }
    full = str(max(budgets))
    return {"schedulers": schedulers, "budgets": list(budgets), "horizon": horizon, "seed": seed, "rtol": rtol,
            "models": out_models, "per_budget": per_budget,
            "ttq_vs_gradient": per_budget[full]["ttq_vs_gradient"],
            "ttq_vs_round_robin": per_budget[full]["ttq_vs_round_robin"]}
