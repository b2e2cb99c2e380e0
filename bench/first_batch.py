"""Which part of each task's first batch held its best kernel: the head, or the rest of the batch.

    python bench/first_batch.py --model ../shared/models/mnasnet0_5.onnx --work-dir RUN [--work-dir RUN2 ...]

A task's first batch measures its head first (the analytic or streaming candidates,
:mod:`dynatune.search.analytic`), then the rest: the evolutionary search's picks
(``search.sampled_first_batch: false``) or random samples of the task's design space
(:mod:`dynatune.search.sampled`). From each run's ``db/measurements.jsonl`` (its first line per task is
that batch, in batch order) and the head's size for each task (recomputed with this checkout's analytic
candidates: give runs of code whose head was the same), this counts the tasks whose rest beat the head's
best by more than 3 %, and by how much.
"""

from __future__ import annotations

import argparse
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

BEATS = 0.97  # the rest's best under this share of the head's best: the rest held the batch's best


def head_sizes(models: list[str]) -> dict[str, tuple[str, int]]:
    """Task key -> (name, analytic candidates heading its first batch) for the models' tasks."""
    from dynatune.machine.target import make_target
    from dynatune.model.extract import extract_tasks
    from dynatune.model.importer import load_model
    from dynatune.search.analytic import task_analytic_candidates
    from dynatune.search.intrinsics import import_tensor_intrinsics
    from dynatune.search.session import ANALYTIC_HEAD

    import_tensor_intrinsics()
    target, out = make_target(), {}
    for path in models:
        for t in extract_tasks(load_model(path), target):
            found, _ = task_analytic_candidates(t.mod, target, limit=ANALYTIC_HEAD)
            out[t.key] = (t.name, len(found))
    return out


def first_batches(work_dir: str, heads: dict) -> dict:
    """The run's tasks whose first batch had a head and a rest; those whose rest held the best, and by how
    much (head's best / rest's best)."""
    first: dict[str, list] = {}
    with open(os.path.join(work_dir, "db", "measurements.jsonl")) as f:
        for line in f:
            m = json.loads(line)
            first.setdefault(m["task"], m["candidates"])
    tasks, rest_best = 0, []
    for key, cands in first.items():
        name, k = heads.get(key, ("", 0))
        means = [c.get("mean_s") or float("inf") for c in cands]
        if k == 0 or len(means) <= k:
            continue
        tasks += 1
        head, rest = min(means[:k]), min(means[k:])
        if rest < BEATS * head:
            rest_best.append({"task": name, "head_over_rest": round(head / rest, 2)})
    return {"work_dir": work_dir, "tasks": tasks, "rest_held_the_best": rest_best}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", action="append", required=True)
    ap.add_argument("--work-dir", action="append", required=True)
    ap.add_argument("--json", help="write the results here")
    args = ap.parse_args()
    heads = head_sizes(args.model)
    results = [first_batches(w, heads) for w in args.work_dir]
    for r in results:
        gains = ", ".join(f"{b['task']} {b['head_over_rest']}x" for b in r["rest_held_the_best"]) or "-"
        print(f"{r['work_dir']}: {len(r['rest_held_the_best'])} of {r['tasks']} tasks ({gains})")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=1)


if __name__ == "__main__":
    main()
