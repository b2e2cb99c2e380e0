"""Kernel for kernel: each heavy conv/matmul task of a model, timed side by side against ONNX Runtime's op.

    python -m bench.kernels --model ../shared/models/squeezenet1_1.onnx [--work-dir RUN_WORK_DIR] \
        [--tasks 8] [--rounds 7] [--json OUT]

For each of the ``--tasks`` heaviest tasks (weight x FLOPs) that MetaSchedule tiles (convolutions, dense,
matmul), one process builds and times, interleaved round by round (median of the rounds):

- ``untuned``: the task as lowered, no schedule;
- ``analytic``: the best of its analytic first candidates (:mod:`dynatune.search.analytic`);
- ``best``: with ``--work-dir``, the best record that run's tuning database holds for the task;
- ``ort``: ONNX Runtime's kernel for the same operator (:mod:`dynatune.compiler.anchors`): the whole model
  run by ONNX Runtime with its profiler, in the same rounds, with the same threads; its kernel with the
  same weight and output shapes, as it runs inside its model.

TVM kernels are timed as tuning times them (weights pre-packed, layout rewrite outside the timing), each
reading the fastest of one call looped for >= 50 ms (``time_evaluator(number=1, repeat=1,
min_repeat_ms=50)``). Each row gives the task's FLOPs, GFLOP/s, % of this machine's peak (the roofline's:
the register-only FMA loop, :func:`dynatune.machine.roofline.machine_roofline`, cached per machine, as the
run's beliefs and profile use it), which roof bounds the task (``bound_by``: ``memory`` when its
compulsory bytes take longer at the roofline's bandwidth than its FLOPs at the peak) and % of that roof,
and the ratio of each TVM kernel to ONNX Runtime's op. The analytic kernel's inner loop is summarised from
its assembly: vector FMAs, loads, broadcasts and stack spills.
"""

from __future__ import annotations

import json
import os
import re
import statistics
from collections import defaultdict

import numpy as np

from bench.harness import heaviest, load_tasks, parser, write_json

# each reading: one call of the kernel looped for at least this long, its mean
MIN_REPEAT_MS = 50


def tvm_timer(mod, target):
    import tvm
    from tvm.s_tir.meta_schedule.arg_info import ArgInfo

    from dynatune.search.builder import compile_scheduled

    lib = compile_scheduled(mod, target)
    dev = tvm.cpu()
    rng = np.random.default_rng(0)
    args = [
        tvm.runtime.tensor(rng.standard_normal([int(d) for d in a.shape]).astype(a.dtype), dev)
        for a in ArgInfo.from_entry_func(mod, remove_preproc=True)
    ]
    evaluator = lib.time_evaluator("main", dev, number=1, repeat=1, min_repeat_ms=MIN_REPEAT_MS)
    evaluator(*args)

    def once() -> float:
        return float(evaluator(*args).mean)

    return once, lib


def inner_loop_summary(lib) -> dict:
    """Counts over the kernel's assembly, and over its busiest basic block (the loop with the most FMAs)."""
    asm = lib.inspect_source("asm")
    blocks, current = [], []
    for line in asm.splitlines():
        if re.match(r"^\.?LBB|^\S+:", line):
            blocks.append(current)
            current = []
        current.append(line)
    blocks.append(current)
    fma = re.compile(r"vfmadd\w*ps")
    hot = max(blocks, key=lambda b: sum(bool(fma.search(x)) for x in b))

    def count(lines, pattern):
        return sum(bool(re.search(pattern, x)) for x in lines)

    return {
        "fma": count(hot, r"vfmadd\w*ps"),
        "fma_with_broadcast": count(hot, r"vfmadd\w*ps.*\{1to"),
        "loads": count(hot, r"vmov\w*ps\s+-?\d*\(%r"),
        "broadcasts": count(hot, r"vbroadcastss"),
        "spills": count(hot, r"\(%rsp\)"),
        "vector_register": "zmm" if count(hot, "zmm") else "ymm" if count(hot, "ymm") else "xmm",
    }


def best_record_schedule(db, task, postprocs):
    """The scheduled module of the best record ``db`` holds for ``task``, or ``None``."""
    from dynatune.search.reapply import reapply

    top = db.memory.get_top_k(db.workload(task.key, task.mod), 1)
    sch = reapply(task.mod, top[0].trace, postprocs) if top else None
    return sch.mod if sch is not None else None


