"""The MLflow side of one tuning run (:class:`Tracker`): one MLflow run per pipeline execution, per-round
metrics in batches.

Metric names and steps are the same for every run (step = round), so runs line up in the MLflow UI's
comparison view. With no tracking URI set, MLflow writes a SQLite store in the work directory.

A run is named after what ran: the model, the date and time, the scheduler (``tracking.run_name`` names it
otherwise). A work dir resumes its MLflow run, unless it was copied or moved (``cp -a``): then it goes on
in a new MLflow run, tagged ``dynatune.continues_run`` with the old run's id and
``dynatune.continues_work_dir`` with the old work dir, so the old run and its artifacts are never written
again. With the work dir's own store (``<work_dir>/mlflow.db``, copied along), the copy's experiment is
pointed at the copy's own ``mlartifacts/`` first: the new run's artifacts stay in the copy.

What is logged when is the run callback's (:mod:`dynatune.tasks.tracking`); what report and compare read
back, :mod:`dynatune.tasks.run_reader`.
"""

from __future__ import annotations

import datetime
import json
import math
import os
import sqlite3
import time

from dynatune import __version__
from dynatune.files import WorkDir
from dynatune.secrets import mask, mask_all
from dynatune.tasks.mlflow_store import point_mlflow_at, seed_sqlite_store
from dynatune.tasks.reachability import check_tracking_uri
from dynatune.tasks.tuned_model import log_tuned_model

# the metrics every round logs, at step = round (what report and compare read back)
ROUND_METRICS = (
    "estimated_latency_ms",
    "task",
    "belief_mean_ms",
    "belief_std_ms",
    "ucb_score",
    "trials",
    "build_errors",
    "run_errors",
    "measurements_saved",
    "round_wall_s",
    "elapsed_s",
    "decision_ms",
    "chosen_best_ms",
)


def default_run_name(model: str, scheduler: str, trigger: str | None = None, now=None) -> str:
    """What ran: ``squeezenet 2026-01-02 13:45 dynatune`` (``... retune`` for a nightly retune)."""
    when = (now or datetime.datetime.now()).strftime("%Y-%m-%d %H:%M")
    return " ".join(x for x in (model, when, scheduler, trigger or "") if x)


def work_dir_identity(work_dir: str) -> str:
    """Where a work dir is: a copy or a move changes it (the run state keeps the one its MLflow run
    started in)."""
    return os.path.realpath(work_dir)


def follow_copied_store(uri: str, work_dir: str, experiment) -> None:
    """A work dir's own SQLite store that was copied (or moved) with it still sends its experiment's
    artifacts to the old work dir: point the experiment at this work dir's ``mlartifacts/``. Stores
    elsewhere are shared and left alone."""
    own = "sqlite:///" + WorkDir(work_dir).mlflow_db
    wanted = "file://" + WorkDir(work_dir).mlartifacts
    if uri != own or experiment is None or experiment.artifact_location == wanted:
        return
    if not str(experiment.artifact_location).startswith("file://"):
        return
    with sqlite3.connect(WorkDir(work_dir).mlflow_db) as db:
        db.execute(
            "UPDATE experiments SET artifact_location = ? WHERE experiment_id = ?",
            (wanted, int(experiment.experiment_id)),
        )


