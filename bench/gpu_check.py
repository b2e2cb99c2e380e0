"""Check the CUDA target end to end on a machine with an NVIDIA GPU (not part of CI).

    python bench/gpu_check.py            # tiny conv net: extract, defaults, tune 2 tasks, compile, verify

Prints one JSON object: tasks, default and tuned latencies, compiled latency, numerics vs ONNX Runtime.
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
import time

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.join(ROOT, "tests"))
os.environ["PYTHONPATH"] = ROOT + os.pathsep + os.environ.get("PYTHONPATH", "")


def main() -> None:
    from helpers import make_tiny_onnx

    from dynatune.machine.target import describe
    from dynatune.run.config import load_config
    from dynatune.run.pipeline import TuningRun

    out = {}
    t0 = time.time()
    work = tempfile.mkdtemp()
    model = make_tiny_onnx(os.path.join(work, "tiny.onnx"), batch=1, channels=32)
    cfg = load_config(
        None,
        [
            f"target={sys.argv[1] if len(sys.argv) > 1 else 'cuda'}",
            "search.trials_per_iter=8",
            "search.population_size=64",
        ],
        model=model,
        work_dir=os.path.join(work, "w"),
    )
    with TuningRun(cfg) as r:
        out["target"] = describe(r.target)
        out["tasks"] = [t.name for t in r.tasks]
        out["default_ms"] = {t.name: r.session.state(t.index).default_s * 1e3 for t in r.tasks}
        rounds = []
        for i in range(min(2, len(r.tasks))):
            x = r.session.tune(i, trials=16)
            rounds.append(
                {
                    "task": x.task_name,
                    "trials": x.trials,
                    "build_errors": x.build_errors,
                    "run_errors": x.run_errors,
                    "before_ms": x.best_before_s * 1e3,
                    "after_ms": x.best_after_s * 1e3,
                    "errors": x.errors[:2],
                }
            )
        out["rounds"] = rounds
        out["compile"] = r.compile().as_dict()
    out["wall_s"] = time.time() - t0
    print(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
