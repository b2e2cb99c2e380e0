"""Warm start across model versions: time to the previous quality when one layer changed.

    python -m bench.warm_start_ttq ../shared/models/squeezenet1_1.onnx --budget 300 --slot 15 \\
        [--warm-budget 150] [--layer /features/features.12/expand3x3/Conv]

v1 is the given model. v2 is v1 with one layer changed: a 3x3 convolution (``--layer``; by default the
last fire module's 3x3 expand convolution, ``features.12/expand3x3``) becomes a 5x5 convolution with new
weights (padding 2, so every other shape stays the same). In squeezenet1_1 that convolution shared its
task with ``features.11``'s, so v2 has one new operator task and one task whose weight dropped from 2 to 1;
every other task keeps its key.

Three runs, same scheduler, slot and target, each on a fresh work dir (the library's pipeline set-up,
:class:`dynatune.run.pipeline.TuningRun`, no Prefect or MLflow, so only tuning seconds count):

1. v1 from scratch for ``--budget`` seconds (the original tuning);
2. v2 from scratch for ``--budget`` seconds: its final estimated latency is "the previous quality" for v2
   (what the original tuning time buys on this version);
3. v2 warm-started from run 1's work dir, for ``--warm-budget`` seconds.

Every run states what it compares on: the schedule library off (only the warm start carries tuning over)
and stopping off (every run spends its budget); the results keep each run's measurement and search
settings. Reported: the warm run's time to reach run 2's final estimate (TTQ), as a share of the original
tuning time (the budget) and of the time run 2 itself needed to get there. Target: <= 25 % of the original
time. Results: ``bench/results/warmstart.json``.
"""

from __future__ import annotations

import json
import math
import os
import tempfile
import time

import numpy as np

from bench.harness import parser, results_path, write_json

LAYER = "/features/features.12/expand3x3/Conv"


def change_one_layer(src: str, dst: str, node_name: str = LAYER) -> str:
    """Write v2: the named 3x3 convolution becomes 5x5 (padding 2) with new random weights."""
    import onnx
    from onnx import numpy_helper

    m = onnx.load(src)
    node = next((n for n in m.graph.node if n.name == node_name), None)
    if node is None:
        raise SystemExit(f"{src} has no node {node_name}")
    init = {i.name: i for i in m.graph.initializer}
    w = numpy_helper.to_array(init[node.input[1]])
    o, i = w.shape[:2]
    new = np.random.default_rng(1).normal(0, 0.05, (o, i, 5, 5)).astype(w.dtype)
    init[node.input[1]].CopyFrom(numpy_helper.from_array(new, node.input[1]))
    for a in node.attribute:
        if a.name == "kernel_shape":
            a.ints[:] = [5, 5]
        elif a.name == "pads":
            a.ints[:] = [2, 2, 2, 2]
    onnx.checker.check_model(m)
    onnx.save(m, dst)
    return dst


def run(
    path: str, work: str, budget: float, slot: float, scheduler: str, warm: list[str] | None = None
) -> dict:
    from dynatune.run.config import load_config
    from dynatune.run.pipeline import TuningRun

    cfg = load_config(
        None,
        [f"slot_s={slot}", "library.enabled=false", "stopping.enabled=false"],
        model=path,
        budget=budget,
        scheduler=scheduler,
        work_dir=work,
    )
    cfg.warm_start = list(warm or [])
    with TuningRun(cfg) as r:
        curve = [(0.0, r.untuned_estimate_s)]
        t0 = time.perf_counter()
        curve += r.tuner.run_rounds()
        wall = time.perf_counter() - t0
    return {
        "model": path,
        "tasks": len(r.tasks),
        "keys": [t.key for t in r.tasks],
        "rounds": len(curve) - 1,
        "wall_s": wall,
        "warm_start": r.warm_start,
        "curve": curve,
        "final_ms": curve[-1][1] * 1e3,
        "settings": {k: cfg.to_record()[k] for k in ("measure", "search", "stopping", "library", "slot_s")},
    }


def ttq(curve, target_s: float) -> float | None:
    """Time to quality, None (JSON null) when never reached."""
    from dynatune.bench.replay import time_to_quality

    t = time_to_quality(curve, target_s)
    return None if math.isinf(t) else t


def main(argv=None) -> dict:
    ap = parser(__doc__)
    ap.add_argument("model")
    ap.add_argument("--budget", type=float, default=300)
    ap.add_argument("--warm-budget", type=float, default=None, help="default: half the budget")
    ap.add_argument("--slot", type=float, default=15)
    ap.add_argument("--scheduler", default="dynatune")
    ap.add_argument("--layer", default=LAYER, help="the 3x3 convolution (ONNX node name) v2 makes 5x5")
    ap.add_argument("--out", default=results_path("warmstart.json"))
    args = ap.parse_args(argv)
    tmp = tempfile.mkdtemp(prefix="warmstart-")
    v2 = change_one_layer(args.model, os.path.join(tmp, "v2.onnx"), args.layer)
    v1_run = run(args.model, os.path.join(tmp, "v1"), args.budget, args.slot, args.scheduler)
    print("v1 cold", v1_run["final_ms"], flush=True)
    v2_cold = run(v2, os.path.join(tmp, "v2cold"), args.budget, args.slot, args.scheduler)
    print("v2 cold", v2_cold["final_ms"], flush=True)
    v2_warm = run(
        v2,
        os.path.join(tmp, "v2warm"),
        args.warm_budget or args.budget / 2,
        args.slot,
        args.scheduler,
        warm=[os.path.join(tmp, "v1")],
    )
    print("v2 warm", v2_warm["final_ms"], flush=True)
    target_s = v2_cold["final_ms"] / 1e3
    t_warm, t_cold = ttq(v2_warm["curve"], target_s), ttq(v2_cold["curve"], target_s)
    new_keys = sorted(set(v2_cold["keys"]) - set(v1_run["keys"]))
    out = {
        "model": os.path.basename(args.model),
        "changed_layer": args.layer + " 3x3 -> 5x5",
        "budget_s": args.budget,
        "slot_s": args.slot,
        "scheduler": args.scheduler,
        "settings": v1_run["settings"],
        "tasks_v1": v1_run["tasks"],
        "tasks_v2": v2_cold["tasks"],
        "new_task_keys": new_keys,
        "v1_final_ms": v1_run["final_ms"],
        "v2_cold_final_ms": v2_cold["final_ms"],
        "v2_warm_final_ms": v2_warm["final_ms"],
        "v2_warm_start_ms": v2_warm["curve"][0][1] * 1e3,
        "v2_cold_untuned_ms": v2_cold["curve"][0][1] * 1e3,
        "warm_matched_tasks": v2_warm["warm_start"]["matched_tasks"],
        "ttq_warm_s": t_warm,
        "ttq_cold_s": t_cold,
        "warm_share_of_budget": None if t_warm is None else t_warm / args.budget,
        "warm_share_of_cold_ttq": None if t_warm is None or not t_cold else t_warm / t_cold,
        "curves": {k: r["curve"] for k, r in (("v1", v1_run), ("v2_cold", v2_cold), ("v2_warm", v2_warm))},
    }
    write_json(args.out, out)
    print(json.dumps({k: v for k, v in out.items() if k != "curves"}))
    return out


if __name__ == "__main__":
    main()