def main(argv=None) -> dict:
    ap = parser(__doc__)
    ap.add_argument("--model", action="append", required=True)
    ap.add_argument("--work-dir", help="a run's work dir: its best record per task is timed too")
    ap.add_argument("--tasks", type=int, default=8)
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--json", help="write the rows here")
    args = ap.parse_args(argv)

    from dynatune.compiler.anchors import OnnxRuntimeProfile
    from dynatune.files import WorkDir
    from dynatune.machine.roofline import compulsory_bytes, machine_roofline
    from dynatune.machine.target import make_target, usable_cores
    from dynatune.machine.vector import vector_unit
    from dynatune.search.analytic import task_analytic_candidates
    from dynatune.search.database import TuningDatabase

    target, threads = make_target(), usable_cores()
    unit, roof = vector_unit(target), machine_roofline(target)
    peak = roof.peak_flops
    print(
        f"target {target}, {unit}, peak (the roofline's FMA loop, {threads} threads) {peak / 1e9:.0f} GFLOP/s"
        f"{' (measured under load)' if roof.under_load else ''}, bandwidth {roof.bandwidth / 1e9:.1f} GB/s"
    )
    db = TuningDatabase(WorkDir(args.work_dir).db, read_only=True) if args.work_dir else None
    rows = []
    for path in args.model:
        model, target, tasks = load_tasks(path, target, args.work_dir)
        picked = []
        for task in heaviest(tasks):
            if len(picked) >= args.tasks:
                break
            cands, postprocs = task_analytic_candidates(task.mod, target)
            if not cands:
                continue
            timers, libs = {"untuned": tvm_timer(task.mod, target)[0]}, {}
            for k, c in enumerate(cands):
                timers[f"analytic{k}"], libs[f"analytic{k}"] = tvm_timer(c.sch.mod, target)
            best = best_record_schedule(db, task, postprocs) if db is not None else None
            if best is not None:
                timers["best"] = tvm_timer(best, target)[0]
            picked.append((task, timers, libs))
        onnxruntime = OnnxRuntimeProfile(model, threads)
        times = {task.index: defaultdict(list) for task, _, _ in picked}
        for _ in range(args.rounds):  # every kernel once per round, and ONNX Runtime's model between
            for task, timers, _ in picked:
                for name, once in timers.items():
                    times[task.index][name].append(once())
            onnxruntime.run_block()
        ort_ms = onnxruntime.op_ms([task for task, _, _ in picked])
        for task, _, libs in picked:
            med = {name: statistics.median(v) for name, v in times[task.index].items()}
            if task.index in ort_ms:
                med["ort"] = ort_ms[task.index] / 1e3
            first = min((n for n in med if n.startswith("analytic")), key=med.get)
            traffic = compulsory_bytes(task.mod)
            row = {
                "model": os.path.basename(path),
                "task": task.name,
                "weight": task.weight,
                "mflop": task.flops / 1e6,
                "us": {n: round(v * 1e6, 1) for n, v in med.items()},
                "gflops": {n: round(task.flops / v / 1e9, 1) for n, v in med.items()},
                "pct_peak": {n: round(100 * task.flops / v / peak, 1) for n, v in med.items()},
                "bytes": traffic,
                "bound_by": roof.limit(task.flops, traffic),
                "pct_roof": {
                    n: round(100 * roof.share_of_roof(task.flops, traffic, v), 1) for n, v in med.items()
                },
                "analytic": first,
                "inner_loop": inner_loop_summary(libs[first]),
            }
            if "ort" in med:
                row["vs_ort"] = {n: round(v / med["ort"], 2) for n, v in med.items() if n != "ort"}
            rows.append(row)
            print(json.dumps(row), flush=True)
    print_table(rows)
    out = {
        "peak_gflops": peak / 1e9,
        "peak": "the roofline's (the FMA loop)",
        "bandwidth_gbs": roof.bandwidth / 1e9,
        "roofline": roof.as_dict(),
        "unit": unit.as_dict(),
        "min_repeat_ms": MIN_REPEAT_MS,
        "rounds": args.rounds,
        "rows": rows,
    }
    if args.json:
        write_json(args.json, out)
    return out


def print_table(rows) -> None:
    print(
        "\n| model | task | w | MFLOP | untuned | analytic | best | ORT op | analytic % peak | bound by"
        " | % of roof: analytic, best | analytic / ORT"
        " | inner loop (FMA, bcast-in-FMA, loads, bcasts, spills) |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        g, a = r["gflops"], r["analytic"]
        il = r["inner_loop"]
        print(
            f"| {r['model']} | {r['task']} | {r['weight']} | {r['mflop']:.1f} | {g['untuned']} | {g[a]}"
            f" | {g.get('best', '-')} | {g.get('ort', '-')} | {r['pct_peak'][a]} | {r['bound_by']}"
            f" | {r['pct_roof'][a]}, {r['pct_roof'].get('best', '-')} |"
            f" {r.get('vs_ort', {}).get(a, '-')} | {il['fma']}, {il['fma_with_broadcast']}, {il['loads']},"
            f" {il['broadcasts']}, {il['spills']} ({il['vector_register']}) |"
        )
    print("(GFLOP/s, medians of interleaved rounds; ratios > 1: slower than ONNX Runtime's op)")


if __name__ == "__main__":
    main()
