"""Build seconds per candidate: alone, or in batches cut into 1, 2, 4 or 8 shares per worker (issue #29).

    python bench/build_shares.py ../shared/models/squeezenet1_1.onnx --tasks 4 --rounds 3

For each of the heaviest tasks, one search batch (``--batch`` candidates, the task's second: the search's
candidates as the session builds them, layout rewrite and all, after the task's first batch) is built
every way, the ways interleaved and their order rotated from round to
round. Reported per way: the build's wall seconds per candidate (median over the rounds of the sum over
the tasks) and its ratio to building alone, with the spread of the per-round ratios.
"""

from __future__ import annotations

import json
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

WAYS = {"alone": None, "1 share/worker": 1, "2 shares/worker": 2, "4 shares/worker": 4, "8 shares/worker": 8}


def main() -> None:
    from session_batches import search_batch_arguments, search_batches
    from tvm.s_tir.meta_schedule.builder import BuilderInput

    from dynatune.machine.target import usable_cores
    from dynatune.search.builder import PersistentBuilder, remove_artifacts

    ap = search_batch_arguments()
    args = ap.parse_args()
    target, found = search_batches(args.model, args.tasks, args.batch)
    batches = [[BuilderInput(c.sch.mod, target) for c in cands] for _, cands in found]
    n = sum(len(b) for b in batches)
    builders = {
        way: PersistentBuilder(usable_cores(), batched=s is not None, shares_per_worker=s or 1)
        for way, s in WAYS.items()
    }
    for b in builders.values():
        b.warm_up()
    seconds = {way: [] for way in WAYS}
    ways = list(WAYS)
    for r in range(args.rounds):
        for way in ways[r % len(ways) :] + ways[: r % len(ways)]:
            total = 0.0
            for batch in batches:
                t0 = time.perf_counter()
                built = builders[way].build(batch)
                total += time.perf_counter() - t0
                assert all(x.error_msg is None for x in built), [x.error_msg for x in built]
                remove_artifacts(x.artifact_path for x in built)
            seconds[way].append(total / n)
            print(f"round {r} {way}: {total / n * 1e3:.1f} ms/candidate", flush=True)
    out = {"candidates_per_round": n, "rounds": args.rounds}
    for way, xs in seconds.items():
        ratios = sorted(x / a for x, a in zip(xs, seconds["alone"]))
        out[way] = {
            "ms_per_candidate": statistics.median(xs) * 1e3,
            "vs_alone": statistics.median(ratios),
            "vs_alone_range": [ratios[0], ratios[-1]],
        }
    print(json.dumps(out, indent=1))
    for b in builders.values():
        b.close()


if __name__ == "__main__":
    main()
