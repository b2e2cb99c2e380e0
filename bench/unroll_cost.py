"""What each unroll choice of MetaSchedule's CPU space costs to build, and what it wins (issue #29).

    python bench/unroll_cost.py --work-dir RUN_WORK_DIR [--work-dir ...] [--model MODEL.onnx] \
        [--per-choice 40] [--json OUT]

From a run's tuning database (``db/records.jsonl``: each measured candidate's trace and run times), for
each unroll choice (the ``SampleCategorical`` decision of ``meta_schedule.unroll_explicit``: 0, 16, 64 or
512 steps):
- how many candidates the run measured with it, and how many tasks' best kernel has it;
- per task, its best candidate's time over the task's best (1.00: it is the best);
- the build time of ``--per-choice`` of its candidates, sampled at random and built again one at a time in
  this process, in a shuffled order (``tvm.build`` and ``export_library``: what a build worker does).
The model is the run's (``--model``, the built-in default model when left out); its tasks are extracted
again for this machine's target.
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import random
import statistics
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)


def unroll_of(trace_json) -> int | None:
    """The unroll steps a recorded trace decided (``None``: it samples none)."""
    insts, decisions = trace_json[0], {d[0]: d[1] for d in trace_json[1]}
    steps = None
    for k, inst in enumerate(insts):
        if inst[0] == "SampleCategorical" and k in decisions:
            steps = int(inst[2][0][decisions[k]])
    return steps


def read_records(work_dir: str) -> list[dict]:
    with open(os.path.join(work_dir, "db", "records.jsonl")) as f:
        return [json.loads(line) for line in f if line.strip()]


def wins(records: list[dict]) -> tuple[collections.Counter, collections.Counter, dict]:
    """Candidates per choice, tasks won per choice, and per task each choice's best over the task's best."""
    by_task = collections.defaultdict(list)
    for r in records:
        times = r["record"][1]
        if times:
            by_task[r["key"]].append((statistics.median(times), unroll_of(r["record"][0])))
    measured, won, relative = collections.Counter(), collections.Counter(), {}
    for key, rows in by_task.items():
        rows.sort(key=lambda x: x[0])
        won[rows[0][1]] += 1
        best = {}
        for t, steps in rows:
            measured[steps] += 1
            best.setdefault(steps, t)
        relative[key] = {str(s): round(t / rows[0][0], 3) for s, t in best.items()}
    return measured, won, relative


def build_times(records: list[dict], model: str, per_choice: int, seed: int = 0) -> dict:
    import tvm
    from tvm.s_tir import Schedule

    from dynatune.machine.target import make_target
    from dynatune.model.extract import extract_tasks
    from dynatune.model.importer import load_model
    from dynatune.search.builder import compile_scheduled

    target = make_target()
    tasks = {t.key: t for t in extract_tasks(load_model(model), target)}
    groups = collections.defaultdict(list)
    for r in records:
        if r["key"] in tasks:
            groups[unroll_of(r["record"][0])].append(r)
    rng = random.Random(seed)
    order = [(s, r) for s, rs in groups.items() for r in rng.sample(rs, min(per_choice, len(rs)))]
    rng.shuffle(order)
    out = collections.defaultdict(list)
    path = os.path.join(tempfile.mkdtemp(), "candidate.so")
    for steps, r in order:
        sch = Schedule(tasks[r["key"]].mod)
        tvm.s_tir.schedule.Trace.apply_json_to_schedule(r["record"][0], sch)
        t0 = time.perf_counter()
        compile_scheduled(sch.mod, target).export_library(path)
        out[str(steps)].append(time.perf_counter() - t0)
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--work-dir", action="append", required=True)
    ap.add_argument("--model", help="the runs' model (default: the built-in default model)")
    ap.add_argument("--per-choice", type=int, default=40, help="candidates built again per unroll choice")
    ap.add_argument("--json")
    args = ap.parse_args()
    from dynatune.model.default_model import default_model_path

    records = [r for w in args.work_dir for r in read_records(w)]
    measured, won, relative = wins(records)
    times = build_times(records, args.model or default_model_path(), args.per_choice)
    print("| unroll steps | candidates | tasks won | build s, median | mean | p90 | max |")
    print("|---:|---:|---:|---:|---:|---:|---:|")
    for steps in sorted(measured, key=lambda s: -1 if s is None else s):
        ts = sorted(times.get(str(steps), [])) or [float("nan")]
        p90 = ts[max(0, int(0.9 * len(ts)) - 1)]
        print(
            f"| {steps} | {measured[steps]} | {won[steps]} | {statistics.median(ts):.3f} "
            f"| {statistics.mean(ts):.3f} | {p90:.3f} | {ts[-1]:.3f} |"
        )
    if args.json:
        result = {
            "work_dirs": args.work_dir,
            "measured": {str(k): v for k, v in measured.items()},
            "won": {str(k): v for k, v in won.items()},
            "relative_best": relative,
            "build_s": times,
            "date": time.strftime("%Y-%m-%d %H:%M"),
        }
        with open(args.json, "w") as f:
            json.dump(result, f, indent=1)


if __name__ == "__main__":
    main()
