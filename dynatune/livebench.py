"""Live scheduler benchmark: real tuning, same budget, several schedulers, one after another.

    dynatune bench live --model M.onnx [--model M2.onnx] --budget 900 --slot 20 \
        --schedulers dynatune gradient round_robin --out bench/results/live

Each (model, scheduler) pair tunes from scratch in its own work directory with the same budget, slot and
search settings, so only the task choice differs. Reported per model: the estimated-latency curves
(JSON + one PNG), each scheduler's final estimate, the measured latency of its compiled model, and the
time each scheduler needed to reach the gradient rule's final quality (TTQ) with the ratios.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import time

from .compile import compile_and_verify
from .measure import MeasureConfig
from .model import load_model, parse_shape
from .session import SearchConfig, TuningSession
from .target import make_target, usable_cores
from .tasks import extract_tasks
from .replay import time_to_quality, ttq_ratio
from .tuner import Tuner


def run_one(model, tasks, target, scheduler: str, budget: float, slot: float, work: str, search, measure) -> dict:
    sess = TuningSession(tasks, target, work, search=search, measure=measure)
    tuner = Tuner(sess, scheduler, budget_s=budget, slot_s=slot)
    est0 = tuner.prepare()
    curve = [(0.0, est0)]
    t0 = time.perf_counter()
    curve += tuner.run_rounds()
    wall = time.perf_counter() - t0
    rep = compile_and_verify(model, target, sess.compile_database(), os.path.join(work, "model.so"),
                             threads=usable_cores(), measure_untuned=False, measure_onnxruntime=False)
    trials = sum(r["result"]["trials"] for r in tuner.rounds)
    tuner.close()
    return {"scheduler": scheduler, "curve": curve, "rounds": len(tuner.rounds), "trials": trials,
            "tuning_wall_s": wall, "estimated_ms": curve[-1][1] * 1e3, "latency_ms": rep.latency_ms,
            "numerics_ok": rep.numerics_ok}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="dynatune bench live")
    ap.add_argument("--model", action="append", required=True)
    ap.add_argument("--shape", action="append", default=[])
    ap.add_argument("--budget", type=float, default=900)
    ap.add_argument("--slot", type=float, default=20)
    ap.add_argument("--schedulers", nargs="+", default=["dynatune", "gradient", "round_robin"])
    ap.add_argument("--trials-per-iter", type=int, default=16)
    ap.add_argument("--out", default="bench/results/live")
    args = ap.parse_args(argv)
    target = make_target()
    os.makedirs(args.out, exist_ok=True)
    results = {}
    for path in args.model:
        model = load_model(path, dict(parse_shape(s) for s in args.shape))
        tasks = extract_tasks(model, target)
        runs = {}
        for sch in args.schedulers:
            work = os.path.join(args.out, f"{model.name}-{sch}")
            if os.path.exists(work):
                import shutil

                shutil.rmtree(work)
            runs[sch] = run_one(model, tasks, target, sch, args.budget, args.slot, work,
                                SearchConfig(trials_per_iter=args.trials_per_iter), MeasureConfig())
            print(f"{model.name} {sch}: {runs[sch]['estimated_ms']:.3f} ms estimated, "
                  f"{runs[sch]['latency_ms']:.3f} ms measured, {runs[sch]['rounds']} rounds", flush=True)
        ref = runs.get("gradient", next(iter(runs.values())))["curve"][-1][1]
        ttq = {k: time_to_quality(r["curve"], ref) for k, r in runs.items()}
        censored = [k for k, v in ttq.items() if math.isinf(v)]  # never reached: counted as the whole budget
        for k, r in runs.items():
            r["ttq_to_gradient_final_s"] = None if math.isinf(ttq[k]) else ttq[k]
        ratios = {}
        if "dynatune" in runs:
            for other in ("gradient", "round_robin"):
                if other in runs:
                    ratios[f"ttq_vs_{other}"] = ttq_ratio(ttq[other], ttq["dynatune"], args.budget)
        results[model.name] = {"runs": runs, "target_ms": ref * 1e3, "censored": censored, **ratios}
        from .report import convergence_plot

        convergence_plot({k: v["curve"] for k, v in runs.items()}, os.path.join(args.out, f"{model.name}.png"),
                         title=f"{model.name}: budget {args.budget:.0f} s, slot {args.slot:.0f} s")
    doc = {"budget_s": args.budget, "slot_s": args.slot, "models": results,
           "date": time.strftime("%Y-%m-%d"), "cores": usable_cores()}
    with open(os.path.join(args.out, "live.json"), "w") as f:
        json.dump(doc, f, indent=1, default=lambda x: None)
    print(json.dumps({m: {k: v for k, v in r.items() if k != "runs"} for m, r in results.items()}))
    return 0
