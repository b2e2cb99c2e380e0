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

    from dynatune.compile import compile_and_verify
    from dynatune.measure import MeasureConfig
    from dynatune.model import load_model
    from dynatune.session import SearchConfig, TuningSession
    from dynatune.target import describe, make_target
    from dynatune.tasks import extract_tasks

    out = {}
    t0 = time.time()
    target = make_target(sys.argv[1] if len(sys.argv) > 1 else "cuda")
    out["target"] = describe(target)
    work = tempfile.mkdtemp()
    model = load_model(make_tiny_onnx(os.path.join(work, "tiny.onnx"), batch=1, channels=32))
    tasks = extract_tasks(model, target)
    out["tasks"] = [t.name for t in tasks]
    sess = TuningSession(tasks, target, os.path.join(work, "w"),
                         search=SearchConfig(trials_per_iter=8, population_size=64), measure=MeasureConfig())
    sess.warm_up()
    d = sess.measure_defaults()
    out["default_ms"] = {tasks[i].name: v * 1e3 for i, v in d.items()}
    rounds = []
    for i in range(min(2, len(tasks))):
        r = sess.tune(i, trials=16)
        rounds.append({"task": r.task_name, "trials": r.trials, "build_errors": r.build_errors,
                       "run_errors": r.run_errors, "before_ms": r.best_before_s * 1e3, "after_ms": r.best_after_s * 1e3,
                       "errors": r.errors[:2]})
    out["rounds"] = rounds
    rep = compile_and_verify(model, target, sess.compile_database(), os.path.join(work, "model.so"), threads=4,
                             repeat=5)
    out["compile"] = rep.as_dict()
    sess.close()
    out["wall_s"] = time.time() - t0
    print(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
