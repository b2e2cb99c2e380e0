"""What opening a new work dir's SQLite tracking store costs, created by MLflow (its migrations) or seeded
from the cached empty store (:mod:`dynatune.tasks.mlflow_store`), side by side.

    python bench/mlflow_store.py --rounds 8

Each round opens two new stores, one each way in alternating order, as a run's tracker does: the client,
its experiment, a run with a metric. The template is made before the first round (once per MLflow
version in a user's cache), so the rounds time what every later new work dir pays.
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


def open_store(path: str, seeded: bool) -> float:
    """Seconds to open a new store at ``path`` and record an experiment and a run with a metric in it."""
    from mlflow import MlflowClient

    from dynatune.tasks.mlflow_store import seed_sqlite_store

    t0 = time.perf_counter()
    uri = f"sqlite:///{path}"
    if seeded:
        assert seed_sqlite_store(uri)
    client = MlflowClient(uri)
    exp = client.create_experiment("dynatune/bench", artifact_location="file://" + os.path.dirname(path))
    run = client.create_run(exp)
    client.log_metric(run.info.run_id, "estimated_latency_ms", 1.0, step=0)
    return time.perf_counter() - t0


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=8)
    ap.add_argument("--out", default=None, help="JSON with every round's seconds")
    args = ap.parse_args(argv)
    import logging

    import mlflow  # noqa: F401  (imported before the first timing)

    from dynatune.tasks.mlflow_store import empty_store_template

    logging.getLogger("mlflow").setLevel(logging.WARNING)
    t0 = time.perf_counter()
    empty_store_template()
    made_s = time.perf_counter() - t0
    work = tempfile.mkdtemp(prefix="dynatune-store-")
    times: dict[str, list[float]] = {"created by MLflow": [], "seeded": []}
    for r in range(args.rounds):
        order = [False, True] if r % 2 == 0 else [True, False]
        for seeded in order:
            path = os.path.join(work, f"{r}-{int(seeded)}", "mlflow.db")
            os.makedirs(os.path.dirname(path))
            times["seeded" if seeded else "created by MLflow"].append(open_store(path, seeded))
    print(f"template (once per MLflow version, or already cached): {made_s:.2f} s")
    for way, secs in times.items():
        print(f"{way:18}: median {statistics.median(secs):.3f} s [{min(secs):.3f}, {max(secs):.3f}]")
    if args.out:
        with open(args.out, "w") as f:
            json.dump({"template_s": made_s, "rounds": times}, f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
