"""XGBoost's threads for the cost model: one boosting round of a cost-model-sized training set with 1 and
with 2 OpenMP threads, interleaved (dynatune.search.costmodel.XGB_THREADS).

    python bench/xgb_threads.py [--rows 500] [--rounds 7] [--busy]   # writes bench/results/xgb_threads*.json

``--busy``: a process spins on one core meanwhile (the shared machine: another tenant, or a test suite).
dynatune sets ``OMP_WAIT_POLICY=PASSIVE`` unless it is set: ``OMP_WAIT_POLICY=ACTIVE`` gives libgomp's
default (threads spin between parallel regions).
"""

import argparse
import json
import os
import statistics
import sys
import time

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
import dynatune  # noqa: E402,F401  (the settings a run has: OMP_WAIT_POLICY=PASSIVE unless set)

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
    ap.add_argument("--busy", action="store_true", help="one core kept busy by another process meanwhile")
    args = ap.parse_args()
    spinner = None
    if args.busy:
        import subprocess

        spinner = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    rng = np.random.default_rng(0)
    x = rng.standard_normal((args.rows, 164)).astype(np.float32)  # MetaSchedule's per-store features
    dtrain = xgb.DMatrix(x, label=rng.random(args.rows))
    times = {1: [], 2: []}
    for r in range(args.rounds):
        for threads in (1, 2) if r % 2 == 0 else (2, 1):
            times[threads].append(ms_per_round(dtrain, threads))
    if spinner is not None:
        spinner.kill()
    ratios = [b / a for a, b in zip(times[1], times[2])]
    out = {
        "command": "python bench/xgb_threads.py " + " ".join(sys.argv[1:]),
        "date": time.strftime("%Y-%m-%d"),
        "cpu": _cpu(),
        "rows": args.rows,
        "busy_core": args.busy,
        "omp_wait_policy": os.environ.get("OMP_WAIT_POLICY"),
        "ms_per_boosting_round": {str(k): statistics.median(v) for k, v in times.items()},
        "two_over_one": {"median": statistics.median(ratios), "min": min(ratios), "max": max(ratios)},
        "load_average": os.getloadavg(),
    }
    print(json.dumps(out, indent=1))
    policy = os.environ.get("OMP_WAIT_POLICY", "").lower()
    name = "xgb_threads" + ("_busy" if args.busy else "") + (f"_{policy}" if policy else "") + ".json"
    with open(os.path.join(os.path.dirname(os.path.abspath(__file__)), "results", name), "w") as f:
        json.dump(out, f, indent=1)


def _cpu() -> str:
    with open("/proc/cpuinfo") as f:
        info = f.read()
    model = next((line.split(":", 1)[1].strip() for line in info.splitlines() if "model name" in line), "?")
    return f"{model}, {'avx512f' if 'avx512f' in info else 'avx2'}, {os.cpu_count()} cores"


if __name__ == "__main__":
    main()
