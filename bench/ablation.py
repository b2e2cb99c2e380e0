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
import time

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

from dynatune.measure import MeasureConfig  # noqa: E402
from dynatune.model import load_model  # noqa: E402
from dynatune.replay import time_to_quality  # noqa: E402
from dynatune.session import SearchConfig, TuningSession  # noqa: E402
from dynatune.target import make_target  # noqa: E402
from dynatune.tasks import extract_tasks  # noqa: E402
from dynatune.tuner import Tuner  # noqa: E402

VARIANTS = {
    "fixed": (MeasureConfig(), SearchConfig()),
    "adaptive": (MeasureConfig(adaptive=True), SearchConfig()),
    "adaptive+ensemble+contextual": (MeasureConfig(adaptive=True),
                                     SearchConfig(cost_model="ensemble", contextual_exploration=True)),
}


def remeasure(sess, tasks) -> float:
    """Sum of weight x latency of each task's chosen schedule, measured with a long fixed protocol."""
    from tvm.s_tir.meta_schedule.search_strategy import MeasureCandidate
    from tvm.s_tir import Schedule
    from tvm.s_tir.meta_schedule.arg_info import ArgInfo

    from dynatune.measure import Runner

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
    target = make_target()
    out = {}
    for path in args.model:
        model = load_model(path)
        tasks = extract_tasks(model, target)
        res = {}
        for name, (mcfg, scfg) in VARIANTS.items():
            sess = TuningSession(tasks, target, tempfile.mkdtemp(prefix="abl-"), search=scfg, measure=mcfg)
            tuner = Tuner(sess, args.scheduler, budget_s=args.budget, slot_s=args.slot)
            curve = [(0.0, tuner.prepare())]
            results = []
            curve += tuner.run_rounds(lambda rec: results.append(rec.result))
            meas = sum(r["measure_s"] for r in results)
            trials = sum(r["trials"] for r in results)
            repeats = sum(r["repeats"] for r in results)
            saved = sum(r["repeats_saved"] for r in results)
            stops: dict = {}
            for r in results:
                for k, v in r.get("stops", {}).items():
                    stops[k] = stops.get(k, 0) + v
            true_s = remeasure(sess, tasks)
            expl = getattr(getattr(sess.cost_model, "_inst", sess.cost_model), "exploration_log", None)
            tuner.close()
            res[name] = {"trials": trials, "measure_s_per_trial": meas / max(1, trials),
                         "repeats_per_trial": repeats / max(1, trials), "repeats_saved": saved, "stops": stops,
                         "final_estimate_ms": curve[-1][1] * 1e3, "true_latency_ms": true_s * 1e3,
                         "curve": curve, "exploration_log": expl[-5:] if expl else None}
            print(model.name, name, json.dumps({k: v for k, v in res[name].items() if k != "curve"}), flush=True)
        ref = res["fixed"]["final_estimate_ms"] / 1e3
        for v in res.values():
            t = time_to_quality(v["curve"], ref)
            v["ttq_s"] = None if math.isinf(t) else t
        out[model.name] = res
    with open(args.out, "w") as f:
        json.dump({"budget_s": args.budget, "slot_s": args.slot, "scheduler": args.scheduler, "models": out}, f, indent=1)
    print(json.dumps({m: {k: {kk: vv for kk, vv in v.items() if kk != "curve"} for k, v in r.items()}
                      for m, r in out.items()}))


if __name__ == "__main__":
    main()
