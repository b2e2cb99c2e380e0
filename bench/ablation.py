"""AdaTune ablation: fixed protocol vs adaptive evaluator vs all three (adaptive + ensemble + contextual).

    python bench/ablation.py ../shared/models/squeezenet1_1.onnx --budget 300 --slot 15

Same model, budget, slot and scheduler (round-robin, so only measurement/search differ) for each variant.
Reported per variant: measurement seconds per trial, trials in the budget, the time to reach the fixed
protocol's final estimated latency (TTQ), and the chosen best schedules' true latency: every task's best
record re-measured with a long fixed protocol (10 repeats of >= 50 ms), summed as weight x latency.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import tempfile

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

from dynatune.bench.replay import time_to_quality  # noqa: E402
from dynatune.run.config import load_config  # noqa: E402
from dynatune.run.pipeline import TuningRun  # noqa: E402
from dynatune.search.measure import MeasureConfig  # noqa: E402

VARIANTS = {  # config overrides per variant
    "fixed": [],
    "adaptive": ["measure.adaptive=true"],
    "adaptive+ensemble+contextual": [
        "measure.adaptive=true",
        "search.cost_model=ensemble",
        "search.contextual_exploration=true",
    ],
}


def remeasure(sess, tasks) -> float:
    """Sum of weight x latency of each task's chosen schedule, measured with a long fixed protocol."""
    from tvm.s_tir import Schedule
    from tvm.s_tir.meta_schedule.arg_info import ArgInfo
    from tvm.s_tir.meta_schedule.search_strategy import MeasureCandidate

    from dynatune.search.measure import Runner

    long_cfg = MeasureConfig(repeat=10, min_repeat_ms=50)
    sess.runner.close()
    sess.runner = Runner(long_cfg, sess.target)
    db = sess.compile_database()
    total = 0.0
    cands = []
    for t in tasks:
        wl = db.commit_workload(t.mod)
        top = db.get_top_k(wl, 1)
        if top:
            cands.append(top[0].as_measure_candidate())
        else:
            cands.append(MeasureCandidate(Schedule(t.mod), ArgInfo.from_prim_func(t.mod["main"])))
    results, _, _ = sess._build_and_run(cands, tasks=tasks)
    for t, r in zip(tasks, results):
        secs = [float(s) for s in r.run_secs] if r.run_secs is not None else [float("inf")]
        total += t.weight * sum(secs) / len(secs)
    return total


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("model", nargs="+")
    ap.add_argument("--budget", type=float, default=300)
    ap.add_argument("--slot", type=float, default=15)
    ap.add_argument("--scheduler", default="round_robin")
    ap.add_argument("--out", default=os.path.join(os.path.dirname(__file__), "results", "ablation.json"))
    args = ap.parse_args()
    out = {}
    for path in args.model:
        name = os.path.splitext(os.path.basename(path))[0]
        res = {}
        for variant, overrides in VARIANTS.items():
            cfg = load_config(
                None,
                [f"slot_s={args.slot}", "library.enabled=false", "stopping.enabled=false", *overrides],
                model=path,
                budget=args.budget,
                scheduler=args.scheduler,
                work_dir=tempfile.mkdtemp(prefix="abl-"),
            )
            with TuningRun(cfg) as r:
                curve = [(0.0, r.untuned_estimate_s)]
                results = []
                curve += r.tuner.run_rounds(lambda rec: results.append(rec.result))
                true_s = remeasure(r.session, r.tasks)
                expl = getattr(
                    getattr(r.session.cost_model, "_inst", r.session.cost_model), "exploration_log", None
                )
            meas = sum(x["measure_s"] for x in results)
            trials = sum(x["trials"] for x in results)
            repeats = sum(x["repeats"] for x in results)
            saved = sum(x["repeats_saved"] for x in results)
            stops: dict = {}
            for x in results:
                for k, v in x.get("stops", {}).items():
                    stops[k] = stops.get(k, 0) + v
            res[variant] = {
                "trials": trials,
                "measure_s_per_trial": meas / max(1, trials),
                "repeats_per_trial": repeats / max(1, trials),
                "repeats_saved": saved,
                "stops": stops,
                "final_estimate_ms": curve[-1][1] * 1e3,
                "true_latency_ms": true_s * 1e3,
                "curve": curve,
                "exploration_log": expl[-5:] if expl else None,
            }
            print(
                name, variant, json.dumps({k: v for k, v in res[variant].items() if k != "curve"}), flush=True
            )
        ref = res["fixed"]["final_estimate_ms"] / 1e3
        for v in res.values():
            t = time_to_quality(v["curve"], ref)
            v["ttq_s"] = None if math.isinf(t) else t
        out[name] = res
    with open(args.out, "w") as f:
        json.dump(
            {"budget_s": args.budget, "slot_s": args.slot, "scheduler": args.scheduler, "models": out},
            f,
            indent=1,
        )
    print(
        json.dumps(
            {
                m: {k: {kk: vv for kk, vv in v.items() if kk != "curve"} for k, v in r.items()}
                for m, r in out.items()
            }
        )
    )


if __name__ == "__main__":
    main()
