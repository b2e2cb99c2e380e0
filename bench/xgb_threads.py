"""XGBoost's threads for the cost model: one boosting round of a cost-model-sized training set with 1 and
with 2 OpenMP threads, interleaved (dynatune.search.costmodel.XGB_THREADS).

    python bench/xgb_threads.py [--rows 500] [--rounds 7]    # writes bench/results/xgb_threads.json
"""

import argparse
import json
import os
import statistics
import sys
import time

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
import dynatune  # noqa: E402,F401  (the thread-pool settings a run has)

PARAMS = {"max_depth": 10, "gamma": 0.001, "min_child_weight": 0, "eta": 0.2, "verbosity": 0}  # XGBConfig's


def ms_per_round(dtrain, threads: int, rounds: int = 40) -> float:
    import xgboost as xgb

    start = time.perf_counter()
    xgb.train({**PARAMS, "nthread": threads}, dtrain, num_boost_round=rounds)
    return (time.perf_counter() - start) / rounds * 1e3


def main() -> None:
    import xgboost as xgb

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", type=int, default=500)
    ap.add_argument("--rounds", type=int, default=7)
    args = ap.parse_args()
    rng = np.random.default_rng(0)
    x = rng.standard_normal((args.rows, 164)).astype(np.float32)  # MetaSchedule's per-store features
    dtrain = xgb.DMatrix(x, label=rng.random(args.rows))
    times = {1: [], 2: []}
    for r in range(args.rounds):
        for threads in (1, 2) if r % 2 == 0 else (2, 1):
            times[threads].append(ms_per_round(dtrain, threads))
    ratios = [b / a for a, b in zip(times[1], times[2])]
    out = {
        "command": "python bench/xgb_threads.py " + " ".join(sys.argv[1:]),
        "date": time.strftime("%Y-%m-%d"),
        "cpu": _cpu(),
        "rows": args.rows,
        "ms_per_boosting_round": {str(k): statistics.median(v) for k, v in times.items()},
        "two_over_one": {"median": statistics.median(ratios), "min": min(ratios), "max": max(ratios)},
        "load_average": os.getloadavg(),
    }
    print(json.dumps(out, indent=1))
    with open(
        os.path.join(os.path.dirname(os.path.abspath(__file__)), "results", "xgb_threads.json"), "w"
    ) as f:
        json.dump(out, f, indent=1)


def _cpu() -> str:
    with open("/proc/cpuinfo") as f:
        info = f.read()
    model = next((line.split(":", 1)[1].strip() for line in info.splitlines() if "model name" in line), "?")
    return f"{model}, {'avx512f' if 'avx512f' in info else 'avx2'}, {os.cpu_count()} cores"


if __name__ == "__main__":
    main()
