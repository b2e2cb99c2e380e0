"""The pipeline's stages as Prefect tasks: each is the library's own stage (:mod:`dynatune.run.pipeline`)."""

from __future__ import annotations

from prefect import task
from prefect.cache_policies import NO_CACHE

from dynatune.run import pipeline

PREFECT_STEPS = pipeline.Steps(
    load_model=task(name="import-model", cache_policy=NO_CACHE)(pipeline.load_model),
    extract=task(name="extract-tasks", cache_policy=NO_CACHE)(pipeline.extract),
    prepare=task(name="measure-defaults", cache_policy=NO_CACHE, retries=1, retry_delay_seconds=1)(
        pipeline.prepare
    ),
    tune_round=task(
        name="tune-round",
        task_run_name="round-{round_no}",
        cache_policy=NO_CACHE,
        retries=2,
        retry_delay_seconds=1,
    )(pipeline.tune_round),
    compile_verify=task(name="compile-verify", cache_policy=NO_CACHE, retries=1, retry_delay_seconds=1)(
        pipeline.compile_verify
    ),
)
