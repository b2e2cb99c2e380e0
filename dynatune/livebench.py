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

from .model import parse_shape
from .pipeline import TuningRun
from .replay import time_to_quality, ttq_ratio
from .target import usable_cores


def live_config(path: str, shapes: dict, scheduler: str, budget: float, slot: float, work: str,
                trials_per_iter: int):
    """One live run's config: the defaults, with the run's scheduler, budget, slot and batch size."""
    from .config import load_config

    return load_config(None, [f"slot_s={slot}", f"search.trials_per_iter={trials_per_iter}",
                              "compile.measure_untuned=false", "compile.measure_onnxruntime=false"],
                       model=path, shapes=shapes or None, budget=budget, scheduler=scheduler, work_dir=work)


def run_one(cfg) -> dict:
    """Tune and compile with the library's pipeline pieces; the estimated-latency curve of every round."""
    with TuningRun(cfg) as r:
        curve = [(0.0, r.untuned_estimate_s)]
        t0 = time.perf_counter()
        curve += r.tuner.run_rounds()
        wall = time.perf_counter() - t0
        rep = r.compile()
        trials = sum(x["result"]["trials"] for x in r.tuner.rounds)
        rounds = len(r.tuner.rounds)
    return {"scheduler": cfg.scheduler.name, "curve": curve, "rounds": rounds, "trials": trials,
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
    os.makedirs(args.out, exist_ok=True)
    results = {}
    for path in args.model:
        name = os.path.splitext(os.path.basename(path))[0]
        runs = {}
        for sch in args.schedulers:
            work = os.path.join(args.out, f"{name}-{sch}")
            if os.path.exists(work):
                import shutil

                shutil.rmtree(work)
            runs[sch] = run_one(live_config(path, dict(parse_shape(x) for x in args.shape), sch, args.budget,
                                            args.slot, work, args.trials_per_iter))
            print(f"{name} {sch}: {runs[sch]['estimated_ms']:.3f} ms estimated, "
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
        results[name] = {"runs": runs, "target_ms": ref * 1e3, "censored": censored, **ratios}
        from .report import convergence_plot

        convergence_plot({k: v["curve"] for k, v in runs.items()}, os.path.join(args.out, f"{name}.png"),
                         title=f"{name}: budget {args.budget:.0f} s, slot {args.slot:.0f} s")
    doc = {"budget_s": args.budget, "slot_s": args.slot, "models": results,
           "date": time.strftime("%Y-%m-%d"), "cores": usable_cores()}
    with open(os.path.join(args.out, "live.json"), "w") as f:
        json.dump(doc, f, indent=1, default=lambda x: None)
    print(json.dumps({m: {k: v for k, v in r.items() if k != "runs"} for m, r in results.items()}))
    return 0
