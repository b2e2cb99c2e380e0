"""Measurement protocols on one fixed candidate set: seconds per candidate, repeats per candidate.

    python bench/measure_protocols.py ../shared/models/squeezenet1_1.onnx

Tunes the 3 heaviest tasks for 48 trials each (fixed protocol), builds every record once, then runs the
same candidates through the runner with each protocol (fixed, adaptive with 4 ms and 2 ms repeats, and
timing off = the per-candidate overhead floor).
"""

import os
import sys
import tempfile
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
from tvm.s_tir.meta_schedule.builder import BuilderInput
from tvm.s_tir.meta_schedule.runner import RunnerInput

from dynatune.machine.target import make_target, target_device
from dynatune.model.extract import extract_tasks
from dynatune.model.importer import load_model
from dynatune.search.measure import MeasureConfig, Runner
from dynatune.search.session import TuningSession

target = make_target()
model = load_model(sys.argv[1])
tasks = extract_tasks(model, target)
order = sorted(tasks, key=lambda t: -t.flops * t.weight)[:3]
sess = TuningSession(tasks, target, tempfile.mkdtemp())
sess.warm_up()
for t in order:
    for _ in range(3):
        sess.tune(t.index, trials=16)
groups = []
for t in order:
    wl = sess.db.workload(t.key, t.mod)
    recs = sess.db.memory.get_top_k(wl, 1000)
    cands = [r.as_measure_candidate() for r in recs]
    built = sess.builder.build([BuilderInput(c.sch.mod, target) for c in cands])
    ok = [(c, b) for c, b in zip(cands, built) if b.error_msg is None]
    groups.append((t, ok, sess.best_latency(t.index)))
print("candidates", sum(len(g[1]) for g in groups), flush=True)
dev = target_device(target)
configs = {
    "fixed": MeasureConfig(),
    "adaptive4": MeasureConfig(adaptive=True),
    "adaptive2": MeasureConfig(adaptive=True, adaptive_repeat_ms=2),
    "timing_off": MeasureConfig(repeat=1, min_repeat_ms=0),
}
for rep in range(1):
    for name, cfg in configs.items():
        r = Runner(cfg, target)
        tot, n, reps = 0.0, 0, 0
        for t, ok, inc in groups:
            r.set_incumbent(inc)
            t0 = time.perf_counter()
            futs = r.run([RunnerInput(b.artifact_path, dev, c.args_info) for c, b in ok])
            res = [f.result() for f in futs]
            tot += time.perf_counter() - t0
            n += len(ok)
            reps += sum(len(x.run_secs) for x in res if x.run_secs)
        r.close()
        print(name, "s/cand %.4f" % (tot / n), "repeats %.2f" % (reps / n), flush=True)
sess.close()
