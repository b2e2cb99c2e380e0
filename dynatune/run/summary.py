"""The record of one tuning run, typed: what ``<work_dir>/report/summary.json`` holds.

The pipeline (:func:`dynatune.run.pipeline.run`) builds a :class:`RunSummary`, lets the callbacks add to it
(the MLflow callback adds its run id) and writes it once, at the end of the run. The report, the CLI, the
MLflow glue and the benches read it by attribute.

``summary.json`` keeps the keys of the dict this type replaced (a key is a field's name), so the summary of
an older work dir still loads: every field has a default (an older run may lack a key), and a key this
version does not know is kept as an extra field (``model_extra``) and written back as it was.
"""

from __future__ import annotations

import json
from typing import Any, ClassVar

from pydantic import BaseModel, ConfigDict, Field, field_validator

from dynatune.files import atomic_write_json
from dynatune.secrets import mask_all

__all__ = ["RunSummary"]


class RunSummary(BaseModel):
    """One run: what was tuned, how long, what it reached, how the compiled model measured."""

    model_config = ConfigDict(extra="allow", protected_namespaces=(), coerce_numbers_to_str=True)

    # -- what was tuned -----------------------------------------------------------------------------
    model: str | None = Field(None, description="the model's name (the config's, else the ONNX file's stem)")
    model_sha256: str | None = Field(None, description="SHA-256 of the ONNX model")
    model_version: str | None = Field(None, description="the config's model.version (None when not given)")
    scheduler: str | None = Field(None, description="the scheduler that chose the tasks")
    tasks: int | None = Field(None, description="how many tuning tasks the model has")
    # -- the tuning ---------------------------------------------------------------------------------
    rounds: int | None = Field(None, description="rounds done in the work dir (a resumed run's included)")
    trials: int | None = Field(None, description="candidates measured over all rounds")
    budget_s: float | None = Field(None, description="the tuning budget (s)")
    elapsed_s: float | None = Field(None, description="tuning seconds spent (the budget's clock)")
    wall_s: float | None = Field(
        None, description="wall seconds of this process's run: set-up, tuning, compile, report"
    )
    estimated_latency_ms: float | None = Field(
        None, description="Σ weight × best latency of each task, timed alone (ms)"
    )
    initial_estimated_latency_ms: float | None = Field(
        None, description="the same estimate with every task's untuned latency (ms)"
    )
    estimate_excludes: list[str] = Field(
        default_factory=list, description="tasks with no latency, left out of the estimates"
    )
    warmup_rounds: int | None = Field(None, description="rounds of the coverage pass (first batches)")
    never_tuned_tasks: list[str] = Field(
        default_factory=list,
        description="tasks that never got a batch and have no schedule from an earlier run (they run their "
        "untuned schedules)",
    )
    # -- why tuning ended (dynatune.run.stopping) ------------------------------------------------------
    stopped_early: bool | None = Field(
        None, description="tuning ended before the budget: the beliefs' stop, or every task retired"
    )
    stop_reason: str | None = Field(None, description="why tuning ended, one sentence with its figures")
    tuning_s_used: float | None = Field(None, description="tuning seconds used (the budget's clock)")
    tuning_s_saved: float | None = Field(
        None, description="the budget's seconds a stop left unused (0 when the budget was spent)"
    )
    stop_check: dict | None = Field(
        None,
        description="the stopping rule's last check (dynatune.run.stopping.StopCheck: the best task's gain "
        "over the rest, the threshold, the streak); None with stopping off",
    )
    confirmed: dict | None = Field(
        None,
        description="tasks started from records measured elsewhere (library, warm start), their best "
        "measured again here: how many, measured / recorded (median, worst); written only when some were",
    )
    # -- the compiled model (None when the run did not compile and verify) --------------------------
    latency_ms: float | None = Field(None, description="the compiled model's measured latency (ms)")
    untuned_latency_ms: float | None = Field(None, description="the untuned TVM model's latency (ms)")
    onnxruntime_latency_ms: float | None = Field(None, description="ONNX Runtime's latency (ms)")
    max_rel_err: float | None = Field(None, description="largest relative error vs ONNX Runtime's outputs")
    max_rel_err_per_input: list[float] | None = Field(
        None, description="the relative error on each verification input (written only when verified)"
    )
    max_abs_err: float | None = Field(None, description="largest absolute error vs ONNX Runtime's outputs")
    numerics_ok: bool | None = Field(None, description="max_rel_err within compile.rel_tol")
    artifact: str | None = Field(None, description="path of the compiled shared library")
    artifact_metadata: str | None = Field(
        None,
        description="path of its metadata (target, CPU features, inputs and outputs, threads, the timing): "
        "what dynatune.runtime.load reads",
    )
    threads: int | None = Field(
        None, description="the threads the model was timed with, TVM's and ONNX Runtime's alike"
    )
    work_dir: str | None = Field(None, description="the run's work directory")
    ratio_vs_onnxruntime: float | None = Field(
        None,
        description="TVM / ONNX Runtime latency, timed side by side in fresh processes: each side's fastest "
        "block against the other's, among all the processes' rounds (dynatune.compiler.timing.best_ratio)",
    )
    ratio_vs_onnxruntime_min: float | None = Field(None, description="the smallest round's ratio")
    ratio_vs_onnxruntime_max: float | None = Field(None, description="the largest round's ratio")
    ratio_vs_onnxruntime_per_process: list[float] | None = Field(
        None, description="each timing process's ratio (compile.timing_processes of them)"
    )
    timing_under_load: bool | None = Field(
        None,
        description="the machine stayed busy through the side-by-side timing's retries: the ratio was taken "
        "under load (no parity is claimed from it)",
    )
    timing_load_cores: float | None = Field(
        None, description="the cores other work and steal time took from that timing (dynatune.machine.load)"
    )
    timing_attempts: int | None = Field(None, description="side-by-side timings tried to get a quiet one")
    timing_onnxruntime_slow: bool | None = Field(
        None,
        description="ONNX Runtime's fastest block in that timing stayed over compile.timing_slow_onnxruntime "
        "times its reference in every process: a slow spell of a shared machine, which flatters dynatune "
        "(no parity is claimed from it)",
    )
    onnxruntime_reference_ms: float | None = Field(
        None,
        description="ONNX Runtime's fastest block alone, in fresh processes before tuning: the final "
        "timing's reference (dynatune.compiler.fresh_timing.onnxruntime_reference_ms)",
    )
    # -- periodic whole-model measurements ----------------------------------------------------------
    measurements: list[dict] = Field(
        default_factory=list,
        description="the periodic measurements (the fields of dynatune.compiler.periodic.ModelMeasurement)",
    )
    time_to_onnxruntime_parity_s: float | None = Field(
        None, description="the first tuning second the measured model beat ONNX Runtime (None: never)"
    )
    periodic_measure_s: float | None = Field(
        None, description="seconds the periodic measurements cost (not counted as tuning)"
    )
    dynatune_version: str | None = Field(None, description="dynatune's version that wrote the summary")
    retired_tasks: dict[str, str] = Field(
        default_factory=dict, description="task name -> why it stopped being tuned"
    )
    speedup_vs_untuned: float | None = Field(
        None, description="untuned TVM latency / tuned latency (written only when both were measured)"
    )
    speedup_vs_onnxruntime: float | None = Field(
        None, description="ONNX Runtime latency / tuned latency (written only when both were measured)"
    )
    # -- the schedule library, the profile, the residual ----------------------------------------------
    library: dict | None = Field(
        None, description="the schedule library's part (dynatune.library.link.RunLibrary.report()), if used"
    )
    start_estimated_latency_ms: float | None = Field(
        None,
        description="the estimate when this process started tuning (below the untuned one after a library "
        "seed or a warm start) (ms)",
    )
    profile: dict | None = Field(
        None,
        description="the final profile's headline figures (report/profile.json; written only when profiled)",
    )
    residual_ms: float | None = Field(None, description="what the kernels alone miss: model - Σ tasks (ms)")
    residual_source: str | None = Field(
        None, description='where residual_ms comes from: "final profile" or "periodic measurement"'
    )
    estimated_model_latency_ms: float | None = Field(
        None, description="estimated_latency_ms + residual_ms (ms)"
    )
    # -- MLflow (written only when the MLflow callback tracked the run) --------------------------------
    mlflow_run_id: str | None = Field(None, description="the MLflow run that tracked this run")
    mlflow_tracking_uri: str | None = Field(None, description="its tracking store (credentials masked)")
    mlflow_ui: str | None = Field(None, description="how to open the run in the MLflow UI")
    tracking_s: float | None = Field(None, description="seconds spent talking to MLflow")
    tuned_model_uri: str | None = Field(
        None, description="the tuned model as an MLflow pyfunc model: runs:/<run id>/tuned_model"
    )
    tuned_model_id: str | None = Field(None, description="its MLflow logged model id (models:/<id>)")

    # fields that summary.json holds only when they are known (as the dict it replaced did)
    ONLY_WHEN_SET: ClassVar[tuple[str, ...]] = (
        "confirmed",
        "max_rel_err_per_input",
        "timing_under_load",
        "timing_load_cores",
        "timing_attempts",
        "timing_onnxruntime_slow",
        "onnxruntime_reference_ms",
        "ratio_vs_onnxruntime_per_process",
        "speedup_vs_untuned",
        "speedup_vs_onnxruntime",
        "profile",
        "mlflow_run_id",
        "mlflow_tracking_uri",
        "mlflow_ui",
        "tracking_s",
        "artifact_metadata",
        "threads",
        "tuned_model_uri",
        "tuned_model_id",
    )

    @field_validator("estimate_excludes", "never_tuned_tasks", "measurements", "retired_tasks", mode="before")
    @classmethod
    def _null_is_empty(cls, v, info):
        """A list or dict written as null reads as empty."""
        return ({} if info.field_name == "retired_tasks" else []) if v is None else v

    @classmethod
    def of(cls, value: RunSummary | dict | None) -> RunSummary:
        """``value`` as a summary: a summary as is, a dict (a ``summary.json``, partial or old) read into one,
        None as an empty one."""
        if isinstance(value, cls):
            return value
        return cls.model_validate(value or {})

    @classmethod
    def load(cls, path: str) -> RunSummary:
        """Read a ``summary.json`` (this version's or an older one)."""
        with open(path) as f:
            return cls.model_validate(json.load(f))

    def to_dict(self) -> dict[str, Any]:
        """The ``summary.json`` form: every field under its name, then the extra keys of an older summary;
        the fields of :attr:`ONLY_WHEN_SET` only when not None. Every URL in it masked (it is recorded)."""
        d = self.model_dump()
        for k in self.ONLY_WHEN_SET:
            if d.get(k) is None:
                d.pop(k, None)
        return mask_all(d)

    def write(self, path: str) -> None:
        """Write ``summary.json`` atomically."""
        atomic_write_json(path, self.to_dict())
