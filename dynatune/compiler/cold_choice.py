"""The final choice among each task's best few kernels, timed as the model runs them (issue #55 item 1).

Tuning ranks candidates by their time alone: the kernel looped on the same buffers, its weights in the
caches. The model runs each kernel once, after others have evicted its weights. Before the final
compile (:func:`choose_cold`), each tuned task's best few records (:data:`FINALISTS`, those within
:data:`WITHIN` of its best time) are built again and timed cold, on the session's builder and runner:
single runs, every argument but the input flushed from the caches before each
(:class:`dynatune.search.measure.ColdProtocol`: in three passes, the batch's order reversed in the
second). The compiled model takes the one fastest cold (the median of its runs); a near tie (within
:data:`TIE`) stays with tuning's choice. Tasks with one finalist are not timed again.
The choice is written to ``report/cold_choice.json``.
"""

from __future__ import annotations

import math
import os
from dataclasses import asdict, dataclass, field

from dynatune.files import atomic_write_json
from dynatune.search.measure import ColdProtocol

REPORT = "cold_choice.json"  # in the run's report dir
FINALISTS = 4  # a task's best records timed cold, at most ...
WITHIN = 1.2  # ... those within this factor of its best time alone
TIE = 0.03  # another finalist replaces tuning's choice only when cold it is this much faster


@dataclass
class Finalists:
    """One task's finalists: their times as tuning measured them and cold (seconds; ``inf``: failed)."""

    task: int
    name: str
    weight: int
    warm_s: list[float]
    cold_s: list[float]
    chosen: int  # index into the finalists; 0 is tuning's choice

    @property
    def gain_s(self) -> float:
        """What the choice saves per model run, cold (weight x the difference)."""
        before, after = self.cold_s[0], self.cold_s[self.chosen]
        return self.weight * (before - after) if math.isfinite(before) and math.isfinite(after) else 0.0


@dataclass
class ColdChoice:
    database: object = field(repr=False)  # the compile's database: each tuned task's chosen record
    finalists: list[Finalists] = field(default_factory=list)
    protocol: ColdProtocol = ColdProtocol()

    @property
    def changed(self) -> list[Finalists]:
        return [f for f in self.finalists if f.chosen]

    @property
    def saved_ms(self) -> float:
        """What the choice saves per model run, cold, over all tasks."""
        return sum(f.gain_s for f in self.finalists) * 1e3

    def summary(self) -> str:
        return (
            f"{len(self.changed)} of {len(self.finalists)} tasks timed cold took another kernel: "
            f"{self.saved_ms:.3f} ms a run less, cold"
        )

    def as_dict(self) -> dict:
        return {
            "finalists_per_task": FINALISTS,
            "within": WITHIN,
            "cold_protocol": asdict(self.protocol),
            "tie": TIE,
            "saved_ms": self.saved_ms,
            "tasks": [
                asdict(f) | {"warm_s": _finite(f.warm_s), "cold_s": _finite(f.cold_s)} for f in self.finalists
            ],
        }

    def write(self, report_dir: str) -> str:
        os.makedirs(report_dir, exist_ok=True)
        atomic_write_json(path := os.path.join(report_dir, REPORT), self.as_dict())
        return path


def applies(target) -> bool:
    """Cold timing flushes the CPU's caches: CPU targets only."""
    return target.kind.name == "llvm"


def choose_cold(session, database, protocol: ColdProtocol = ColdProtocol()) -> ColdChoice:
    """The compile database with, for each task ``database`` holds (the session's compile database: its
    tuned tasks), the finalist fastest cold. Tasks with one finalist keep their record untimed."""
    from tvm.s_tir import meta_schedule as ms

    from dynatune.search.database import mean_secs
    from dynatune.search.reapply import measure_candidate

    out = ms.database.MemoryDatabase(module_equality="structural")
    cands, owners, groups = [], [], {}
    for t in session.tasks:
        if not database.has_workload(t.mod):
            continue
        out.commit_workload(t.mod)
        top = session.db.memory.get_top_k(session.db.workload(t.key, t.mod), FINALISTS)
        records, schedules = finalists(top)
        if len(records) < 2:
            out.commit_tuning_record(records[0])
            continue
        groups[t.index] = (t, records)
        cands += [measure_candidate(sch) if sch is not None else None for sch in schedules]
        owners += [t] * len(schedules)
    results = session.time_candidates(cands, owners, cold=protocol) if cands else []
    times = iter(protocol.seconds(r) for r in results)
    chosen = []
    for t, records in groups.values():
        cold = [next(times) for _ in records]
        k = pick(cold)
        out.commit_tuning_record(records[k])
        warm = [mean_secs(r.run_secs) for r in records]
        chosen.append(Finalists(t.index, t.name, t.weight, warm, cold, k))
    return ColdChoice(out, chosen, protocol)


def finalists(top: list) -> tuple[list, list]:
    """Of a task's best records ``top`` (fastest first), those within :data:`WITHIN` of the first's time
    whose schedules still apply and differ from the ones before: the records and their schedules. The
    first (the compile's choice) is always kept."""
    from tvm_ffi import structural_hash

    from dynatune.search.database import mean_secs

    limit = WITHIN * mean_secs(top[0].run_secs)
    records, schedules, seen = [], [], set()
    for r in top:
        sch = _schedule(r) if mean_secs(r.run_secs) <= limit else None
        key = structural_hash(sch.mod) if sch is not None else None
        if not records or (sch is not None and key not in seen):
            records.append(r)
            schedules.append(sch)
            seen.add(key)
    return records, schedules


def pick(cold_s: list[float]) -> int:
    """The finalist to compile: the fastest cold, unless tuning's choice (0) is within :data:`TIE` of it."""
    k = min(range(len(cold_s)), key=cold_s.__getitem__)
    if math.isfinite(cold_s[0]) and cold_s[k] >= (1 - TIE) * cold_s[0]:
        return 0
    return k


def _schedule(record):
    """The record's schedule, its trace applied to its workload as the compile applies it (``None``: it no
    longer applies)."""
    from tvm.s_tir import Schedule

    try:
        sch = Schedule(record.workload.mod)
        record.trace.apply_to_schedule(sch, remove_postproc=False)
        return sch
    except Exception:
        return None


def _finite(xs: list[float]) -> list:
    return [x if math.isfinite(x) else None for x in xs]
