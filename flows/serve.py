"""Scheduled operations on one machine: ``dynatune serve``.

- ``nightly-retune-<config>``: one deployment of the ``tune_model`` flow per config, on a cron schedule
  (default ``0 2 * * *``, UTC), with parameters ``{config: <absolute path>, retune: true}``: each night
  a new run in ``<work_dir>/retune/<UTC stamp>``, warm-started from the previous night's records
  (see :func:`dynatune.flows.tune_model.retune_config`). The config file is read when the run starts, so edits
  apply from the next night on.
- ``watch-registry``: the ``watch_registry`` flow every N minutes for the watched registered models
  (see :mod:`dynatune.flows.watch_registry`).

:func:`serve_deployments` registers them with the Prefect API (``PREFECT_API_URL``, or a local
ephemeral server) and runs their flow runs as subprocesses of this process, at most ``limit`` at a
time (1 by default: two tunings on one machine would disturb each other's measurements). For a cluster,
deploy the same flows to a work pool instead: ``prefect deploy --all`` with ``prefect.yaml`` (see
docs/operations.md).
"""

from __future__ import annotations

import datetime
import os
import re

from dynatune.run.config import load_config

NIGHTLY_CRON = "0 2 * * *"


def deployment_name(config_path: str) -> str:
    stem = os.path.splitext(os.path.basename(config_path))[0]
    return "nightly-retune-" + (re.sub(r"[^A-Za-z0-9_-]+", "-", stem).strip("-") or "config")


def build_deployments(
    configs: list[str],
    *,
    cron: str = NIGHTLY_CRON,
    timezone: str = "UTC",
    watch: list[str] | None = None,
    watch_config: str | None = None,
    tracking_uri: str | None = None,
    every_minutes: float = 10.0,
    work_root: str = "runs/registry",
) -> list:
    """The deployments to serve (``RunnerDeployment`` objects). Every config is validated now, so a
    bad one fails at start-up, not at 2 a.m."""
    from prefect.deployments.runner import EntrypointType
    from prefect.schedules import Cron

    from dynatune.flows.tune_model import tune_model

    # by module path, not file path: the flow runs wherever the package is installed, whatever the cwd
    by_module = EntrypointType.MODULE_PATH

    from dynatune.errors import DynatuneError
    from dynatune.secrets import reference

    try:
        import zoneinfo

        zoneinfo.ZoneInfo(timezone)
        nightly = Cron(cron, timezone=timezone)
    except (ValueError, zoneinfo.ZoneInfoNotFoundError) as exc:
        msg = str(exc).strip().splitlines()
        raise DynatuneError(
            f"bad --cron {cron!r} / --timezone {timezone!r}: {msg[-1] if msg else exc}",
            "give five cron fields, e.g. '0 2 * * *', and an IANA time zone",
        ) from None
    deps, names = [], set()
    for path in configs:
        path = os.path.abspath(path)
        cfg = load_config(path)
        name = deployment_name(path)
        if name in names:
            raise DynatuneError(
                f"two configs give the deployment name {name}", "rename one of the config files"
            )
        names.add(name)
        deps.append(
            tune_model.to_deployment(
                name=name,
                schedule=nightly,
                parameters={"config": path, "retune": True},
                description=(
                    f"Nightly retune of {cfg.model.name} ({path}): a new warm-started run each night."
                ),
                tags=["dynatune", "nightly"],
                entrypoint_type=by_module,
            )
        )
    if watch:
        from prefect.schedules import Interval

        from dynatune.flows.watch_registry import watch_registry

        uri = tracking_uri or os.environ.get("MLFLOW_TRACKING_URI")
        if not uri:
            raise DynatuneError(
                "--watch needs the registry's tracking store",
                "pass --tracking-uri or set MLFLOW_TRACKING_URI",
            )
        # a URI with credentials is passed as env:NAME (the served runs inherit this process's environment):
        # deployment parameters are shown in the Prefect UI
        params = {
            "names": list(watch),
            "tracking_uri": reference(uri, "DYNATUNE_REGISTRY_URI"),
            "work_root": os.path.abspath(work_root),
        }
        if watch_config:
            load_config(watch_config)
            params["config"] = os.path.abspath(watch_config)
        deps.append(
            watch_registry.to_deployment(
                name="watch-registry",
                # first check shortly after start-up (not one interval later), then every N minutes. The
                # server plans no run whose time has passed when the deployment is registered: leave it a
                # margin.
                schedule=Interval(
                    datetime.timedelta(minutes=every_minutes),
                    anchor_date=datetime.datetime.now(datetime.timezone.utc) + datetime.timedelta(seconds=30),
                ),
                parameters=params,
                tags=["dynatune", "registry"],
                description=f"Tune every new version of {', '.join(watch)} in the MLflow Model Registry.",
                entrypoint_type=by_module,
            )
        )
    return deps


def serve_deployments(deployments: list, limit: int = 1) -> None:
    """Register the deployments and run their scheduled flow runs here until interrupted."""
    from prefect import serve

    serve(*deployments, limit=limit, print_starting_message=True)
