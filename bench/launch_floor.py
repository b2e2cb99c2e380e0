"""The floor under a tiny parallel kernel: what TVM's thread pool takes to start and join its threads, next
to a task's best kernel and its analytic candidates (issue #27: "best after 15 minutes >= 80 % of the peak").

    python bench/launch_floor.py --model ../shared/models/transformer_tiny.onnx \
        --work-dir <a run's work dir> --task matmul11 [--rounds 7]

Timed with ``time_evaluator`` (5,000 calls per reading, C++ loop), interleaved, the order reversed every
other round: the task's best record from the work dir; its analytic candidates (``dynatune.search.analytic``,
ranks 0-2, with 1, 2, 4 and 8 parallel jobs per core); and two empty kernels over a float32[32], one with a
2-iteration parallel loop (the thread pool's start and join) and one with a serial loop (a call's cost).
Median microseconds [min, max] and GFLOP/s.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)


def empty_kernels(target) -> dict:
    import numpy as np
    import tvm
    from tvm.script import tirx as T

    @T.prim_func
    def parallel(a: T.Buffer((32,), "float32")):
        for i in T.parallel(2):
            a[i * 16] = a[i * 16] + T.float32(1)

    @T.prim_func
    def serial(a: T.Buffer((32,), "float32")):
        for i in range(2):
            a[i * 16] = a[i * 16] + T.float32(1)

    arg = [tvm.runtime.tensor(np.zeros(32, "float32"), tvm.cpu())]

    def build(f):
        return tvm.build(tvm.IRModule({"main": f.with_attr("global_symbol", "main")}), target)

    return {
        f"empty, {name}": (build(f), arg)
        for name, f in (("2-way parallel loop", parallel), ("serial loop", serial))
    }


def main() -> None:
    import tvm
    from tvm.s_tir import meta_schedule as ms
    from tvm.s_tir.meta_schedule.arg_info import ArgInfo
    from tvm.s_tir.meta_schedule.runner.local_runner import default_alloc_argument

    import dynatune.search.analytic as analytic
    from dynatune.files import WorkDir
    from dynatune.machine.target import make_target, usable_cores
    from dynatune.machine.vector import vector_unit
    from dynatune.model.extract import extract_tasks
    from dynatune.model.importer import load_model
    from dynatune.search.builder import compile_scheduled
    from dynatune.search.database import TuningDatabase

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", required=True)
    ap.add_argument("--work-dir", required=True)
    ap.add_argument("--task", required=True)
    ap.add_argument("--rounds", type=int, default=7)
    args = ap.parse_args()

    target, dev = make_target(), tvm.cpu()
    task = next(t for t in extract_tasks(load_model(args.model), target) if t.name == args.task)
    db = TuningDatabase(WorkDir(args.work_dir).db, read_only=True)
    best = db.memory.get_top_k(db.workload(task.key, task.mod), 1)[0]
    mods = {"best record": best.as_measure_candidate().sch.mod}
    ctx = ms.TuneContext(mod=task.mod, target=target, space_generator="post-order-apply", num_threads=1)
    spaces, postprocs = ctx.generate_design_space(), ctx.space_generator.postprocs
    unit, cores = vector_unit(target), usable_cores()
    for jobs in (1, 2, 4, 8):
        analytic.JOBS_PER_CORE = jobs
        found = analytic.analytic_candidates(task.mod, spaces, postprocs, unit, cores, 3)
        for rank, cand in enumerate(found):
            mods[f"analytic rank {rank}, {jobs} jobs per core"] = cand.sch.mod
    kernels = {}
    for name, mod in mods.items():
        infos = [a.as_json() for a in ArgInfo.from_prim_func(mod["main"])]
        kernels[name] = (compile_scheduled(mod, target), default_alloc_argument(dev, infos, 1)[0])
    kernels.update(empty_kernels(target))
    times: dict = {name: [] for name in kernels}
    for r in range(args.rounds):
        for name in list(kernels) if r % 2 == 0 else list(kernels)[::-1]:
            lib, kernel_args = kernels[name]
            times[name].append(lib.time_evaluator("main", dev, number=5000, repeat=1)(*kernel_args).mean)
    print(f"{task.name}: {task.flops / 1e6:.3f} MFLOP")
    for name, secs in times.items():
        us = statistics.median(secs) * 1e6
        rate = f"{task.flops / us / 1e3:6.1f} GFLOP/s" if not name.startswith("empty") else ""
        print(f"{name:40s} {us:7.3f} us [{min(secs) * 1e6:.3f}, {max(secs) * 1e6:.3f}] {rate}")


if __name__ == "__main__":
    main()
