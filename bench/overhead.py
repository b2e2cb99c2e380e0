"""Share of wall time spent in Prefect and MLflow, against the same tuning driven without them.

    python bench/overhead.py ../shared/models/squeezenet1_1.onnx --budget 600 --slot 20

Runs the same config twice on fresh work dirs: (A) the real pipeline (Prefect flow in local ephemeral
mode + MLflow on SQLite), (B) the library alone (Tuner loop + compile_and_verify, no Prefect, no MLflow).
Both tune for the same budget, so the difference in wall time is the orchestration and tracking cost.
Also reports the directly measured MLflow seconds and the per-round Prefect task overhead.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import time

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))


def library_only(cfg) -> dict:
    from dynatune.compile import compile_and_verify
    from dynatune.model import load_model
    from dynatune.session import TuningSession
    from dynatune.target import make_target, usable_cores
    from dynatune.tasks import extract_tasks
    from dynatune.tuner import Tuner

    t0 = time.perf_counter()
    model = load_model(cfg.model.path, cfg.model.shapes)
    target = make_target(cfg.target)
    tasks = extract_tasks(model, target)
    sess = TuningSession(tasks, target, cfg.work_dir, search=cfg.search_config(), measure=cfg.measure_config())
    tuner = Tuner(sess, cfg.scheduler.name, budget_s=cfg.budget_s, slot_s=cfg.slot_s)
    tuner.prepare()
    steps = 0.0
    while not tuner.done():
        s0 = time.perf_counter()
        if tuner.step() is None:
            break
        steps += time.perf_counter() - s0
    compile_and_verify(model, target, sess.compile_database(), os.path.join(cfg.work_dir, "model.so"),
                       threads=usable_cores())
    rounds = len(tuner.rounds)
    tuner.close()
    return {"wall_s": time.perf_counter() - t0, "rounds": rounds, "round_s": steps}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("model")
    ap.add_argument("--budget", type=float, default=600)
    ap.add_argument("--slot", type=float, default=20)
    args = ap.parse_args()
    from dynatune.cli import _quiet_env

    _quiet_env()
    from dynatune.config import load_config

    out = {}
    for mode in ("pipeline", "library"):
        work = tempfile.mkdtemp(prefix=f"overhead-{mode}-")
        cfg = load_config(None, [f"slot_s={args.slot}"], model=args.model, budget=args.budget, work_dir=work)
        t0 = time.perf_counter()
        if mode == "pipeline":
            import flows.tune_model as ftm

            s = ftm.tune_model(cfg.to_dict())
            out[mode] = {"wall_s": time.perf_counter() - t0, "rounds": s["rounds"], "mlflow_s": s["tracking_s"]}
        else:
            out[mode] = library_only(cfg)
        print(mode, json.dumps(out[mode]), flush=True)
        shutil.rmtree(work, ignore_errors=True)
    a, b = out["pipeline"], out["library"]
    out["overhead_s"] = a["wall_s"] - b["wall_s"]
    out["overhead_share"] = out["overhead_s"] / a["wall_s"]
    out["mlflow_share"] = a["mlflow_s"] / a["wall_s"]
    print(json.dumps(out))


if __name__ == "__main__":
    main()
