"""The pipeline's stages as Prefect tasks. Each is a thin call into :mod:`dynatune`."""

from __future__ import annotations

import os

from prefect import task
from prefect.cache_policies import NO_CACHE

from dynatune.cache import cached_extract
from dynatune.model import load_model
from dynatune.target import make_target


@task(name="import-model", cache_policy=NO_CACHE)
def import_model(cfg):
    """ONNX -> Relax (weights as parameters). Cheap; the expensive extraction below is cached."""
    return load_model(cfg.model.path, cfg.model.shapes, name=cfg.model.name)


@task(name="extract-tasks", cache_policy=NO_CACHE)
def extract(model, cfg):
    """Weighted tasks, cached on (model content hash, shapes, target, prepack) in <work_dir>/cache."""
    target = make_target(cfg.target)
    tasks, hit = cached_extract(model, target, os.path.join(cfg.work_dir, "cache"), cfg.compile.prepack)
    return target, tasks, hit


@task(name="measure-defaults", cache_policy=NO_CACHE, retries=1, retry_delay_seconds=1)
def measure_defaults(tuner) -> float:
    """Round 0: every task's untuned latency (once per work dir)."""
    return tuner.prepare()


@task(name="tune-round", task_run_name="round-{round_no}", cache_policy=NO_CACHE, retries=2,
      retry_delay_seconds=1)
def tune_round(tuner, round_no: int):
    """Choose a task -> tune it for one slot -> record the round and the beliefs."""
    return tuner.step()


@task(name="compile-verify", cache_policy=NO_CACHE, retries=1, retry_delay_seconds=1)
def compile_verify(model, target, session, cfg, artifact: str):
    from dynatune.compile import compile_and_verify
    from dynatune.target import usable_cores

    return compile_and_verify(model, target, session.compile_database(), artifact, threads=usable_cores(),
                              rel_tol=cfg.compile.rel_tol, measure_untuned=cfg.compile.measure_untuned,
                              measure_onnxruntime=cfg.compile.measure_onnxruntime, prepack=cfg.compile.prepack)
