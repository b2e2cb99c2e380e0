"""One runner call per batch against one per candidate, on the same built candidates (issue #29 item 4).

    python bench/runner_calls.py ../shared/models/squeezenet1_1.onnx --rounds 10 [--floor]

The 4 heaviest tasks' search batches (``session_batches.search_batches``) are built once. Each round times
every batch through the local runner both ways, the order alternating: the whole batch in one ``run`` (one
call to the worker), and each candidate in its own ``run`` (one call each, as the runner did until #29
item 4). ``--floor`` measures with one repeat of one run and no minimum time, so that what is left is the
fixed cost per candidate; without it, the adaptive protocol's defaults (no incumbent, so nothing is raced).
Reported: the wall milliseconds per candidate (median over batches and rounds), their paired ratio, and the
ratio of each candidate's median timing between the two ways (the timings must not change).
"""

from __future__ import annotations

import os
import statistics as st
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

WAYS = ("one call per batch", "one call per candidate")


def main() -> None:
    from session_batches import search_batch_arguments, search_batches
    from tvm.s_tir.meta_schedule.builder import BuilderInput
    from tvm.s_tir.meta_schedule.runner import RunnerInput

    from dynatune.search.builder import PersistentBuilder
    from dynatune.search.measure import MeasureConfig, make_runner

    ap = search_batch_arguments()
    ap.add_argument("--floor", action="store_true")
    args = ap.parse_args()
    target, batches = search_batches(args.model, args.tasks, args.batch)
    builder = PersistentBuilder(2, timeout_sec=60, artifact_dir=tempfile.mkdtemp())
    cfg = MeasureConfig(adaptive=False, repeat=1, min_repeat_ms=0) if args.floor else MeasureConfig()
    runner = make_runner(cfg, target)
    runner.warm_up()
    try:
        inputs = []
        for _, cands in batches:
            built = builder.build([BuilderInput(c.sch.mod, target) for c in cands])
            inputs.append(
                [
                    RunnerInput(b.artifact_path, "cpu", c.args_info)
                    for b, c in zip(built, cands)
                    if not b.error_msg
                ]
            )
        wall = {w: [] for w in WAYS}
        secs = {w: {} for w in WAYS}
        for r in range(args.rounds):
            for way in WAYS if r % 2 == 0 else WAYS[::-1]:
                for b, batch in enumerate(inputs):
                    t0 = time.perf_counter()
                    if way == WAYS[0]:
                        results = [f.result() for f in runner.run(batch)]
                    else:
                        results = [runner.run([one])[0].result() for one in batch]
                    wall[way].append((time.perf_counter() - t0) / len(batch))
                    for k, res in enumerate(results):
                        if res.error_msg is None:
                            secs[way].setdefault((b, k), []).append(st.median(float(s) for s in res.run_secs))
    finally:
        runner.close()
        builder.close()
    paired = [a / b for a, b in zip(wall[WAYS[0]], wall[WAYS[1]])]
    kernel = [
        st.median(secs[WAYS[0]][k]) / st.median(secs[WAYS[1]][k]) for k in secs[WAYS[0]] if k in secs[WAYS[1]]
    ]
    q, kq = st.quantiles(paired, n=10), st.quantiles(kernel, n=10)
    print(f"{args.model} ({'floor: 1 run' if args.floor else 'adaptive protocol'}, {args.rounds} rounds)")
    for way in WAYS:
        print(
            f"  {way}: {st.median(wall[way]) * 1e3:.2f} ms / candidate (median of {len(wall[way])} batches)"
        )
    print(
        f"  per batch / per candidate, paired: median {st.median(paired):.3f} "
        f"[p10 {q[0]:.3f}, p90 {q[-1]:.3f}]"
    )
    print(
        f"  a candidate's timing, per batch / per candidate: median {st.median(kernel):.3f} "
        f"[p10 {kq[0]:.3f}, p90 {kq[-1]:.3f}] ({len(kernel)} candidates)"
    )


if __name__ == "__main__":
    main()
