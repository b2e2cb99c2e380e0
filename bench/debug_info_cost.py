"""What the DWARF debug info TVM's CPU code generator always writes costs a candidate's object emission.

    python bench/debug_info_cost.py --work-dir <a run's work dir> --tasks 3 --per-task 8 --rounds 5

TVM's ``CodeGenCPU`` attaches debug info to every function it generates (a subprogram, a ``dbg.value`` per
let-bound variable, a location on every instruction), with no switch to turn it off. For the heaviest
``--tasks`` tasks of a tuned work dir, ``--per-task`` of its records are built as the builder builds a share
(one module, :func:`dynatune.search.builder.build_batch` without the link); the module's optimized LLVM IR is
written out twice, as it is and with its debug info removed, and both are loaded with TVM's LLVM and emitted
as objects, interleaved, ``--rounds`` times: the emission's seconds with and without the debug info. The
first column is the whole ``tvm.build`` of the share (lowering, codegen and LLVM's optimization).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import sys
import tempfile
import time

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))


def strip_debug_info(ir: str) -> str:
    """LLVM IR text without its debug info: debug records and intrinsic calls, ``!dbg`` attachments, the
    compile unit's named metadata and the debug module flags (unreferenced metadata nodes are harmless)."""
    lines = []
    for line in ir.splitlines():
        s = line.strip()
        if s.startswith("#dbg_") or "@llvm.dbg." in s or s.startswith("!llvm.dbg.cu"):
            continue
        lines.append(re.sub(r", !dbg !\d+", "", line))
    text = "\n".join(lines)
    return re.sub(r"!llvm\.module\.flags = !\{[^}]*\}", "", text)


def emit_seconds(path_ll: str, out_o: str) -> float:
    import tvm

    mod = tvm.runtime.load_module(path_ll)
    t0 = time.perf_counter()
    mod.write_to_file(out_o)
    return time.perf_counter() - t0


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--work-dir", required=True)
    ap.add_argument("--tasks", type=int, default=3)
    ap.add_argument("--per-task", type=int, default=8)
    ap.add_argument("--rounds", type=int, default=5)
    args = ap.parse_args(argv)
    from dynatune.machine.target import make_target
    from dynatune.search.builder import batch_module, compile_scheduled
    from dynatune.search.database import TuningDatabase

    target = make_target(json.load(open(os.path.join(args.work_dir, "config.json")))["target"])
    tasks = json.load(open(os.path.join(args.work_dir, "tasks.json")))
    db = TuningDatabase(os.path.join(args.work_dir, "db"), read_only=True)
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for task in tasks[: args.tasks]:
            wl = db._workloads.get(task["key"])
            if wl is None:
                continue
            records = db.memory.get_top_k(wl, args.per_task)
            mods = [r.as_measure_candidate().sch.mod for r in records]
            t0 = time.perf_counter()
            with target:
                rt = compile_scheduled(batch_module(mods)[0], target)
            build_s = time.perf_counter() - t0
            ir = rt.inspect_source("ll")
            plain = strip_debug_info(ir)
            paths = {}
            for name, text in (("with", ir), ("without", plain)):
                paths[name] = os.path.join(tmp, f"{name}.ll")
                open(paths[name], "w").write(text)
            secs = {"with": [], "without": []}
            for _ in range(args.rounds):
                for name in secs:
                    secs[name].append(emit_seconds(paths[name], os.path.join(tmp, f"{name}.o")))
            med = {k: statistics.median(v) for k, v in secs.items()}
            row = {
                "task": task["name"],
                "candidates": len(mods),
                "build_s": build_s,
                "ir_lines": [len(ir.splitlines()), len(plain.splitlines())],
                "emit_with_s": med["with"],
                "emit_without_s": med["without"],
                "without_over_with": med["without"] / med["with"],
            }
            rows.append(row)
            print(json.dumps(row), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