class Tracker:
    """The MLflow side of one tuning run (created or resumed by run id)."""

    def __init__(
        self,
        cfg,
        model,
        run_id: str | None = None,
        config_hash: str | None = None,
        continues: dict | None = None,
    ):
        """``continues``: the run this one goes on from, in a copied or moved work dir (``{"run_id": ...,
        "work_dir": ...}``): tagged on the new run."""
        from mlflow import MlflowClient

        # MLflow prints each finished run's URL, credentials included: dynatune prints its own, masked
        os.environ["MLFLOW_SUPPRESS_PRINTING_URL_TO_STDOUT"] = "true"
        self.log_seconds = 0.0  # time spent talking to MLflow (reported against tuning time)
        self.uri = cfg.tracking.uri
        check_tracking_uri(self.uri)
        seed_sqlite_store(self.uri)  # a new work dir's store without MLflow's migrations
        point_mlflow_at(self.uri)
        self.client = MlflowClient(self.uri)
        exp = self.client.get_experiment_by_name(cfg.tracking.experiment)
        follow_copied_store(self.uri, cfg.work_dir, exp)
        if exp is None:
            loc = None
            if self.uri.startswith("sqlite:///"):
                loc = "file://" + WorkDir(cfg.work_dir).mlartifacts
            exp_id = self.client.create_experiment(cfg.tracking.experiment, artifact_location=loc)
        else:
            exp_id = exp.experiment_id
        self.experiment_id = exp_id
        self.resumed = False
        self._steps: dict[str, set[int]] = {}  # metric -> the steps the run holds (see _unlogged)
        if run_id:
            try:
                run = self.client.get_run(run_id)
                if run.info.lifecycle_stage == "active":
                    self.run_id = run_id
                    self.resumed = True
                    self.client.update_run(run_id, status="RUNNING")
            except Exception:
                run_id = None
        if not self.resumed:
            tags = {
                "model": model.name,
                "model_sha256": model.sha256,
                "model_version": cfg.model.version or "",
                "target": json.dumps(cfg.target) if isinstance(cfg.target, dict) else str(cfg.target),
                "scheduler": cfg.scheduler.name,
                "dynatune_version": __version__,
                "config_hash": (config_hash or cfg.config_hash())[:16],
                **mask_all(cfg.tracking.tags),  # a tag may hold a URL: recorded masked
            }
            if continues:
                tags["dynatune.continues_run"] = continues["run_id"]
                tags["dynatune.continues_work_dir"] = continues["work_dir"]
            name = cfg.tracking.run_name or default_run_name(
                model.name, cfg.scheduler.name, cfg.tracking.tags.get("trigger")
            )
            run = self.client.create_run(exp_id, run_name=mask(name), tags=tags)
            self.run_id = run.info.run_id
            self._log_params(cfg)
            self.log_dict(cfg.to_record(), "config.json")

    def _timed(f):  # noqa: N805
        def wrapper(self, *a, **k):
            t0 = time.perf_counter()
            try:
                return f(self, *a, **k)
            finally:
                self.log_seconds += time.perf_counter() - t0

        return wrapper

    def _log_params(self, cfg) -> None:
        from mlflow.entities import Param

        flat = _flatten(cfg.to_record())
        params = [Param(k, str(v)[:5000]) for k, v in sorted(flat.items())]
        for i in range(0, len(params), 100):
            self.client.log_batch(self.run_id, params=params[i : i + 100])

    @_timed
    def log_round(self, rec) -> None:
        from mlflow.entities import Metric

        b = rec.belief or {}
        r = rec.result
        values = {
            "estimated_latency_ms": rec.estimated_latency_s * 1e3,
            "task": rec.task,
            "belief_mean_ms": b.get("gain_mean_s", 0.0) * 1e3,
            "belief_std_ms": b.get("gain_std_s", 0.0) * 1e3,
            "ucb_score": b.get("score", 0.0) * 1e3,
            "trials": r["trials"],
            "build_errors": r["build_errors"],
            "run_errors": r["run_errors"],
            "measurements_saved": r.get("repeats_saved", 0),
            "round_wall_s": rec.wall_s,
            "elapsed_s": rec.elapsed_s,
            "decision_ms": rec.decision_s * 1e3,
            "chosen_best_ms": r["best_after_s"] * 1e3 if math.isfinite(r["best_after_s"]) else 0.0,
        }
        if rec.estimated_model_latency_s is not None:
            values["estimated_model_latency_ms"] = rec.estimated_model_latency_s * 1e3
        check = rec.stop_check or {}
        if check.get("eligible"):  # the stopping rule's figures: where they cross, the run stops
            values["stop_gain_ms"] = check["gain_s"] * 1e3
            values["stop_threshold_ms"] = check["threshold_s"] * 1e3
        ts = int(time.time() * 1000)
        metrics = self._unlogged(
            [Metric(k, float(v), ts, rec.round) for k, v in values.items() if math.isfinite(float(v))]
        )
        if metrics:
            self.client.log_batch(self.run_id, metrics=metrics)
        self.log_table(_columns(rec.beliefs), f"beliefs/round_{rec.round:04d}.json")
        if r.get("exhausted") and r.get("note"):  # the task was retired this round: say why, on the run
            self.client.set_tag(
                self.run_id, f"retired.task{rec.task}", f"{rec.task_name}: {r['note']}"[:5000]
            )

    @_timed
    def log_metrics(self, values: dict, step: int | None = None) -> None:
        from mlflow.entities import Metric

        ts = int(time.time() * 1000)
        ms = self._unlogged(
            [
                Metric(k, float(v), ts, step or 0)
                for k, v in values.items()
                if v is not None and isinstance(v, (int, float)) and math.isfinite(float(v))
            ]
        )
        if ms:
            self.client.log_batch(self.run_id, metrics=ms)

    def _unlogged(self, metrics: list) -> list:
        """The metrics whose step the run does not hold yet: MLflow never gets a step twice (a resumed run
        whose work dir lost rounds, a finished run compiled again). A resumed run's steps are read once
        per metric."""
        fresh = []
        for m in metrics:
            if m.key not in self._steps:
                history = self.client.get_metric_history(self.run_id, m.key) if self.resumed else []
                self._steps[m.key] = {h.step for h in history}
            if m.step not in self._steps[m.key]:
                self._steps[m.key].add(m.step)
                fresh.append(m)
        return fresh

    @_timed
    def log_table(self, data: dict, artifact_file: str) -> None:
        import mlflow

        mlflow.log_table(data=data, artifact_file=artifact_file, run_id=self.run_id)

    @_timed
    def log_dict(self, obj, artifact_file: str) -> None:
        self.client.log_dict(self.run_id, obj, artifact_file)

    @_timed
    def log_artifact(self, path: str, artifact_path: str | None = None) -> None:
        if os.path.isdir(path):
            self.client.log_artifacts(self.run_id, path, artifact_path)
        elif os.path.exists(path):
            self.client.log_artifact(self.run_id, path, artifact_path)

    @_timed
    def log_tuned_model(self, library: str):
        """The compiled ``library`` as this run's MLflow model
        (:func:`dynatune.tasks.tuned_model.log_tuned_model`)."""
        return log_tuned_model(library, self.run_id, self.uri)

    @_timed
    def set_tags(self, tags: dict) -> None:
        for k, v in tags.items():
            self.client.set_tag(self.run_id, k, mask(str(v))[:5000])

    def has_metric(self, key: str) -> bool:
        """Whether the run already has a value of metric ``key`` (a resumed run logs step 0 only once)."""
        return bool(self.client.get_metric_history(self.run_id, key))

    def finish(self, status: str = "FINISHED") -> None:
        self.client.set_terminated(self.run_id, status=status)

    def ui_hint(self) -> str:
        base = mask(self.uri)
        if base.startswith("sqlite:///"):
            return (
                f"mlflow ui --backend-store-uri {base}  # then open http://127.0.0.1:5000/#/experiments/"
                f"{self.experiment_id}/runs/{self.run_id}"
            )
        return f"{base.rstrip('/')}/#/experiments/{self.experiment_id}/runs/{self.run_id}"


def _flatten(d: dict, prefix: str = "") -> dict:
    out = {}
    for k, v in d.items():
        key = f"{prefix}{k}"
        if isinstance(v, dict) and v:
            out.update(_flatten(v, key + "."))
        else:
            out[key] = json.dumps(v) if isinstance(v, (list, dict)) else v
    return out


def _columns(rows: list[dict]) -> dict:
    """Row dicts -> column dict (what mlflow.log_table takes); infinities become None."""
    if not rows:
        return {"task": []}
    cols = {k: [] for k in rows[0]}
    for r in rows:
        for k in cols:
            v = r.get(k)
            if isinstance(v, float) and not math.isfinite(v):
                v = None
            cols[k].append(v)
    return cols
