"""TVM's thread pool settings and the side-by-side timing: one compiled model against ONNX Runtime in this
process, with TVM's pool as the environment sets it.

    TVM_NUM_THREADS=1 python bench/thread_pool.py MODEL.so MODEL.onnx        # TVM alone would use 1 of 2
    TVM_THREAD_POOL_SPIN_COUNT=300000 python bench/thread_pool.py MODEL.so MODEL.onnx  # TVM's own spin
    python bench/thread_pool.py MODEL.so MODEL.onnx [--pause 0.05] [--rounds 9]       # dynatune's settings

Prints each side's median and ONNX Runtime's time per round: a spinning TVM pool shows as erratic ONNX
Runtime rounds, the slow ones right after TVM's block.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("artifact")
    ap.add_argument("onnx")
    ap.add_argument("--pause", type=float, default=0.05, help="seconds between the two sides' blocks")
    ap.add_argument("--rounds", type=int, default=9)
    args = ap.parse_args()

    import tvm

    from dynatune.compiler.execution import load, onnxruntime_session
    from dynatune.compiler.timing import time_side_by_side
    from dynatune.machine.target import usable_cores
    from dynatune.model.importer import load_model

    model = load_model(args.onnx, {})
    dev = tvm.cpu()
    sess = onnxruntime_session(model, usable_cores())
    t = time_side_by_side(
        load(args.artifact, dev), sess, model.random_inputs(0), dev, rounds=args.rounds, pause_s=args.pause
    )
    env = {k: os.environ.get(k) for k in ("TVM_NUM_THREADS", "TVM_THREAD_POOL_SPIN_COUNT")}
    print(
        f"{env} pause {args.pause}s: TVM {statistics.median(t.tvm_ms):.3f} ms, ONNX Runtime "
        f"{statistics.median(t.ort_ms):.3f} ms, ratio {t.ratio_median:.3f}; ONNX Runtime's rounds "
        + " ".join(f"{x:.2f}" for x in t.ort_ms)
    )


if __name__ == "__main__":
    main()
