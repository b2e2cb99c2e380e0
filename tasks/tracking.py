"""MLflow tracking for a tuning run, as a run callback (:class:`MlflowCallback`): what is logged when.

Metric names and steps are the same for every run (step = round), so runs line up in the MLflow UI's
comparison view: each round's metrics, the periodic measurements at their round's step, and at the end the
summary, the report, the tuning database and the tuned model (an MLflow model). The MLflow run itself (named
after what ran, resumed with its work dir, a new one for a copied work dir) is
:class:`~dynatune.tasks.run_writer.Tracker`'s.

Why tuning ended (:mod:`dynatune.run.stopping`): the tags ``stop_reason`` and ``stopped_early``, set as
tuning ends, and the metrics ``stopped_early``, ``tuning_s_used`` and ``tuning_s_saved`` at the last step;
every round logs the rule's ``stop_gain_ms`` (the most a task could still gain over the rest) beside its
``stop_threshold_ms``.
"""

from __future__ import annotations

from dynatune.files import WorkDir
from dynatune.run.callbacks import RunCallback
from dynatune.run.summary import RunSummary
from dynatune.secrets import mask
from dynatune.tasks.run_writer import Tracker, work_dir_identity
from dynatune.tasks.tuned_model import MODEL_NAME


class MlflowCallback(RunCallback):
    """Tracks a run in MLflow: one MLflow run per pipeline execution (resumed with the work dir), per-round
    metrics at step = round, the periodic measurements at their round's step, the summary and artifacts."""

    def __init__(self):
        self.tracker: Tracker | None = None
        self.steps = 0

    def on_start(self, run) -> None:
        run_id, here = run.state.get("mlflow_run_id"), work_dir_identity(run.cfg.work_dir)
        started_in = run.state.get("mlflow_work_dir", here)  # older work dirs did not keep it
        continues = None
        if run_id and started_in != here:  # copied or moved: a new run, linked to the old one
            continues, run_id = {"run_id": run_id, "work_dir": started_in}, None
        t = self.tracker = Tracker(run.cfg, run.model, run_id, run.config_hash, continues)
        run.state["mlflow_run_id"], run.state["mlflow_work_dir"] = t.run_id, here
        t.log_artifact(WorkDir(run.cfg.work_dir).tasks)  # task names for `dynatune report`, while it runs
        if not (t.resumed and t.has_metric("untuned_estimate_ms")):  # step 0 is logged once per run
            # only as its own metric: estimated_latency_ms at step r is the estimate after round r, one
            # value per step, so the MLflow UI's curves have no double point at step 0
            t.log_metrics({"untuned_estimate_ms": run.untuned_estimate_s * 1e3}, step=0)

    def on_retired(self, event) -> None:
        self.tracker.set_tags({f"retired.task{event.task}": f"{event.task_name}: {event.note}"})

    def on_round(self, record) -> None:
        self.tracker.log_round(record)
        self.steps = record.round + 1

    def on_tuning_end(self, event) -> None:  # before the compile: the run says why while it compiles
        self.tracker.set_tags(
            {"stop_reason": event.reason, "stopped_early": str(event.stopped_early).lower()}
        )

    def on_measurement(self, m) -> None:
        self.tracker.log_metrics(
            {
                "measured_latency_ms": m.latency_ms,
                "measured_ratio_vs_onnxruntime": m.ratio,
                "measured_onnxruntime_ms": m.onnxruntime_ms,
                "measured_load_cores": m.load_cores,
                "measured_under_load": float(m.under_load),
                "residual_ms": m.residual_ms,
            },
            step=m.round,
        )

    def on_finish(self, summary: RunSummary, report_dir: str) -> None:
        t = self.tracker
        metrics = {k: getattr(summary, k) for k in FINAL_METRICS}
        metrics["numerics_ok"] = 1.0 if summary.numerics_ok else 0.0
        metrics["stopped_early"] = 1.0 if summary.stopped_early else 0.0
        # the final measurement continues the periodic ones' curves, at the last step, whatever the budget
        metrics |= {
            "measured_latency_ms": summary.latency_ms,
            "measured_ratio_vs_onnxruntime": summary.ratio_vs_onnxruntime,
            "measured_onnxruntime_ms": summary.onnxruntime_latency_ms,
            "measured_load_cores": summary.timing_load_cores,
        }
        t.log_metrics(metrics, step=summary.rounds)
        t.set_tags({"never_tuned_tasks": len(summary.never_tuned_tasks)})
        if summary.timing_under_load:  # the ratio is not a fair one: say so, with the load figure
            t.set_tags({"timing_under_load": f"{summary.timing_load_cores or 0.0:.2f} cores busy"})
        if summary.timing_onnxruntime_slow:  # ... nor in a slow spell: with ONNX Runtime's time alone
            alone = summary.onnxruntime_reference_ms or 0.0
            t.set_tags({"timing_onnxruntime_slow": f"ONNX Runtime over its {alone:.3f} ms alone"})
        if (summary.profile or {}).get("slow_spell"):  # the profile's split is not the quiet machine's
            fastest = summary.profile.get("fastest_model_ms") or 0.0
            t.set_tags({"profile_slow_spell": f"the model over its {fastest:.3f} ms in the final timing"})
        if summary.library:
            lib = summary.library
            t.set_tags(
                {
                    "library.matched_tasks": lib["matched_tasks"],
                    "library.seeded_records": lib["seeded_records"],
                    "library.written_records": lib["written_records"],
                    "library.url": lib["url"],
                    "library.transferred_tasks": lib["transferred_tasks"],
                }
            )
        summary.mlflow_run_id = t.run_id
        summary.mlflow_tracking_uri = mask(t.uri)
        summary.mlflow_ui = t.ui_hint()
        if summary.artifact:  # the tuned model, as an MLflow model users load, serve and register
            info = t.log_tuned_model(summary.artifact)
            summary.tuned_model_uri, summary.tuned_model_id = f"runs:/{t.run_id}/{MODEL_NAME}", info.model_id
        t.log_dict(summary.to_dict(), "summary.json")
        t.log_artifact(report_dir, "report")
        wd = WorkDir(summary.work_dir)
        t.log_artifact(wd.db, "tuning_db")
        t.log_artifact(wd.tasks)
        summary.tracking_s = round(t.log_seconds, 3)
        t.finish("FINISHED" if summary.numerics_ok is not False else "FAILED")

    def on_failure(self, exc) -> None:
        if self.tracker is not None:
            self.tracker.finish("FAILED")


FINAL_METRICS = (
    "latency_ms",
    "untuned_latency_ms",
    "onnxruntime_latency_ms",
    "onnxruntime_reference_ms",
    "max_rel_err",
    "max_abs_err",
    "speedup_vs_untuned",
    "speedup_vs_onnxruntime",
    "estimated_latency_ms",
    "wall_s",
    "ratio_vs_onnxruntime",
    "ratio_vs_onnxruntime_min",
    "ratio_vs_onnxruntime_max",
    "time_to_onnxruntime_parity_s",
    "estimated_model_latency_ms",
    "residual_ms",
    "tuning_s_used",
    "tuning_s_saved",
)
