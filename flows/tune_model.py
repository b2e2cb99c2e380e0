"""The ``tune_model`` flow: import -> extract -> round 0 -> N tuning rounds -> compile + verify.

Each stage is a Prefect task run (one per scheduler round), so a run's progress is visible in the
Prefect UI; every round is tracked in MLflow. Without ``PREFECT_API_URL`` Prefect runs in its local
ephemeral mode; without a tracking URI MLflow writes ``<work_dir>/mlflow.db``.
"""

from __future__ import annotations

import dataclasses
import datetime
import json
import math
import os
import shutil
import sys
import threading
import time

from prefect import flow

from dynatune import __version__
from dynatune.config import validate_dict
from dynatune.lock import WorkDirLock
from dynatune.session import TuningSession, atomic_write_json
from dynatune.tuner import Tuner, check_same_run
from tasks.steps import compile_verify, extract, import_model, measure_defaults, tune_round
from tasks.tracking import Tracker

# progress listeners (the CLI's live view); called in-process with (event, payload)
LISTENERS: list = []
MAX_FAILED_ROUNDS = 3


def _emit(event: str, payload) -> None:
    for f in list(LISTENERS):
        try:
            f(event, payload)
        except Exception:
            pass


@flow(name="tune_model", log_prints=False, validate_parameters=False)
def tune_model(config: dict | str, retune: bool = False) -> dict:
    """Tune one model. ``config``: a resolved config dict, or the path of a YAML config (read when the
    flow runs, so a scheduled deployment picks up edits). ``retune``: a fresh run in a new dated work
    directory under ``<work_dir>/retune/``, warm-started from the newest earlier run of the same config
    (what the nightly deployments do; see :func:`retune_config`)."""
    if isinstance(config, str):
        from dynatune.config import load_config

        cfg = load_config(config)
    else:
        config = dict(config)
        source = config.pop("_source", "(flow parameter)")
        cfg = validate_dict(config, source=source)
    if retune:
        cfg = retune_config(cfg)
    return run_pipeline(cfg)


def retune_config(cfg, now: datetime.datetime | None = None):
    """The config of a retune of ``cfg``: same model, search, store; a new dated work directory.

    The new run is warm-started from the newest earlier run of this config that has records (the base
    work dir or an earlier retune), so matched tasks start at their best known schedules and the search
    carries on from them; it is tracked as a new MLflow run (``trigger=retune``) in the same store and
    experiment, so nightly runs line up in the MLflow UI.
    """
    stamp = (now or datetime.datetime.now(datetime.timezone.utc)).strftime("%Y%m%dT%H%M%SZ")
    base = cfg.work_dir
    work_dir = os.path.join(base, "retune", stamp)
    prev = latest_run_dir(base)
    warm = list(cfg.warm_start)
    if prev and prev not in warm:
        warm.append(prev)
    tracking = dataclasses.replace(cfg.tracking, run_name=cfg.tracking.run_name or f"retune-{stamp}",
                                   tags={**cfg.tracking.tags, "trigger": "retune", "retune_of": base})
    return dataclasses.replace(cfg, work_dir=work_dir, warm_start=warm, tracking=tracking)


def latest_run_dir(base: str) -> str | None:
    """The newest of ``base`` and ``base/retune/*`` that holds tuning records (None if none does)."""
    def has_records(d):
        p = os.path.join(d, "db", "records.jsonl")
        return os.path.exists(p) and os.path.getsize(p) > 0

    root = os.path.join(base, "retune")
    dated = sorted(os.listdir(root), reverse=True) if os.path.isdir(root) else []
    for d in [os.path.join(root, x) for x in dated] + [base]:
        if has_records(d):
            return d
    return None


def import_tvm_intrinsics() -> None:
    """Import ``tvm.s_tir.tensor_intrin`` (the first tuning slot needs it) from a fresh thread.

    TVMScript's parser calls ``inspect.stack()`` for each of its ~250 intrinsics, and every frame costs
    a scan of ``sys.modules``. Inside a Prefect flow run the stack is ~30 frames deep and ``sys.modules``
    holds Prefect and MLflow: the import took ~85 s there instead of ~20 s at top level. A fresh
    thread has a shallow stack (~30 s in a flow run). The caller waits for it, so no two threads ever
    import the same modules at once.
    """
    if "tvm.s_tir.tensor_intrin" in sys.modules:
        return
    errors: list[BaseException] = []

    def work():
        try:
            import tvm.s_tir.tensor_intrin  # noqa: F401
        except BaseException as exc:  # re-raised below, in the caller's thread
            errors.append(exc)

    t = threading.Thread(target=work, name="dynatune-import-tvm", daemon=True)
    t.start()
    t.join()
    if errors:
        raise errors[0]


