"""The ``watch_registry`` flow: tune every new version of watched models in the MLflow Model Registry.

Run every few minutes by a deployment (``prefect.yaml``'s ``watch-registry``, or ``dynatune serve
--watch NAME``). Each run:

1. lists the versions of each watched registered model and keeps those with no tuning run linked yet
   (no ``dynatune.tuned_run_id`` tag; see :mod:`dynatune.tasks.registry`), oldest first;
2. claims a version (``dynatune.status=tuning``), downloads its ONNX model (``models:/NAME/VERSION``);
3. runs the ``tune_model`` flow (as a subflow) on exactly that version: ``model.version`` is set, so the
   MLflow run carries ``model_version``; the run goes to the registry's store, experiment
   ``dynatune/NAME``, work dir ``<work_root>/NAME/v<VERSION>``, warm-started from the newest earlier
   tuned version's work dir when it is on this machine;
4. registers the run's tuned model (its MLflow pyfunc model) as a version of ``NAME-tuned``, links it
   and the ONNX version both ways (tags), and moves ``NAME-tuned``'s alias ``champion`` to it only when
   it is not slower than the champion, timed side by side on quiet cores, and matched ONNX Runtime's
   outputs (see :mod:`dynatune.tasks.registry`).

A failed tuning marks the version ``failed`` (with the error) and is retried by later runs, up to
``max_attempts`` tries. A second run finds nothing to do for a version already tuned.
"""

from __future__ import annotations

import os
import re

from prefect import flow

from dynatune.files import WorkDir
from dynatune.flows.tune_model import tune_model
from dynatune.run.config import load_config, validate_dict
from dynatune.secrets import mask, reference, resolve
from dynatune.tasks.registry import (
    claim_version,
    download_version,
    find_untuned_versions,
    link_tuned_version,
    mark_failed,
)


@flow(name="watch_registry", log_prints=False)
def watch_registry(
    names: list[str],
    config: str | dict | None = None,
    tracking_uri: str | None = None,
    work_root: str = "runs/registry",
    max_attempts: int = 3,
    stale_claim_s: float = 6 * 3600,
) -> list[dict]:
    """One pass over the watched registered models; returns what it did per version.

    ``config``: YAML path or config dict for the tuning runs (budget, scheduler, search, measure, target,
    model.shapes); its model path, name, version, work_dir and tracking store are set per version.
    ``tracking_uri``: the registry's store (default ``$MLFLOW_TRACKING_URI``).
    """
    uri_ref = tracking_uri or os.environ.get("MLFLOW_TRACKING_URI")  # passed on as given (maybe env:NAME)
    uri = resolve(uri_ref, "tracking_uri")
    if not uri:
        from dynatune.errors import DynatuneError

        raise DynatuneError(
            "watch_registry needs the registry's tracking URI", "pass tracking_uri or set MLFLOW_TRACKING_URI"
        )
    base = _base_config(config)
    done = []
    for pv in find_untuned_versions(uri, list(names), max_attempts=max_attempts, stale_claim_s=stale_claim_s):
        claim_version(uri, pv.name, pv.version, pv.attempts)
        work_dir = os.path.abspath(os.path.join(work_root, _safe(pv.name), f"v{pv.version}"))
        try:
            path = download_version(uri, pv.name, pv.version, WorkDir(work_dir).model_dir)
            cfg = version_config(
                base,
                pv.name,
                pv.version,
                path,
                work_dir,
                reference(uri, "DYNATUNE_TRACKING_URI"),
                pv.previous_work_dir,
            )
            summary = tune_model(cfg)
            quiet = validate_dict({k: v for k, v in cfg.items() if k != "_source"}).compile.quiet()
            linked = link_tuned_version(uri, pv.name, pv.version, summary, quiet)
        except Exception as exc:
            msg = str(exc).strip().splitlines()
            error = mask(msg[-1]) if msg else ""
            mark_failed(uri, pv.name, pv.version, f"{type(exc).__name__}: {error}")
            done.append(
                {
                    "name": pv.name,
                    "version": pv.version,
                    "status": "failed",
                    "error": error[:300] or type(exc).__name__,
                }
            )
            continue
        done.append(linked | {"status": "tuned"})
    return done


def _base_config(config) -> dict:
    if config is None:
        return load_config(None).to_dict()
    if isinstance(config, str):
        return load_config(config).to_dict() | {"_source": config}
    return dict(config)


def version_config(
    base: dict,
    name: str,
    version: str,
    model_path: str,
    work_dir: str,
    uri: str,
    previous_work_dir: str | None,
) -> dict:
    """The tune_model config for one registered model version (validated here, so errors name it)."""
    d = {k: v for k, v in base.items() if k != "_source"}
    model = dict(d.get("model") or {})
    model.update(path=model_path, name=_safe(name), version=str(version))
    tracking = dict(d.get("tracking") or {})
    tracking.update(
        uri=uri,
        experiment=f"dynatune/{name}",
        run_name=f"{name}-v{version}",
        tags={
            **(tracking.get("tags") or {}),
            "registered_model": name,
            "registered_model_version": str(version),
            "trigger": "registry",
        },
    )
    warm = [w for w in (d.get("warm_start") or [])]
    if previous_work_dir and os.path.isdir(previous_work_dir) and previous_work_dir not in warm:
        warm.append(previous_work_dir)
    d.update(model=model, tracking=tracking, work_dir=work_dir, warm_start=warm)
    source = f"{base.get('_source', '(watch_registry config)')} for models:/{name}/{version}"
    validate_dict(d, source=source)
    return d | {"_source": source}


def _safe(name: str) -> str:
    """A registered model name as a file and experiment-friendly name."""
    s = re.sub(r"[^A-Za-z0-9_.-]+", "_", name).strip("._")
    return s or "model"
