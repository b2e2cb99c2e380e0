"""Record per-task tuning traces for the replay benchmark.

Each task of the model is tuned alone, batch after batch, for ``--seconds-per-task`` seconds; after every
batch we record (tuning seconds so far, trials so far, best latency so far). The traces are committed as
data (``dynatune/data/traces/<model>.json``) and replayed by ``dynatune bench replay``.

    python bench/record_traces.py ../shared/models/squeezenet1_1.onnx --seconds-per-task 30
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import sys
import tempfile
import time

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

from dynatune.model import load_model, parse_shape  # noqa: E402
from dynatune.session import SearchConfig, TuningSession  # noqa: E402
from dynatune.target import describe, make_target  # noqa: E402
from dynatune.tasks import extract_tasks  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("model")
    ap.add_argument("--shape", action="append", default=[])
    ap.add_argument("--seconds-per-task", type=float, default=30.0)
    ap.add_argument("--trials-per-iter", type=int, default=8)
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    target = make_target()
    model = load_model(args.model, dict(parse_shape(s) for s in args.shape))
    tasks = extract_tasks(model, target)
    out = args.out or os.path.join(os.path.dirname(__file__), "..", "dynatune", "data", "traces",
                                   model.name + ".json")
    work = tempfile.mkdtemp(prefix="trace-")
    sess = TuningSession(tasks, target, work, search=SearchConfig(trials_per_iter=args.trials_per_iter))
    sess.warm_up()  # one-off imports and worker pools: not part of the first task's trace
    defaults = sess.measure_defaults()
    rows = []
    t_all = time.time()
    for t in tasks:
        trace = [[0.0, 0, defaults[t.index]]]
        spent = 0.0
        while spent < args.seconds_per_task:
            r = sess.tune(t.index, trials=args.trials_per_iter)
            spent += r.wall_s
            trace.append([round(spent, 3), trace[-1][1] + r.trials, min(r.best_after_s, defaults[t.index])])
            if r.exhausted:
                break
        rows.append({**t.as_dict(), "default_s": defaults[t.index], "trace": trace})
        print(f"{t.name}: {defaults[t.index]*1e3:.3f} -> {trace[-1][2]*1e3:.3f} ms in {spent:.0f}s",
              flush=True)
    sess.close()
    doc = {"model": model.name, "sha256": model.sha256, "target": describe(target),
           "machine": f"{platform.machine()} {os.cpu_count()} cores", "date": datetime.date.today().isoformat(),
           "seconds_per_task": args.seconds_per_task, "trials_per_iter": args.trials_per_iter,
           "record_wall_s": round(time.time() - t_all, 1), "tasks": rows}
    with open(out, "w") as f:
        json.dump(doc, f, indent=1)
    print("wrote", out)


if __name__ == "__main__":
    main()