def run_pipeline(cfg) -> dict:
    t_start = time.perf_counter()
    os.makedirs(cfg.work_dir, exist_ok=True)
    lock = WorkDirLock(cfg.work_dir).acquire(wait_s=2.0)
    tuner = tracker = None
    try:
        check_same_run(cfg.work_dir, cfg.config_hash())  # before anything in the work dir is written
        atomic_write_json(os.path.join(cfg.work_dir, "config.json"), cfg.to_dict())
        model = import_model(cfg)
        target, tasks, cache_hit = extract(model, cfg)
        import_tvm_intrinsics()
        _emit("tasks", {"model": model.name, "tasks": len(tasks), "cache_hit": cache_hit})
        session = TuningSession(tasks, target, cfg.work_dir, search=cfg.search_config(),
                                measure=cfg.measure_config())
        if cfg.warm_start:
            from dynatune.warmstart import warm_start

            _emit("warm_start", warm_start(session, cfg.warm_start))
        tuner = Tuner(session, cfg.scheduler.name, budget_s=cfg.budget_s, slot_s=cfg.slot_s,
                      seed=cfg.scheduler.seed, scheduler_params=cfg.scheduler.params)
        tracker = Tracker(cfg, model, tuner.run_state.get("mlflow_run_id"))
        tuner.save_run_state(config_hash=cfg.config_hash(), mlflow_run_id=tracker.run_id)
        _write_task_table(cfg.work_dir, tasks, session)
        est0 = measure_defaults(tuner)
        if not (tracker.resumed and tracker.has_metric("untuned_estimate_ms")):  # step 0 is logged once per run
            # only as its own metric: estimated_latency_ms at step r is the estimate after round r, one
            # value per step, so the MLflow UI's curves have no double point at step 0
            tracker.log_metrics({"untuned_estimate_ms": est0 * 1e3}, step=0)
        for t in tasks:  # a task whose untuned schedule does not build or run is never tuned: say why
            st = session.state(t.index)
            if st.note and st.default_s is not None and not math.isfinite(st.default_s):
                tracker.set_tags({f"retired.task{t.index}": f"{t.name}: {st.note}"})
                _emit("retired", {"task": t.index, "task_name": t.name, "note": st.note})
        _emit("start", {"estimate_s": est0, "budget_s": cfg.budget_s, "elapsed_s": tuner.elapsed_s,
                        "rounds_done": tuner.rounds_done, "resumed": tracker.resumed, "run_id": tracker.run_id})
        failures = 0
        while not tuner.done():
            try:
                rec = tune_round(tuner, tuner.rounds_done)
                failures = 0
            except Exception as exc:  # retried already; a failed round does not end the flow
                failures += 1
                _emit("round_failed", {"error": str(exc).splitlines()[0][:200] if str(exc) else type(exc).__name__})
                if failures >= MAX_FAILED_ROUNDS:
                    raise
                continue
            if rec is None:
                break
            tracker.log_round(rec)
            _emit("round", rec)
            if rec.result.get("exhausted") and rec.result.get("note"):  # retired this round (log_round tags it)
                _emit("retired", {"task": rec.task, "task_name": rec.task_name, "note": rec.result["note"]})
        tuning_wall = time.perf_counter() - t_start
        artifact = os.path.join(cfg.work_dir, "model.so")
        report = compile_verify(model, target, session, cfg, artifact) if cfg.compile.verify else None
        summary = _summary(cfg, model, tasks, tuner, report, tracker, time.perf_counter() - t_start)
        _finish(cfg, tracker, tuner, tasks, summary)
        _emit("done", summary)
        if report is not None and not report.numerics_ok:
            tracker.finish("FAILED")
            from dynatune.errors import DynatuneError

            raise DynatuneError(f"compiled model does not match ONNX Runtime: max relative error "
                                f"{report.max_rel_err:.2e} > {cfg.compile.rel_tol:g}", "see the report in " + cfg.work_dir)
        tracker.finish()
        del tuning_wall
        return summary
    except BaseException:
        if tracker is not None:
            try:
                tracker.finish("FAILED")
            except Exception:
                pass
        raise
    finally:
        if tuner is not None:
            tuner.close()
        lock.release()


def _write_task_table(work_dir, tasks, session) -> None:
    atomic_write_json(os.path.join(work_dir, "tasks.json"), [t.as_dict() for t in tasks])


