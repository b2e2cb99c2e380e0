"""How many cost-model trainings a run paid, and for what: trained at every update that grew the data by a
fifth (MetaSchedule's ``XGBModel``; dynatune's ensemble before session 31), or only when a prediction needs
it (:mod:`dynatune.search.xgb_model`, :mod:`dynatune.search.surrogate`).

    python bench/cost_model_trainings.py --work-dir RUN [--work-dir RUN2 ...] [--cost-model ensemble]

A run's batches are replayed in the order it measured them (``db/measurements.jsonl`` gives each batch's
task and size, ``db/records.jsonl`` its records): each batch's candidates are rebuilt from their traces and
the cost model learns them as the session's ``UpdateCostModel`` did. Eagerly, a training follows the update
that asks for it; lazily, it waits for the next batch of a task that is not that task's first (a first
batch is the head and random samples: nothing predicts it). Both train the same model on the same data;
this reports how many trainings each pays and their seconds.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from dynatune.search.database import FAILED  # noqa: E402


def batches(work_dir: str):
    """``(task key, [record JSON lines])`` per measured batch, in the run's order."""
    records = [json.loads(line) for line in open(os.path.join(work_dir, "db", "records.jsonl"))]
    pos = 0
    for line in open(os.path.join(work_dir, "db", "measurements.jsonl")):
        m = json.loads(line)
        want, taken = len(m["candidates"]), []
        while want and pos < len(records):
            rec = records[pos]
            pos += 1
            if rec["key"] != m["task"]:
                continue  # a batch whose candidates all failed: no measurement line
            taken.append(rec)
            want -= min(rec["record"][1]) < FAILED  # a failed candidate is recorded, not measured
        yield m["task"], taken


def measured_batches(work_dir: str) -> list:
    """``(task key, TuneContext, candidates, runner results)`` per measured batch, in the run's order: each
    candidate rebuilt from its record's trace, once for both ways of training."""
    from tvm.s_tir import meta_schedule as ms
    from tvm.s_tir.meta_schedule.runner import RunnerResult

    from dynatune.machine.target import make_target
    from dynatune.search.database import TuningDatabase

    target, db = make_target(), TuningDatabase(os.path.join(work_dir, "db"), read_only=True)
    contexts, out = {}, []
    for key, lines in batches(work_dir):
        wl = db.workload(key, None)  # a task the run's database holds
        ctx = contexts.setdefault(key, ms.TuneContext(mod=wl.mod, target=target))
        cands, results = [], []
        for line in lines:
            rec = ms.database.TuningRecord.from_json(line["record"], wl)
            secs = [float(s) for s in rec.run_secs]
            if min(secs) < FAILED:
                cands.append(rec.as_measure_candidate())
                results.append(RunnerResult(secs, None))
        out.append((key, ctx, cands, results))
    return out


def trainings(measured: list, lazy: bool, kind: str = "xgb") -> dict:
    """The cost model's trainings and their seconds over ``measured``, eagerly or lazily."""
    from dynatune.search.costmodel import make_cost_model

    model = make_cost_model(kind)
    inst = getattr(model, "_inst", model)
    seen, count, train_s = set(), 0, 0.0

    def train() -> None:
        nonlocal count, train_s
        if inst.stale:
            t0 = time.perf_counter()
            inst.train_if_stale()
            train_s += time.perf_counter() - t0
            count += 1

    for key, ctx, cands, results in measured:
        if lazy and key in seen:
            train()  # the search predicts this batch
        seen.add(key)
        if cands:
            model.update(ctx, cands, results)
        if not lazy:
            train()
    return {"batches": len(measured), "trainings": count, "train_s": round(train_s, 2)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--work-dir", action="append", required=True)
    ap.add_argument("--cost-model", default="xgb", choices=["xgb", "ensemble"])
    ap.add_argument("--json", help="write the results here")
    args = ap.parse_args()
    from dynatune.search.intrinsics import import_tensor_intrinsics

    import_tensor_intrinsics()
    out = []
    for run in args.work_dir:
        measured = measured_batches(run)
        row = {
            "work_dir": run,
            "cost_model": args.cost_model,
            "eager": trainings(measured, lazy=False, kind=args.cost_model),
            "lazy": trainings(measured, lazy=True, kind=args.cost_model),
        }
        print(json.dumps(row))
        out.append(row)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(out, f, indent=1)


if __name__ == "__main__":
    main()
