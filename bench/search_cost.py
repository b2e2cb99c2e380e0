"""How much of a slot the evolutionary search itself takes, and what a cheaper search or larger batches
buy: tune the model's heaviest tasks alone, for the same tuning seconds, under several search settings.

    python bench/search_cost.py [--model M] [--seconds 60] [--seeds 2] [--tasks 2] [--variants a,b]
        [--trials-per-iter N] [--out FILE]

In a README main job (light squeezenet, 240 s, batches of 8), generating the candidates (sampling,
evolution and the cost model's feature extraction) took 165 of 259 tuning seconds; building took 64 and
measuring 30. Here each (seed, task) tunes under every variant in turn (interleaved, a fresh work dir
each), in 15 s slots, and reports the best latency after ``seconds/2`` and ``seconds`` of tuning, the
trials, and where the time went. Results go to ``bench/results/search_cost.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

VARIANTS = {  # SearchConfig fields over OLD_SEARCH
    "old search": {},
    "lean search": {"population_size": 64, "genetic_num_iters": 1, "init_min_unmeasured": 16},
    "batches of 16": {"trials_per_iter": 16},
}
# the quickstart's search before session 8 (the results of 2026-11-23 call this variant "quickstart")
OLD_SEARCH = {"trials_per_iter": 8, "population_size": 128, "init_min_unmeasured": 32, "genetic_num_iters": 2}


def curve_run(
    tasks, target, task: int, search, measure, seconds: float, work: str, slot_s: float = 15.0
) -> dict:
    from dynatune.search.session import TuningSession

    shutil.rmtree(work, ignore_errors=True)
    s = TuningSession(tasks, target, work, search=search, measure=measure)
    points, totals = [], {"search_s": 0.0, "build_s": 0.0, "measure_s": 0.0, "trials": 0}
    try:
        s.warm_up()
        tuned = 0.0
        while tuned < seconds:
            r = s.tune(task, seconds=min(slot_s, seconds - tuned))
            tuned += r.wall_s
            for k in totals:
                totals[k] += getattr(r, k)
            points.append([round(tuned, 2), s.best_latency(task)])
    finally:
        s.close()
    return {"points": points, **totals}


def best_at(points, t: float) -> float:
    """The best latency reached within ``t`` tuning seconds (the last point at or before it)."""
    return min((b for s, b in points if s <= t + 1e-9), default=float("inf"))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument(
        "--model",
        default=os.path.join(
            ROOT, ".venv/lib/python3.11/site-packages/onnx/backend/test/data/light/light_squeezenet.onnx"
        ),
    )
    ap.add_argument("--seconds", type=float, default=60.0)
    ap.add_argument("--seeds", type=int, default=2)
    ap.add_argument("--tasks", type=int, default=2, help="the N heaviest tasks (weight x FLOPs)")
    ap.add_argument("--variants", default=",".join(VARIANTS), help="comma-separated names of VARIANTS")
    ap.add_argument(
        "--trials-per-iter",
        type=int,
        default=OLD_SEARCH["trials_per_iter"],
        help="batch size of every variant that does not set its own",
    )
    ap.add_argument("--work", default="/tmp/dynatune-search-cost")
    ap.add_argument("--out", default=os.path.join(ROOT, "bench", "results", "search_cost.json"))
    args = ap.parse_args(argv)

    from dynatune.machine.target import make_target
    from dynatune.model.extract import Lowering, extract_tasks
    from dynatune.model.importer import load_model
    from dynatune.search.intrinsics import import_tensor_intrinsics
    from dynatune.search.measure import MeasureConfig
    from dynatune.search.session import SearchConfig

    import_tensor_intrinsics()
    target = make_target()
    model = load_model(args.model)
    tasks = extract_tasks(model, target, Lowering())
    heavy = sorted(tasks, key=lambda t: -t.weight * t.flops)[: args.tasks]
    measure = MeasureConfig(repeat=5, min_repeat_ms=10)
    rows = []
    for seed in range(args.seeds):
        for t in heavy:
            for name in args.variants.split(","):
                base = {**OLD_SEARCH, "trials_per_iter": args.trials_per_iter}
                search = SearchConfig(**{**base, **VARIANTS[name], "seed": seed})
                run = curve_run(
                    tasks,
                    target,
                    t.index,
                    search,
                    measure,
                    args.seconds,
                    os.path.join(args.work, f"{seed}-{t.index}-{name.replace(' ', '_')}"),
                )
                row = {
                    "variant": name,
                    "seed": seed,
                    "task": t.name,
                    **run,
                    "best_half_ms": best_at(run["points"], args.seconds / 2) * 1e3,
                    "best_ms": best_at(run["points"], args.seconds) * 1e3,
                }
                rows.append(row)
                print(
                    f"seed {seed} {t.name[:28]:28s} {name:14s} best@{args.seconds / 2:.0f}s "
                    f"{row['best_half_ms']:.3f} ms  best@{args.seconds:.0f}s {row['best_ms']:.3f} ms  "
                    f"trials {run['trials']:3d}  search {run['search_s']:5.1f}  build {run['build_s']:5.1f}  "
                    f"measure {run['measure_s']:5.1f} s",
                    flush=True,
                )
    os.makedirs(os.path.dirname(args.out), exist_ok=True)
    with open(args.out, "w") as f:
        json.dump(
            {"date": time.strftime("%Y-%m-%d %H:%M"), "seconds": args.seconds, "rows": rows}, f, indent=1
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
