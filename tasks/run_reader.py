"""What ``dynatune report`` and ``dynatune compare`` read back from a tuning run's MLflow run: its rounds'
metrics, its summary and its task names, from a store that must exist."""

from __future__ import annotations

import json
import os
import tempfile
import urllib.parse

from dynatune.errors import DynatuneError
from dynatune.run.summary import RunSummary
from dynatune.secrets import mask
from dynatune.tasks.mlflow_store import sqlite_path
from dynatune.tasks.run_writer import ROUND_METRICS


def check_store_exists(uri: str) -> None:
    """A local store that is read (not written) must exist: MLflow would create an empty one, and its
    directories, where a mistyped path points."""
    path = sqlite_path(uri)
    if path is None and uri.startswith("file:"):
        path = urllib.parse.urlsplit(uri).path
    elif path is None and "://" not in uri:
        path = uri  # a plain path: MLflow's file store
    elif path is None:
        return
    if path != ":memory:" and not os.path.exists(path):
        raise DynatuneError(
            f"no MLflow store at {mask(uri)} ({path} does not exist)",
            "give --tracking-uri the run's store, such as sqlite:///runs/MODEL/mlflow.db, or set "
            "MLFLOW_TRACKING_URI",
        )


def read_run(uri: str, run_id: str) -> dict:
    """Everything `dynatune report` / `compare` need from a finished (or running) MLflow run: its
    ``summary`` is a :class:`~dynatune.run.summary.RunSummary`, None when the run has none (yet)."""
    from mlflow import MlflowClient

    check_store_exists(uri)
    client = MlflowClient(uri)
    try:
        run = client.get_run(run_id)
    except Exception as exc:
        raise DynatuneError(
            f"no MLflow run {run_id!r} in {mask(uri)} ({type(exc).__name__})",
            "give --tracking-uri or set MLFLOW_TRACKING_URI to the store that has it",
        ) from None
    history = {}
    for key in ROUND_METRICS:
        history[key] = {m.step: m.value for m in client.get_metric_history(run_id, key)}
    rounds = []
    for step in sorted(history["estimated_latency_ms"]):
        rounds.append({k: history[k].get(step) for k in ROUND_METRICS} | {"round": step})
    summary, task_names = None, {}
    with tempfile.TemporaryDirectory() as tmp:
        try:
            summary = RunSummary.load(client.download_artifacts(run_id, "summary.json", tmp))
        except Exception:
            pass
        try:
            with open(client.download_artifacts(run_id, "tasks.json", tmp)) as f:
                task_names = {int(t["index"]): str(t["name"]) for t in json.load(f)}
        except Exception:
            pass  # a run logged before tasks.json was: tasks by index
    return {
        "run": run,
        "rounds": rounds,
        "summary": summary,
        "task_names": task_names,
        "tags": run.data.tags,
        "params": run.data.params,
        "metrics": run.data.metrics,
    }