def _summary(cfg, model, tasks, tuner, report, tracker, wall_s) -> dict:
    trials = sum(r["result"]["trials"] for r in tuner.rounds)
    s = {
        "model": model.name, "model_sha256": model.sha256, "model_version": cfg.model.version,
        "scheduler": cfg.scheduler.name, "tasks": len(tasks), "rounds": len(tuner.rounds), "trials": trials,
        "budget_s": cfg.budget_s, "elapsed_s": round(tuner.elapsed_s, 3), "wall_s": round(wall_s, 3),
        "estimated_latency_ms": tuner.session.estimated_latency() * 1e3,
        "initial_estimated_latency_ms": sum(t.weight * (tuner.session.state(t.index).default_s or 0.0)
                                            for t in tasks) * 1e3,
        "latency_ms": None, "untuned_latency_ms": None, "onnxruntime_latency_ms": None, "max_rel_err": None,
        "max_abs_err": None, "numerics_ok": None, "artifact": None,
        "ratio_vs_onnxruntime": None, "ratio_vs_onnxruntime_min": None, "ratio_vs_onnxruntime_max": None,
        "mlflow_run_id": tracker.run_id, "mlflow_tracking_uri": tracker.uri, "work_dir": cfg.work_dir,
        "tracking_s": round(tracker.log_seconds, 3), "dynatune_version": __version__,
        "retired_tasks": {t.name: tuner.session.state(t.index).note for t in tasks
                          if tuner.session.state(t.index).note},  # why tasks stopped being tuned
    }
    if report is not None:
        s.update(latency_ms=report.latency_ms, untuned_latency_ms=report.untuned_latency_ms,
                 onnxruntime_latency_ms=report.onnxruntime_latency_ms, max_rel_err=report.max_rel_err,
                 max_abs_err=report.max_abs_err, numerics_ok=report.numerics_ok, artifact=report.artifact,
                 ratio_vs_onnxruntime=report.ratio_vs_onnxruntime,
                 ratio_vs_onnxruntime_min=report.ratio_vs_onnxruntime_min,
                 ratio_vs_onnxruntime_max=report.ratio_vs_onnxruntime_max)
        if report.untuned_latency_ms:
            s["speedup_vs_untuned"] = report.untuned_latency_ms / report.latency_ms
        if report.onnxruntime_latency_ms:
            s["speedup_vs_onnxruntime"] = report.onnxruntime_latency_ms / report.latency_ms
    return s


def _finish(cfg, tracker, tuner, tasks, summary) -> None:
    from dynatune import report as rp

    wd = cfg.work_dir
    out = os.path.join(wd, "report")
    os.makedirs(out, exist_ok=True)
    initial = summary["initial_estimated_latency_ms"] / 1e3
    rp.convergence_plot({cfg.scheduler.name: rp.curve_from_rounds(tuner.rounds, initial)},
                        os.path.join(out, "convergence.png"), title=f"{summary['model']} ({cfg.scheduler.name})")
    ctx = tuner.context()
    table = {b.task: b for b in tuner.belief_table()}
    rp.belief_plot([{"name": t.name, "weight": t.weight, "default_s": t.default_s,
                     "history": t.history, "gain_mean_s": table[t.index].gain_mean_s if t.index in table else 0.0,
                     "gain_std_s": table[t.index].gain_std_s if t.index in table else 0.0, "slot_s": cfg.slot_s}
                    for t in ctx.tasks], os.path.join(out, "beliefs.png"))
    rp.markdown_report(summary, tuner.rounds, os.path.join(out, "report.md"))
    atomic_write_json(os.path.join(out, "summary.json"), summary)
    metrics = {k: summary.get(k) for k in ("latency_ms", "untuned_latency_ms", "onnxruntime_latency_ms",
                                             "max_rel_err", "max_abs_err", "speedup_vs_untuned",
                                             "speedup_vs_onnxruntime", "estimated_latency_ms", "wall_s",
                                             "ratio_vs_onnxruntime", "ratio_vs_onnxruntime_min",
                                             "ratio_vs_onnxruntime_max")}
    metrics["numerics_ok"] = 1.0 if summary.get("numerics_ok") else 0.0
    tracker.log_metrics(metrics, step=len(tuner.rounds))
    tracker.log_dict(summary, "summary.json")
    tracker.log_dict([t.as_dict() for t in tasks], "tasks.json")
    tracker.log_artifact(out, "report")
    tracker.log_artifact(os.path.join(wd, "db"), "tuning_db")
    if summary.get("artifact"):
        tracker.log_artifact(summary["artifact"], "compiled")
    summary["tracking_s"] = round(tracker.log_seconds, 3)
    summary["mlflow_ui"] = tracker.ui_hint()
    atomic_write_json(os.path.join(out, "summary.json"), summary)
