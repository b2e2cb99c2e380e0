"""What happens after each measured batch of a task, as MetaSchedule's measure callbacks: each is a small
object the session calls in order, and a session can be given its own list.

- :class:`CountOutcomes`: errors, repeats and why each measurement stopped, into the round's result and
  the task's failure streak;
- :class:`AddToDatabase`: one durable record per candidate (failed ones too, so they are not retried), the
  batch's in one write;
- :class:`LogMeasurements`: per candidate, the repeats used and why the evaluator stopped
  (``db/measurements.jsonl``);
- :class:`UpdateCostModel`: the shared cost model learns from the candidates that ran;
- :class:`RetireFailingTask`: the retirement policy's failure rule (:mod:`dynatune.search.retirement`);
- added by a run that uses the schedule library (:mod:`dynatune.library.link`): ``WriteToLibrary``, the
  batch's records into the library in one transaction, and ``CompareTransferred``, a transferred task's
  first batch, its transferred candidates against the search's own.
"""

from __future__ import annotations

import math
from abc import ABC, abstractmethod
from dataclasses import dataclass, field

from dynatune.search.database import FAILED, mean_secs
from dynatune.search.measure import why_stopped


@dataclass
class Batch:
    """One measured batch of one task."""

    task: object  # dynatune.model.extract.Task
    state: object  # the task's TaskState
    context: object  # its MetaSchedule TuneContext
    candidates: list
    results: list
    incumbent_s: float | None
    result: object  # the slot's RoundResult, accumulated over its batches
    timings: list = field(default_factory=list)  # per candidate: its run seconds, or None if it failed
    records: list = field(
        default_factory=list
    )  # per candidate: its tuning record as plain JSON (AddToDatabase)
    # per candidate: the candidate as built (the layout rewrite applied: dynatune.search.layout_rewrite;
    # None where it was rejected), whose trace is recorded; empty: the candidates were built as they are
    built: list = field(default_factory=list)

    def __post_init__(self):
        self.timings = [list(r.run_secs) if r.run_secs is not None else None for r in self.results]
        self._stops = None

    def as_built(self) -> list:
        """Per candidate, the candidate as built, or as the search gave it where none was built."""
        return [b if b is not None else c for c, b in zip(self.candidates, self.built or self.candidates)]

    def stop_reasons(self, measure) -> list:
        """Per candidate, why the evaluator stopped measuring it (None if it failed); computed once."""
        if self._stops is None:
            self._stops = [
                None if secs is None else why_stopped(measure, [float(x) for x in secs], self.incumbent_s)
                for secs in self.timings
            ]
        return self._stops


class BatchCallback(ABC):
    @abstractmethod
    def apply(self, session, batch: Batch) -> None:
        """Called after every batch, in the session's order."""


class CountOutcomes(BatchCallback):
    def apply(self, session, batch):
        res, st = batch.result, batch.state
        for r, secs, why in zip(batch.results, batch.timings, batch.stop_reasons(session.measure)):
            if secs is None:
                if (r.error_msg or "").startswith("build"):
                    res.build_errors += 1
                else:
                    res.run_errors += 1
                res.errors.append(short_error(r.error_msg))
                st.fail_streak += 1
            else:
                st.fail_streak = 0
                res.repeats += len(secs)
                res.repeats_saved += max(0, session.measure.repeat_cap - len(secs))
                res.stops[why] = res.stops.get(why, 0) + 1
        res.trials += len(batch.candidates)


class AddToDatabase(BatchCallback):
    def apply(self, session, batch):
        from tvm.s_tir import meta_schedule as ms

        t = batch.task
        workload = session.db.workload(t.key, t.mod)
        batch.records = session.db.commit_many(
            t.key,
            [
                ms.database.TuningRecord(
                    c.sch.trace, workload, secs if secs is not None else [FAILED], session.target, c.args_info
                )
                for c, secs in zip(batch.as_built(), batch.timings)
            ],
        )


class LogMeasurements(BatchCallback):
    def apply(self, session, batch):
        measured = [
            {"repeats": len(secs), "stop": why, "mean_s": mean_secs(secs)}
            for secs, why in zip(batch.timings, batch.stop_reasons(session.measure))
            if secs is not None
        ]
        if measured:
            inc = batch.incumbent_s
            session.measurement_log.append(
                {
                    "task": batch.task.key,
                    "incumbent_s": inc if inc is not None and math.isfinite(inc) else None,
                    "candidates": measured,
                }
            )


class UpdateCostModel(BatchCallback):
    def apply(self, session, batch):
        ok = [
            (c, r) for c, r, secs in zip(batch.candidates, batch.results, batch.timings) if secs is not None
        ]
        if ok:
            session.cost_model.update(batch.context, [c for c, _ in ok], [r for _, r in ok])


class RetireFailingTask(BatchCallback):
    def apply(self, session, batch):
        res = batch.result
        note = session.retirement.after_batch(
            batch.state, session.search.trials_per_iter, res.errors[-1] if res.errors else ""
        )
        if note:
            res.note, res.exhausted = note, True


def default_batch_callbacks() -> list[BatchCallback]:
    return [CountOutcomes(), AddToDatabase(), LogMeasurements(), UpdateCostModel(), RetireFailingTask()]


def short_error(msg) -> str:
    """One line for an error message: its first line, and its last when that says more (a runner's
    ``LocalRunner: An exception occurred`` is followed by the worker's traceback, whose last line is the
    cause)."""
    lines = [ln.strip() for ln in str(msg or "").strip().splitlines() if ln.strip()]
    if not lines:
        return "unknown error"
    text = lines[0] if len(lines) == 1 else f"{lines[0].rstrip(':')}: {lines[-1]}"
    return text[:200]
