"""The same candidates built alone and built in batches, timed interleaved (issue #29 item 5).

    python bench/batch_quality.py ../shared/models/squeezenet1_1.onnx --tasks 3 --rounds 3

For each of the heaviest tasks, one search batch of candidates is built twice: every candidate alone (a
library each, as before) and in batches (a library per build worker). The runner times both versions of
every candidate, alternating, ``--rounds`` times (fixed protocol); reported: build seconds per candidate
both ways, and per candidate the ratio batch / alone of the median latency (its median and spread over
the candidates: batching must not change what a candidate measures).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))


def main() -> None:
    from tvm.s_tir.meta_schedule.builder import BuilderInput
    from tvm.s_tir.meta_schedule.runner import RunnerInput

    from dynatune.machine.target import make_target, target_device, usable_cores
    from dynatune.model.extract import extract_tasks
    from dynatune.model.importer import load_model
    from dynatune.search.builder import PersistentBuilder
    from dynatune.search.measure import MeasureConfig, make_runner
    from dynatune.search.session import SearchConfig, TuningSession

    ap = argparse.ArgumentParser()
    ap.add_argument("model")
    ap.add_argument("--tasks", type=int, default=3)
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()
    target = make_target()
    tasks = extract_tasks(load_model(args.model), target)
    heavy = sorted(range(len(tasks)), key=lambda i: -tasks[i].flops * tasks[i].weight)[: args.tasks]
    session = TuningSession(tasks, target, tempfile.mkdtemp(), search=SearchConfig(trials_per_iter=16))
    builders = {
        "alone": PersistentBuilder(usable_cores(), batched=False),
        "batch": PersistentBuilder(usable_cores()),
    }
    runner = make_runner(MeasureConfig(), target)
    dev = target_device(target)
    build_s = {k: 0.0 for k in builders}
    ratios, n = [], 0
    for i in heavy:
        cands = list(session._context(i).generate_measure_candidates())
        built = {}
        for kind, b in builders.items():
            b.warm_up()
            t0 = time.perf_counter()
            built[kind] = b.build([BuilderInput(c.sch.mod, target) for c in cands])
            build_s[kind] += time.perf_counter() - t0
        n += len(cands)
        times = {k: [[] for _ in cands] for k in builders}
        for _ in range(args.rounds):
            for kind in builders:
                ins = [RunnerInput(b.artifact_path, dev, c.args_info) for b, c in zip(built[kind], cands)]
                for k, fut in enumerate(runner.run(ins)):
                    res = fut.result()
                    if res.run_secs:
                        times[kind][k].append(statistics.median(float(s) for s in res.run_secs))
        for a, b in zip(times["alone"], times["batch"]):
            if a and b:
                ratios.append(statistics.median(b) / statistics.median(a))
        print(tasks[i].name, len(cands), flush=True)
    ratios.sort()
    out = {
        "candidates": n,
        "build_s_per_candidate": {k: v / n for k, v in build_s.items()},
        "batch_over_alone_median": statistics.median(ratios),
        "p10": ratios[len(ratios) // 10],
        "p90": ratios[(9 * len(ratios)) // 10],
    }
    print(json.dumps(out))
    runner.close()
    for b in builders.values():
        b.close()
    session.close()


if __name__ == "__main__":
    main()
