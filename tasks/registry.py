"""MLflow Model Registry glue for the registry watcher (:mod:`flows.registry`).

A version of a watched registered model is *pending* until a tuning run has been linked to it. The
link is a set of model-version tags, and the alias ``tuned`` on the newest tuned version:

- ``dynatune.status``: ``tuning`` (claimed by a watcher), ``tuned`` or ``failed``;
- ``dynatune.tuned_run_id``: the MLflow run of the tuning (its ``compiled/model.so`` is the artifact);
- ``dynatune.artifact_uri``: ``runs:/<run id>/compiled/model.so``;
- ``dynatune.latency_ms``, ``dynatune.estimated_latency_ms``, ``dynatune.speedup_vs_untuned``,
  ``dynatune.scheduler``, ``dynatune.machine.target``, ``dynatune.work_dir``;
- ``dynatune.attempts`` / ``dynatune.error`` for failed tries (retried up to ``max_attempts``).

``models:/NAME@tuned`` is then the newest version that has a tuned library.
"""

from __future__ import annotations

import os
import shutil
import tempfile
import time
from dataclasses import dataclass

from prefect import task
from prefect.cache_policies import NO_CACHE

from dynatune.run.summary import RunSummary

PREFIX = "dynatune."
ALIAS = "tuned"


@dataclass
class PendingVersion:
    name: str
    version: str
    attempts: int
    previous_work_dir: str | None  # work dir of the newest earlier tuned version (warm start), if on disk


def _client(uri: str):
    from mlflow import MlflowClient

    return MlflowClient(tracking_uri=uri, registry_uri=uri)


def _versions(client, name: str) -> list:
    vs = client.search_model_versions(f"name='{_quote(name)}'")
    return sorted(vs, key=lambda v: int(v.version))


def _quote(name: str) -> str:
    return name.replace("'", "\\'")


@task(name="find-untuned-versions", cache_policy=NO_CACHE, retries=2, retry_delay_seconds=5)
def find_untuned_versions(
    uri: str, names: list[str], max_attempts: int = 3, stale_claim_s: float = 6 * 3600
) -> list[PendingVersion]:
    """Versions of the watched models that have no tuning run linked yet (oldest first).

    Skipped: versions not READY, versions claimed by a watcher less than ``stale_claim_s`` ago, and
    versions that failed ``max_attempts`` times.
    """
    client = _client(uri)
    out = []
    now = time.time()
    for name in names:
        try:
            versions = _versions(client, name)
        except Exception as exc:
            if "RESOURCE_DOES_NOT_EXIST" in str(exc):
                continue
            raise
        last_tuned_dir = None
        for mv in versions:
            tags = mv.tags or {}
            if tags.get(PREFIX + "tuned_run_id"):
                wd = tags.get(PREFIX + "work_dir")
                if wd and os.path.isdir(wd):
                    last_tuned_dir = wd
                continue
            if str(mv.status) not in ("READY", "ModelVersionStatus.READY"):
                continue
            attempts = int(tags.get(PREFIX + "attempts", "0") or 0)
            if attempts >= max_attempts:
                continue
            if tags.get(PREFIX + "status") == "tuning":
                claimed = float(tags.get(PREFIX + "claimed_at", "0") or 0)
                if now - claimed < stale_claim_s:
                    continue
            out.append(PendingVersion(name, str(mv.version), attempts, last_tuned_dir))
    return out


@task(name="claim-version", cache_policy=NO_CACHE, retries=2, retry_delay_seconds=5)
def claim_version(uri: str, name: str, version: str, attempts: int) -> None:
    client = _client(uri)
    for k, v in {
        "status": "tuning",
        "claimed_at": f"{time.time():.0f}",
        "attempts": str(attempts + 1),
        "claimed_by": f"{os.uname().nodename}:{os.getpid()}",
    }.items():
        client.set_model_version_tag(name, version, PREFIX + k, v)


