"""Where a candidate's seconds go, phase by phase (issue #29 item 1).

    python bench/candidate_life.py ../shared/models/squeezenet1_1.onnx ../shared/models/mnasnet0_5.onnx

For each model: the heaviest task (weight x FLOPs) is tuned for one round of ``--batches`` batches of
``--batch`` candidates (the defaults' batch size), after a first batch that pays the task's set-up. The
round's own split (search / build / measure / the rest) is the session's; inside it:
- search: MetaSchedule's profiler scopes of the evolutionary search (sampling, mutation, feature
  extraction + prediction, picking from the database), and each after-batch callback (the cost model's
  update, the records, the log);
- build: the round's last batch built again in this process, share by share as the builder does, with
  each stage timed: TIR lowering, LLVM code generation (IR and its optimization), object emission, link.
  CPU seconds, so divided by the build workers to compare with the round's wall seconds;
- runner: the same candidates timed again in this process: library load, argument allocation, the first
  (warm-up) run, the protocol's repeats. What the round's measure seconds hold beyond these is the
  worker round trip.
Milliseconds per candidate; one row per phase.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from collections import defaultdict

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))


class Timed:
    """A batch callback, timed."""

    def __init__(self, inner, sink):
        self.inner, self.sink = inner, sink

    def apply(self, session, batch):
        t0 = time.perf_counter()
        self.inner.apply(session, batch)
        self.sink[f"search: after-batch {type(self.inner).__name__}"] += time.perf_counter() - t0


def build_phases(mods, target, shares, out: dict) -> list[str]:
    """Build ``mods`` share by share as the builder does, each stage timed into ``out``; the libraries."""
    import tvm
    from tvm.tirx.build import codegen_build, split_host_device_mods

    from dynatune.search.builder import batch_module, candidate_pass_context, without_layout_rewrite
    from dynatune.search.linker import link_shared

    libs = []
    tmp = tempfile.mkdtemp()
    for s, share in enumerate(shares):
        t0 = time.perf_counter()
        with candidate_pass_context():
            mod, names = batch_module([mods[k] for k in share])
            mod = without_layout_rewrite(mod)
            mod = tvm.tirx.transform.BindTarget(target.with_host(target))(mod)
            pipeline, finalize_host, _ = tvm.tirx.get_default_tir_pipeline(target)
            host, _ = split_host_device_mods(pipeline(mod))
            host = finalize_host()(host)
            t1 = time.perf_counter()
            rt = codegen_build(host, target)
            t2 = time.perf_counter()
        obj = os.path.join(tmp, f"{s}.o")
        rt.write_to_file(obj)
        t3 = time.perf_counter()
        lib = os.path.join(tmp, f"{s}.so")
        link_shared(lib, [obj])
        t4 = time.perf_counter()
        for key, dt in (
            ("TIR lowering", t1 - t0),
            ("LLVM codegen", t2 - t1),
            ("object", t3 - t2),
            ("link", t4 - t3),
        ):
            out[f"build: {key} (CPU)"] += dt
        libs.append((lib, names))
    return libs


def runner_phases(libs, cands, shares, cfg, out: dict) -> None:
    import tvm
    from tvm.s_tir.meta_schedule.runner.local_runner import default_alloc_argument

    dev = tvm.cpu()
    for (lib_path, names), share in zip(libs, shares):
        t0 = time.perf_counter()
        lib = tvm.runtime.load_module(lib_path)
        out["runner: library load"] += time.perf_counter() - t0
        for name, k in zip(names, share):
            t0 = time.perf_counter()
            args = default_alloc_argument(dev, [a.as_json() for a in cands[k].args_info], 1)[0]
            t1 = time.perf_counter()
            lib.time_evaluator(name, dev, number=1, repeat=1)(*args)
            t2 = time.perf_counter()
            lib.time_evaluator(
                name, dev, number=cfg.number, repeat=cfg.repeat, min_repeat_ms=cfg.min_repeat_ms
            )(*args)
            t3 = time.perf_counter()
            out["runner: argument allocation (first of a task; cached after)"] += t1 - t0
            out["runner: first run (warm-up)"] += t2 - t1
            out["runner: repeats (fixed protocol)"] += t3 - t2


def profile_model(path: str, batch: int, batches: int) -> dict:
    from session_batches import record_built_batches
    from tvm.s_tir import meta_schedule as ms

    from dynatune.machine.target import make_target
    from dynatune.model.extract import extract_tasks
    from dynatune.model.importer import load_model
    from dynatune.search.builder import _shares
    from dynatune.search.session import SearchConfig, TuningSession

    target = make_target()
    model = load_model(path)
    tasks = extract_tasks(model, target)
    heavy = max(range(len(tasks)), key=lambda i: tasks[i].flops * tasks[i].weight)
    session = TuningSession(tasks, target, tempfile.mkdtemp(), search=SearchConfig(trials_per_iter=batch))
    phases: dict = defaultdict(float)
    session.batch_callbacks = [Timed(cb, phases) for cb in session.batch_callbacks]
    built = record_built_batches(session)
    session.warm_up()
    session.tune(heavy, trials=batch)  # the task's set-up and its first batch
    phases.clear()
    with ms.Profiler() as prof:
        r = session.tune(heavy, trials=batch * batches)
    for scope, seconds in prof.get().items():
        if scope.startswith("EvoSearch/") and scope.count("/") == 1 or scope.startswith("EvoSearch/Evolve/"):
            phases[f"search: {scope}"] += float(seconds)
    cands = built[-1]
    mods = [c.sch.mod for c in cands]
    shares = _shares(len(mods), 2 * session.builder.max_workers)
    life: dict = defaultdict(float)
    libs = build_phases(mods, target, shares, life)
    runner_phases(libs, cands, shares, session.measure, life)
    session.close()
    n, m = r.trials, len(cands)
    round_rows = {
        "round: search (session)": r.search_s,
        "round: build (session, wall)": r.build_s,
        "round: measure (session)": r.measure_s,
        "round: the rest (Python glue)": r.wall_s - r.search_s - r.build_s - r.measure_s,
        "round: wall": r.wall_s,
    }
    rows = {k: v / n * 1e3 for k, v in (round_rows | phases).items()}
    rows |= {k: v / m * 1e3 for k, v in life.items()}
    return {"model": model.name, "task": tasks[heavy].name, "candidates": n, "ms_per_candidate": rows}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("models", nargs="+")
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--batches", type=int, default=4)
    ap.add_argument(
        "--out", default=os.path.join(os.path.dirname(__file__), "results", "candidate_life.json")
    )
    args = ap.parse_args()
    results = [profile_model(p, args.batch, args.batches) for p in args.models]
    json.dump(results, open(args.out, "w"), indent=1)
    keys = list(dict.fromkeys(k for r in results for k in r["ms_per_candidate"]))
    print("| phase | " + " | ".join(f"{r['model']} ms / candidate" for r in results) + " |")
    print("|---|" + "---:|" * len(results))
    for k in keys:
        print(f"| {k} | " + " | ".join(f"{r['ms_per_candidate'].get(k, 0):.1f}" for r in results) + " |")


if __name__ == "__main__":
    main()
