"""What a tuning run tells the outside world: typed events, delivered to :class:`RunCallback` objects.

The pipeline (:mod:`dynatune.run.pipeline`) calls every callback it was given, in order, for each event; a
callback overrides only the methods it cares about. MLflow tracking (``tasks/tracking.py``) and the
terminal's live view (:mod:`dynatune.run.progress`) are callbacks, so the library itself knows neither.

A callback that raises in :meth:`RunCallback.on_start` stops the run before tuning (e.g. an unreachable
tracking server); an exception in any later event is the callback's own problem: it is logged (a warning
naming the callback, the event and the round) and the run goes on, so a flaky observer cannot lose tuning
work.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

from dynatune.compiler.periodic import ModelMeasurement
from dynatune.run.summary import RunSummary

log = logging.getLogger(__name__)


@dataclass
class RunStart:
    """The run is set up: model imported, tasks extracted, session open, untuned latencies known."""

    cfg: object  # dynatune.run.config_schema.Config
    model: object  # dynatune.model.importer.Model
    tasks: list  # dynatune.model.extract.Task
    state: dict  # the run's persisted state (run.json): a callback may keep its ids here to resume
    untuned_estimate_s: float
    rounds_done: int
    elapsed_s: float
    cache_hit: bool = False
    warm_start: dict | None = None  # what the warm start imported, when there was one
    config_hash: str = ""  # :meth:`dynatune.run.config_schema.Config.config_hash`, computed once per run
    library: dict | None = (
        None  # the schedule library's part (matched tasks, seeded records), when it is used
    )


@dataclass
class TaskRetired:
    task: int
    task_name: str
    note: str


@dataclass
class TuningEnded:
    """Tuning is over (the budget spent, or stopped before it: :mod:`dynatune.run.stopping`)."""

    stopped_early: bool
    reason: str  # one sentence, with its figures
    elapsed_s: float  # tuning seconds used
    budget_s: float
    saved_s: float  # the budget's seconds not used (0 when it was spent)
    round: int  # the last round's number (its MLflow step); -1 before the first


class RunCallback:
    """Base class: every event is a no-op."""

    def on_stage(self, name: str, detail: str = "") -> None:
        """A stage of the run starts: "import", "extraction", "untuned latencies", "coverage pass",
        "tuning", "measurement", "winograd choice" (with ``compile.winograd``), "compile", "verify", "timing",
        "untuned model", "profile", "report"."""

    def on_start(self, run: RunStart) -> None:
        """Before the first round (also when a run resumes)."""

    def on_retired(self, event: TaskRetired) -> None:
        """A task stops being tuned (its default does not build or run, or its search failed)."""

    def on_round(self, record) -> None:
        """A round finished: ``record`` is a :class:`dynatune.run.tuner.RoundRecord`."""

    def on_round_failed(self, error: str) -> None:
        """A round raised (after its retries); the run goes on."""

    def on_measurement(self, m: ModelMeasurement) -> None:
        """The periodic whole-model measurement."""

    def on_tuning_end(self, event: TuningEnded) -> None:
        """Tuning is over, before the compile: why (the budget spent, or the beliefs' stop)."""

    def on_finish(self, summary: RunSummary, report_dir: str) -> None:
        """The run ended: compiled, verified, report written. A callback may set fields of ``summary`` (the
        MLflow callback sets its run id): the run writes ``summary.json`` after the callbacks."""

    def on_failure(self, exc: BaseException) -> None:
        """The run failed (after ``on_start``)."""


class CallbackList(RunCallback):
    """Fans each event out to several callbacks."""

    def __init__(self, callbacks=()):
        self.callbacks = [c for c in callbacks if c is not None]
        self.round: int | None = None  # the last round an event reported (None: before the first)

    def on_start(self, run):
        for c in self.callbacks:
            c.on_start(run)  # a failing observer must stop the run before tuning, not after

    def _each(self, method: str, *args) -> None:
        for c in self.callbacks:
            try:
                getattr(c, method)(*args)
            except Exception as e:
                where = "before the first round" if self.round is None else f"at round {self.round}"
                name = type(c).__name__
                log.warning(
                    "callback %s failed in %s %s (the run goes on): %s: %s",
                    name,
                    method,
                    where,
                    type(e).__name__,
                    e,
                )
                log.debug("callback %s: traceback", name, exc_info=True)

    def on_stage(self, name, detail=""):
        self._each("on_stage", name, detail)

    def on_retired(self, event):
        self._each("on_retired", event)

    def on_round(self, record):
        self.round = record.round
        self._each("on_round", record)

    def on_round_failed(self, error):
        self._each("on_round_failed", error)

    def on_measurement(self, m):
        self.round = m.round
        self._each("on_measurement", m)

    def on_tuning_end(self, event):
        self._each("on_tuning_end", event)

    def on_finish(self, summary, report_dir):
        for c in self.callbacks:
            c.on_finish(summary, report_dir)

    def on_failure(self, exc):
        self._each("on_failure", exc)
