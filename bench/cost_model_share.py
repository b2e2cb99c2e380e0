"""What the search's cost model takes of a whole tuning run: features, training, prediction (issue #29).

    python bench/cost_model_share.py --config /tmp/bench_cfg.yaml \
        --model ../shared/models/squeezenet1_1.onnx --budget 240 --json bench/results/cost_model_share.json

Runs the pipeline in this process (this checkout, the configured cost model: ``xgb`` by default; the
compile's verification, timings and profile off: only the tuning is of interest) with MetaSchedule's
pieces timed where the search calls them:

- features: the per-store feature extractor, on the candidates the cache (``dynatune.search.features``)
  has not seen; and the structural hashes that key that cache (and dedup the sampled first batches);
- training: ``XGBModel._train`` (run when a prediction finds the model stale);
- prediction: the whole ``predict`` call, and XGBoost's own share of it.

Reported in seconds and as shares of the tuning seconds (the rounds' wall time), with the counts.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from collections import defaultdict

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

SECONDS: dict = defaultdict(float)
CALLS: dict = defaultdict(int)


def _timed(fn, label: str, count=lambda args: 1):
    def wrapper(*args, **kwargs):
        t0 = time.perf_counter()
        try:
            return fn(*args, **kwargs)
        finally:
            SECONDS[label] += time.perf_counter() - t0
            CALLS[label] += count(args)

    return wrapper


def instrument() -> None:
    """Time the cost model's pieces (before the session makes its cost model and extractor)."""
    import tvm.s_tir.meta_schedule.feature_extractor as fe
    import tvm_ffi
    from tvm.ir.utils import derived_object
    from tvm.s_tir.meta_schedule.cost_model.xgb_model import XGBModel

    import dynatune.search.xgb_model as xm

    base = XGBModel._cls
    base._train = _timed(base._train, "training")
    base._predict = _timed(base._predict, "prediction: XGBoost")
    xm.xgb_model(num_warmup_samples=0)  # builds dynatune's subclass, whose predict is timed whole
    model_class = xm._MODEL_CLASS._cls
    model_class.predict = _timed(model_class.predict, "prediction: whole call", lambda a: len(a[2]))
    hashes = "structural hashes (the feature cache's keys; first batches' dedup)"
    tvm_ffi.structural_hash = _timed(tvm_ffi.structural_hash, hashes)
    create = fe.FeatureExtractor.create

    def timed_create(kind, *args, **kwargs):
        inner = create(kind, *args, **kwargs)

        @derived_object
        class TimedExtractor(fe.PyFeatureExtractor):
            def extract_from(self, context, candidates):
                t0 = time.perf_counter()
                try:
                    return inner.extract_from(context, candidates)
                finally:
                    SECONDS["features: extraction (cache misses)"] += time.perf_counter() - t0
                    CALLS["features: extraction (cache misses)"] += len(candidates)

        return TimedExtractor()

    fe.FeatureExtractor.create = staticmethod(timed_create)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--config")
    ap.add_argument("--model", required=True)
    ap.add_argument("--budget", type=float, default=240.0)
    ap.add_argument("--set", action="append", default=[], help="KEY=VALUE, as dynatune tune --set")
    ap.add_argument("--json", help="append the result to this file (a JSON list)")
    args = ap.parse_args()
    instrument()
    from dynatune.run.config import load_config
    from dynatune.run.pipeline import run

    work = tempfile.mkdtemp(prefix="cost-model-share-")
    off = ["verify", "profile", "measure_untuned", "measure_onnxruntime"]
    overrides = [f"compile.{k}=false" for k in off] + [f"work_dir={work}"] + args.set
    cfg = load_config(args.config, overrides, model=args.model, budget=args.budget)
    summary = run(cfg)
    rounds = [json.loads(line) for line in open(os.path.join(work, "rounds.jsonl"))]
    tuning_s = sum(r["wall_s"] for r in rounds)
    out = {
        "model": os.path.basename(args.model),
        "budget_s": args.budget,
        "settings": args.set,
        "candidates": summary.trials,
        "tuning_s": tuning_s,
        "pieces": {
            k: {"seconds": s, "share": s / tuning_s, "count": CALLS[k]} for k, s in sorted(SECONDS.items())
        },
    }
    print(json.dumps(out, indent=1))
    if args.json:
        done = json.load(open(args.json)) if os.path.exists(args.json) else []
        json.dump(done + [out], open(args.json, "w"), indent=1)


if __name__ == "__main__":
    main()
