"""MLflow Model Registry glue for the registry watcher (:mod:`dynatune.flows.watch_registry`).

A version of a watched registered model (an ONNX model) is *pending* until a tuning run has been linked
to it. Linking registers the run's tuned model (its MLflow pyfunc model,
:mod:`dynatune.tasks.tuned_model`) as a version of the registered model ``NAME-tuned``, and moves that
model's alias ``champion`` to it only when it earned it (:mod:`dynatune.compiler.promotion`: its outputs
matched ONNX Runtime's and, timed side by side with the champion on quiet cores, it is not slower). So::

    mlflow.pyfunc.load_model("models:/NAME-tuned@champion")

loads the tuned library of the newest version that earned it. Tags link each side to the other:

- on the ONNX version: ``dynatune.status`` (``tuning`` while claimed by a watcher, then ``tuned`` or
  ``failed``), ``dynatune.tuned_run_id``, ``dynatune.tuned_model`` and ``dynatune.tuned_model_version``
  (the ``NAME-tuned`` version), ``dynatune.artifact_uri`` (``runs:/<run id>/tuned_model``),
  ``dynatune.latency_ms``, ``dynatune.ratio_vs_onnxruntime``, ``dynatune.estimated_latency_ms``,
  ``dynatune.speedup_vs_untuned``, ``dynatune.scheduler``, ``dynatune.target``, ``dynatune.work_dir``;
  ``dynatune.attempts`` / ``dynatune.error`` for failed tries (retried up to ``max_attempts``);
- on the ``NAME-tuned`` version (its MLflow run is the tuning run): ``dynatune.source_model``,
  ``dynatune.source_version``, ``dynatune.tuned_run_id``, the measured figures, and ``dynatune.promoted``
  (``true``/``false``) with ``dynatune.promotion_reason``; the tuning run gets the same two tags.
"""

from __future__ import annotations

import os
import shutil
import tempfile
import time
from dataclasses import dataclass

from prefect import task
from prefect.cache_policies import NO_CACHE

from dynatune.compiler.promotion import Promotion, decide
from dynatune.files import WorkDir, atomic_write_json
from dynatune.machine.load import QuietPolicy
from dynatune.run.summary import RunSummary

PREFIX = "dynatune."
TUNED_SUFFIX = "-tuned"  # NAME-tuned: the registered model of NAME's tuned models
CHAMPION = "champion"  # its alias: the tuned model users deploy


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


def tuned_model_name(name: str) -> str:
    """The registered model that holds the tuned models of the ONNX model ``name``."""
    return name + TUNED_SUFFIX


@task(name="link-tuned-version", cache_policy=NO_CACHE, retries=2, retry_delay_seconds=5)
def link_tuned_version(
    uri: str, name: str, version: str, summary: RunSummary, quiet: QuietPolicy = QuietPolicy()
) -> dict:
    """Register the run's tuned model as a version of ``NAME-tuned``, link it and the ONNX version both ways,
    and move ``champion`` to it if it earned it (``quiet``: the side-by-side timing's policy on a busy
    machine)."""
    client = _client(uri)
    run_id = summary.mlflow_run_id
    if not summary.tuned_model_id:
        raise ValueError(f"the tuning run {run_id} logged no tuned model")
    tuned = tuned_model_name(name)
    try:
        client.get_registered_model(tuned)
    except Exception:
        client.create_registered_model(
            tuned, description=f"dynatune's tuned models of {name}: load models:/{tuned}@{CHAMPION}"
        )
    figures = {
        "latency_ms": summary.latency_ms,
        "ratio_vs_onnxruntime": summary.ratio_vs_onnxruntime,
        "estimated_latency_ms": summary.estimated_latency_ms,
        "speedup_vs_untuned": summary.speedup_vs_untuned,
    }
    tuned_version = _registered_version(client, tuned, run_id) or str(
        client.create_model_version(
            tuned,
            source=f"models:/{summary.tuned_model_id}",
            run_id=run_id,
            model_id=summary.tuned_model_id,
            tags=_tags({"source_model": name, "source_version": version, "tuned_run_id": run_id, **figures}),
        ).version
    )
    onnx_tags = {
        "status": "tuned",
        "tuned_run_id": run_id,
        "tuned_model": tuned,
        "tuned_model_version": tuned_version,
        "artifact_uri": summary.tuned_model_uri,
        **figures,
        "scheduler": summary.scheduler,
        "work_dir": summary.work_dir,
        "tuned_at": f"{time.time():.0f}",
        "target": client.get_run(run_id).data.tags.get("target", ""),
    }
    for k, v in _tags(onnx_tags).items():
        client.set_model_version_tag(name, version, k, v)
    if (client.get_model_version(name, version).tags or {}).get(PREFIX + "error"):
        client.delete_model_version_tag(name, version, PREFIX + "error")
    # the run points back at the version it tuned and the tuned model it made
    client.set_tag(run_id, "registered_model", name)
    client.set_tag(run_id, "registered_model_version", str(version))
    client.set_tag(run_id, PREFIX + "tuned_model_version", f"{tuned}/{tuned_version}")
    promotion = promote(uri, tuned, tuned_version, summary, quiet)
    for k, v in {"promoted": str(promotion.promoted).lower(), "promotion_reason": promotion.reason}.items():
        client.set_model_version_tag(tuned, tuned_version, PREFIX + k, v)
        client.set_tag(run_id, PREFIX + k, v)
    report_promotion(client, summary, promotion, f"{tuned} version {tuned_version}")
    return {
        "name": name,
        "version": str(version),
        "run_id": run_id,
        "tuned_model": tuned,
        "tuned_version": tuned_version,
        "promoted": promotion.promoted,
        "promotion_reason": promotion.reason,
        "champion_version": champion_version(uri, name),
        "latency_ms": summary.latency_ms,
    }