@task(name="download-version", cache_policy=NO_CACHE, retries=2, retry_delay_seconds=5)
def download_version(uri: str, name: str, version: str, dest: str) -> str:
    """Download the ONNX model of ``models:/NAME/VERSION`` into ``dest``; returns the .onnx path.

    The whole model directory is kept, so external tensor data next to the graph still loads.
    """
    import mlflow

    os.makedirs(os.path.dirname(os.path.abspath(dest)) or ".", exist_ok=True)
    tmp = tempfile.mkdtemp(prefix="download-", dir=os.path.dirname(os.path.abspath(dest)))
    try:
        local = mlflow.artifacts.download_artifacts(
            artifact_uri=f"models:/{name}/{version}", dst_path=tmp, tracking_uri=uri
        )
        rel = _onnx_file(local)
        if rel is None:
            raise ValueError(
                f"models:/{name}/{version} holds no ONNX model (log it with mlflow.onnx.log_model)"
            )
        if os.path.exists(dest):
            shutil.rmtree(dest)
        shutil.move(local, dest)
        return os.path.join(dest, rel)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def _onnx_file(model_dir: str) -> str | None:
    """The ONNX file of an MLflow model directory: the onnx flavour's ``data``, else the only *.onnx."""
    import yaml

    mlmodel = os.path.join(model_dir, "MLmodel")
    if os.path.exists(mlmodel):
        with open(mlmodel) as f:
            meta = yaml.safe_load(f) or {}
        data = ((meta.get("flavors") or {}).get("onnx") or {}).get("data")
        if data and os.path.exists(os.path.join(model_dir, data)):
            return data
    found = [f for f in sorted(os.listdir(model_dir)) if f.endswith(".onnx")]
    return found[0] if len(found) == 1 else None


@task(name="link-tuned-version", cache_policy=NO_CACHE, retries=2, retry_delay_seconds=5)
def link_tuned_version(uri: str, name: str, version: str, summary: RunSummary) -> dict:
    """Tag the model version with its tuning run and move the ``tuned`` alias to the newest tuned version."""
    client = _client(uri)
    run_id = summary.mlflow_run_id
    tags = {
        "status": "tuned",
        "tuned_run_id": run_id,
        "artifact_uri": f"runs:/{run_id}/compiled/{os.path.basename(summary.artifact or 'model.so')}",
        "latency_ms": summary.latency_ms,
        "estimated_latency_ms": summary.estimated_latency_ms,
        "speedup_vs_untuned": summary.speedup_vs_untuned,
        "scheduler": summary.scheduler,
        "work_dir": summary.work_dir,
        "tuned_at": f"{time.time():.0f}",
    }
    run = client.get_run(run_id)
    tags["target"] = run.data.tags.get("target", "")
    for k, v in tags.items():
        if v is not None:
            client.set_model_version_tag(
                name, version, PREFIX + k, f"{v:.6g}" if isinstance(v, float) else str(v)
            )
    if (client.get_model_version(name, version).tags or {}).get(PREFIX + "error"):
        client.delete_model_version_tag(name, version, PREFIX + "error")
    # the run points back at the version it tuned
    client.set_tag(run_id, "registered_model", name)
    client.set_tag(run_id, "registered_model_version", str(version))
    tuned = [
        int(mv.version) for mv in _versions(client, name) if (mv.tags or {}).get(PREFIX + "tuned_run_id")
    ]
    newest = str(max(tuned)) if tuned else str(version)
    client.set_registered_model_alias(name, ALIAS, newest)
    return {
        "name": name,
        "version": str(version),
        "run_id": run_id,
        "alias_version": newest,
        "latency_ms": summary.latency_ms,
    }


@task(name="mark-failed", cache_policy=NO_CACHE, retries=2, retry_delay_seconds=5)
def mark_failed(uri: str, name: str, version: str, error: str) -> None:
    client = _client(uri)
    client.set_model_version_tag(name, version, PREFIX + "status", "failed")
    client.set_model_version_tag(name, version, PREFIX + "error", error[:4000])


def tuned_version(uri: str, name: str) -> dict | None:
    """The newest tuned version of ``name`` (the ``tuned`` alias) and its dynatune tags, or None."""
    client = _client(uri)
    try:
        mv = client.get_model_version_by_alias(name, ALIAS)
    except Exception:
        return None
    return {
        "version": str(mv.version),
        **{k[len(PREFIX) :]: v for k, v in (mv.tags or {}).items() if k.startswith(PREFIX)},
    }
