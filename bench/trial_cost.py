"""Seconds per trial, split into search / build / measure, and the first round's start-up cost.

    python bench/trial_cost.py ../shared/models/squeezenet1_1.onnx --rounds 4 --trials 32

``python bench/trial_cost.py pipeline ...`` compares whole pipelines side by side instead (today's
checkout against the new one, same seeds): see ``bench/pipeline_cost.py``.

Fixed measurement protocol (MeasureConfig defaults). The first round on a task includes its one-off
set-up (design space + search state); later rounds are the steady state the target (<= 1.0 s/trial)
applies to.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

from dynatune.machine.target import make_target  # noqa: E402
from dynatune.model.extract import extract_tasks  # noqa: E402
from dynatune.model.importer import load_model  # noqa: E402
from dynatune.search.session import SearchConfig, TuningSession  # noqa: E402


def pipeline_main(argv) -> None:
    from pipeline_cost import compare, parse_variant, table, task_table

    ap = argparse.ArgumentParser(prog="trial_cost.py pipeline")
    ap.add_argument("--model", action="append", default=[])
    ap.add_argument("--budget", action="append", type=float, default=[])
    ap.add_argument("--variant", action="append", default=[], help="NAME=CHECKOUT[:KEY=VALUE,...]")
    ap.add_argument("--config")
    ap.add_argument("--work", default="/tmp/dynatune-trial-cost")
    ap.add_argument("--out", default=os.path.join(os.path.dirname(__file__), "results", "pipeline_cost.json"))
    ap.add_argument("--table", action="store_true", help="print the results file as a table and exit")
    ap.add_argument("--by-task", metavar="BASE", help="also each task's cost per candidate against BASE's")
    args = ap.parse_args(argv)
    variants = [parse_variant(v) for v in args.variant]
    if not args.table:
        config = os.path.abspath(args.config) if args.config else None
        compare(args.model, args.budget or [240.0], variants, config, args.work, args.out)
    print(table(json.load(open(args.out)), variants[0][0] if variants else "today"))
    if args.by_task:
        print(task_table(args.work, args.budget or [240.0], args.model, variants, args.by_task))


def main() -> None:
    if sys.argv[1:2] == ["pipeline"]:
        return pipeline_main(sys.argv[2:])
    ap = argparse.ArgumentParser()
    ap.add_argument("model")
    ap.add_argument("--rounds", type=int, default=4)
    ap.add_argument("--trials", type=int, default=32)
    ap.add_argument("--trials-per-iter", type=int, default=16)
    args = ap.parse_args()
    t0 = time.perf_counter()
    target = make_target()
    model = load_model(args.model)
    tasks = extract_tasks(model, target)
    t_extract = time.perf_counter() - t0
    sess = TuningSession(
        tasks, target, tempfile.mkdtemp(), search=SearchConfig(trials_per_iter=args.trials_per_iter)
    )
    t0 = time.perf_counter()
    sess.warm_up()
    t_warm = time.perf_counter() - t0
    t0 = time.perf_counter()
    sess.measure_defaults()
    t_defaults = time.perf_counter() - t0
    rows = []
    heavy = tasks[0].index
    for r in range(args.rounds):
        res = sess.tune(heavy, trials=args.trials)
        rows.append(
            {
                "round": r,
                "trials": res.trials,
                "wall_s": res.wall_s,
                "search_s": res.search_s,
                "build_s": res.build_s,
                "measure_s": res.measure_s,
                "per_trial_s": res.wall_s / res.trials,
                "best_ms": res.best_after_s * 1e3,
            }
        )
        print(json.dumps(rows[-1]), flush=True)
    sess.close()
    steady = rows[1:]
    n = sum(r["trials"] for r in steady)
    out = {
        "model": model.name,
        "task": tasks[heavy].name,
        "tasks": len(tasks),
        "extract_s": t_extract,
        "warm_up_s": t_warm,
        "defaults_s": t_defaults,
        "first_round": rows[0],
        "steady_per_trial_s": sum(r["wall_s"] for r in steady) / n,
        "steady_split_s": {k: sum(r[k] for r in steady) / n for k in ("search_s", "build_s", "measure_s")},
    }
    print(json.dumps(out))


if __name__ == "__main__":
    main()