def _registered_version(client, tuned: str, run_id: str) -> str | None:
    """The version of ``tuned`` already registered from run ``run_id`` (a retried link), if any."""
    for mv in _versions(client, tuned):
        if (mv.tags or {}).get(PREFIX + "tuned_run_id") == run_id:
            return str(mv.version)
    return None


def promote(uri: str, tuned: str, tuned_version: str, summary: RunSummary, quiet: QuietPolicy):
    """Move ``champion`` to ``tuned_version`` if it earned it (:func:`dynatune.compiler.promotion.decide`,
    against the champion's library, downloaded here); returns the :class:`Promotion`."""
    import mlflow

    from dynatune.tasks.tuned_model import library_in_model

    client = _client(uri)
    try:
        holder = client.get_model_version_by_alias(tuned, CHAMPION)
    except Exception:
        holder = None
    if holder is not None and str(holder.version) == tuned_version:  # a retried link that promoted it
        return Promotion(True, (holder.tags or {}).get(PREFIX + "promotion_reason", "already the champion"))
    with tempfile.TemporaryDirectory(prefix="dynatune-champion-") as tmp:
        champion = None
        if holder is not None:
            local = mlflow.artifacts.download_artifacts(
                artifact_uri=f"models:/{tuned}/{holder.version}", dst_path=tmp, tracking_uri=uri
            )
            champion = library_in_model(local)
        promotion = decide(summary.artifact, champion, numerics_ok=bool(summary.numerics_ok), quiet=quiet)
    if promotion.promoted:
        client.set_registered_model_alias(tuned, CHAMPION, tuned_version)
    return promotion


def report_promotion(client, summary: RunSummary, promotion, registered: str) -> None:
    """Say whether ``registered`` took the champion's place, and why: on the console, in the run's report
    (``report/promotion.json``, and a section of ``report/report.md``) and in its MLflow run's artifacts."""
    verdict = "promoted to champion" if promotion.promoted else "not promoted"
    line = f"{registered}: {verdict}: {promotion.reason}"
    print(line, flush=True)
    report = WorkDir(summary.work_dir)
    os.makedirs(report.report_dir, exist_ok=True)
    path = os.path.join(report.report_dir, "promotion.json")
    atomic_write_json(path, {"registered": registered, **promotion.as_dict()})
    if os.path.exists(report.report_md):
        with open(report.report_md, "a") as f:
            f.write(f"\n## Promotion\n\n{line}\n")
        client.log_artifact(summary.mlflow_run_id, report.report_md, "report")
    client.log_artifact(summary.mlflow_run_id, path, "report")


def _tags(values: dict) -> dict[str, str]:
    """``dynatune.``-prefixed tag values (floats to 6 significant digits; None left out)."""
    return {
        PREFIX + k: f"{v:.6g}" if isinstance(v, float) else str(v) for k, v in values.items() if v is not None
    }


@task(name="mark-failed", cache_policy=NO_CACHE, retries=2, retry_delay_seconds=5)
def mark_failed(uri: str, name: str, version: str, error: str) -> None:
    client = _client(uri)
    client.set_model_version_tag(name, version, PREFIX + "status", "failed")
    client.set_model_version_tag(name, version, PREFIX + "error", error[:4000])


def champion_version(uri: str, name: str) -> str | None:
    """The version of ``NAME-tuned`` that holds ``champion`` (None when none does)."""
    try:
        return str(_client(uri).get_model_version_by_alias(tuned_model_name(name), CHAMPION).version)
    except Exception:
        return None


def champion(uri: str, name: str) -> dict | None:
    """The champion of ``name``'s tuned models (``models:/NAME-tuned@champion``) and its dynatune tags, or
    None."""
    client = _client(uri)
    try:
        mv = client.get_model_version_by_alias(tuned_model_name(name), CHAMPION)
    except Exception:
        return None
    return {
        "version": str(mv.version),
        **{k[len(PREFIX) :]: v for k, v in (mv.tags or {}).items() if k.startswith(PREFIX)},
    }
