"""The ``tune_model`` flow: the library's pipeline (:func:`dynatune.run.pipeline.run`) as a Prefect flow.

Each stage is a Prefect task run (one per tuning round), so a run's progress is visible in the Prefect
UI, and every round is tracked in MLflow by the MLflow callback. Without ``PREFECT_API_URL`` Prefect runs
in its local ephemeral mode; without a tracking URI MLflow writes ``<work_dir>/mlflow.db``.
"""

from __future__ import annotations

from prefect import flow

from dynatune.run import pipeline
from dynatune.run.config import validate_dict
from dynatune.run.pipeline import latest_run_dir, retune_config  # noqa: F401  (re-exported: the retune layout lives in the library)
from dynatune.run.summary import RunSummary
from dynatune.tasks.steps import PREFECT_STEPS
from dynatune.tasks.tracking import MlflowCallback


@flow(name="tune_model", log_prints=False, validate_parameters=False)
def tune_model(config: dict | str, retune: bool = False, callbacks: list | None = None) -> RunSummary:
    """Tune one model. ``config``: a resolved config dict, or the path of a YAML config (read when the
    flow runs, so a scheduled deployment picks up edits). ``retune``: a fresh run in a new dated work
    directory under ``<work_dir>/retune/``, warm-started from the newest earlier run of the same config
    (what the nightly deployments do; see :func:`dynatune.run.pipeline.retune_config`). ``callbacks``:
    further observers of this run (:class:`dynatune.run.callbacks.RunCallback`, e.g. the CLI's live view),
    called after the MLflow callback; only an in-process call can pass them (Prefect does not store them)."""
    if isinstance(config, str):
        from dynatune.run.config import load_config

        cfg = load_config(config)
    else:
        config = dict(config)
        source = config.pop("_source", "(flow parameter)")
        cfg = validate_dict(config, source=source)
    if retune:
        cfg = retune_config(cfg)
    return pipeline.run(cfg, callbacks=[MlflowCallback(), *(callbacks or ())], steps=PREFECT_STEPS)
