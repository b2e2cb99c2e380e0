"""What a pathological candidate costs the builder: the time limit of a fixed cap against one that follows
the builds seen (issue #29; ``dynatune.search.builder.BuildTimeLimit``).

    python bench/pathological_build.py [--rounds 2]

The candidates are real: ``bench/data/pathological_builds.json`` holds the traces of the README job's
candidates whose builds timed out in session 19's runs (LLVM's back end took 18 and 35 s on them). For each,
a batch of 8 of its task is built: 7 candidates sampled from the task's design space, and the pathological
one fourth. Each way is a fresh ``PersistentBuilder`` (2 workers, ``search.build_timeout_s`` 15 s as
shipped) that has first built the 7 legit candidates twice (so it has seen builds); the ways alternate, their
order reversed every other round. Reported per candidate and way: the batch's wall seconds, and what
became of the candidates.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
DATA = os.path.join(ROOT, "bench", "data", "pathological_builds.json")
CAP_S = 15.0  # search.build_timeout_s as shipped


def batches(target) -> list[tuple[str, list]]:
    """Per pathological record: its task's name, and a batch of 8 scheduled modules with it fourth."""
    import tvm
    from tvm.s_tir import Schedule
    from tvm.s_tir import meta_schedule as ms

    from dynatune.model.default_model import default_model_path
    from dynatune.model.extract import extract_tasks
    from dynatune.model.importer import load_model
    from dynatune.search.replay import replay

    tasks = {t.key: t for t in extract_tasks(load_model(default_model_path()), target)}
    out = []
    for rec in json.load(open(DATA))["records"]:
        task = tasks[rec["task_key"]]
        ctx = ms.TuneContext(mod=task.mod, target=target, space_generator="post-order-apply", num_threads=1)
        spaces = ctx.generate_design_space()
        legit = []
        for seed in range(1, 100):
            sch = replay(task.mod, spaces[seed % len(spaces)].trace, ctx.space_generator.postprocs, seed=seed)
            if sch is not None:
                legit.append(sch.mod)
            if len(legit) == 7:
                break
        bad = Schedule(task.mod)
        tvm.s_tir.schedule.Trace.apply_json_to_schedule(rec["trace"], bad)
        out.append((task.name, legit[:3] + [bad.mod] + legit[3:]))
    return out


def build_once(mods, target, follow: bool) -> tuple[float, list[str]]:
    """A fresh builder, warmed on the legit candidates, builds the batch: its seconds and outcomes."""
    from tvm.s_tir.meta_schedule.builder import BuilderInput

    from dynatune.search.builder import PersistentBuilder

    builder = PersistentBuilder(2, timeout_sec=CAP_S, artifact_dir=tempfile.mkdtemp())
    if not follow:
        builder.limits.min_seen = 10**9  # the cap, always
    try:
        builder.warm_up()
        for _ in range(2):  # 14 candidates seen: more than the 8 the limit waits for
            builder.build([BuilderInput(m, target) for k, m in enumerate(mods) if k != 3])
        t0 = time.perf_counter()
        built = builder.build([BuilderInput(m, target) for m in mods])
        return time.perf_counter() - t0, [b.error_msg or "built" for b in built]
    finally:
        builder.close()


def main() -> None:
    from dynatune.machine.target import make_target

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--out", default=os.path.join(ROOT, "bench", "results", "pathological_build.json"))
    args = ap.parse_args()
    target = make_target()
    rows = []
    for name, mods in batches(target):
        seconds = {"cap": [], "follows": []}
        outcomes = {}
        for r in range(args.rounds):
            for way in ("cap", "follows") if r % 2 == 0 else ("follows", "cap"):
                s, outcomes[way] = build_once(mods, target, way == "follows")
                seconds[way].append(s)
        row = {"task": name, "seconds": seconds, "outcomes": outcomes}
        rows.append(row)
        cap_s, follows_s = statistics.median(seconds["cap"]), statistics.median(seconds["follows"])
        print(
            f"{name}: batch of 8 with the pathological candidate: cap {cap_s:.1f} s "
            f"{seconds['cap']}, follows the builds {follows_s:.1f} s "
            f"{seconds['follows']}; the candidate: {outcomes['cap'][3]!r} / {outcomes['follows'][3]!r}; "
            f"others built: {sum(o == 'built' for o in outcomes['follows'])}/7",
            flush=True,
        )
    entry = {"date": time.strftime("%Y-%m-%d %H:%M"), "rounds": args.rounds, "rows": rows}
    results = json.load(open(args.out)) if os.path.exists(args.out) else []
    with open(args.out, "w") as f:
        json.dump(results + [entry], f, indent=1)


if __name__ == "__main__":
    main()
