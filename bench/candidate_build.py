"""A candidate's build with and without its entry function's argument checks and the C++ driver's link,
side by side: what each costs, and that the kernels are the same (issue #29).

    python bench/candidate_build.py ../shared/models/squeezenet1_1.onnx --tasks 4 --rounds 3

Candidates: each of the ``--tasks`` heaviest tasks' first search batch (``session_batches.search_batches``),
cut into shares of 4 as the builder cuts a batch of 16 for 2 workers. Two ways to build a share:
- ``checks + g++``: ``tvm.build`` in the current pass context, linked as TVM links (``g++ -shared``): the
  builder until session 33;
- ``no checks + ld``: the builder's now (``compile_scheduled``, ``dynatune.search.linker.link_shared``).

Reported:
1. the build, ms per candidate, in this process (one core): compile (TIR lowering, LLVM code generation),
   object emission, link; each share built both ways in turn, which way first alternating;
2. the kernels' machine code: every function of the two objects but the entry functions (which hold the
   checks) and the checks' error helpers, compared instruction by instruction (``objdump -d``);
3. the kernels' time: each candidate's function of both libraries timed in turn, ``--timing-rounds``
   rounds of ``--repeat-ms`` each; per candidate the ratio of the medians, new over old.
"""

from __future__ import annotations

import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

SHARE = 4
WAYS = ("checks + g++", "no checks + ld")


def build(mods, target, way: str, out_dir: str) -> tuple[dict, str, str, list[str]]:
    """One share built ``way``: seconds per stage, the object and the library, the functions' names."""
    import tvm
    from tvm.support import cc

    from dynatune.search.builder import batch_module, compile_scheduled, without_layout_rewrite
    from dynatune.search.linker import link_shared

    mod, names = batch_module(mods)
    t0 = time.perf_counter()
    if way == WAYS[0]:
        rt = tvm.build(without_layout_rewrite(mod), target=target)
    else:
        rt = compile_scheduled(mod, target)
    t1 = time.perf_counter()
    obj = os.path.join(out_dir, f"{len(os.listdir(out_dir))}.o")
    rt.write_to_file(obj)
    t2 = time.perf_counter()
    lib = obj[:-2] + ".so"
    (cc.create_shared if way == WAYS[0] else link_shared)(lib, [obj])
    t3 = time.perf_counter()
    return {"compile": t1 - t0, "object": t2 - t1, "link": t3 - t2}, obj, lib, names


def kernels(obj: str) -> dict[str, list[str]]:
    """The object's functions, each its instructions (the entry functions and error helpers left out)."""
    text = subprocess.run(["objdump", "-d", "--no-show-raw-insn", obj], capture_output=True, text=True).stdout
    funcs: dict[str, list[str]] = {}
    name = None
    for line in text.splitlines():
        if m := re.match(r"[0-9a-f]+ <(.+)>:", line):
            name = m.group(1)
            funcs[name] = []
        elif name and "\t" in line:  # a jump's target as <function+offset>, not as its address in .text
            funcs[name].append(re.sub(r"\b[0-9a-f]+ (<[^>]+>)", r"\1", line.split("\t", 1)[1]))
    return {n: ins for n, ins in funcs.items() if not n.startswith(("__tvm_ffi_", "__tvm_set_raised"))}


def time_pair(libs, name: str, args, rounds: int, repeat_ms: int) -> list[float]:
    """Per round, function ``name`` of the two libraries timed in turn (order alternating): ``[old, new]``
    medians."""
    import tvm

    dev = tvm.cpu()
    evaluators = [lib.time_evaluator(name, dev, number=1, repeat=1, min_repeat_ms=repeat_ms) for lib in libs]
    for ev in evaluators:
        ev(*args)  # warm-up
    secs: list[list[float]] = [[], []]
    for r in range(rounds):
        for k in (0, 1) if r % 2 == 0 else (1, 0):
            secs[k].append(evaluators[k](*args).mean)
    return [statistics.median(s) for s in secs]


def main() -> None:
    import tvm
    from session_batches import search_batch_arguments, search_batches
    from tvm.s_tir.meta_schedule.runner.local_runner import default_alloc_argument

    ap = search_batch_arguments()
    ap.add_argument("--timing-rounds", type=int, default=9)
    ap.add_argument("--repeat-ms", type=int, default=10)
    ap.add_argument("--out")
    args = ap.parse_args()
    target, found = search_batches(args.model, args.tasks, args.batch)
    shares = [cands[k : k + SHARE] for _, cands in found for k in range(0, len(cands), SHARE)]
    n = sum(len(s) for s in shares)
    out_dir = tempfile.mkdtemp()
    stages = {way: {"compile": [], "object": [], "link": []} for way in WAYS}
    last: dict = {}
    for r in range(args.rounds):
        for s, share in enumerate(shares):
            for way in WAYS if (r + s) % 2 == 0 else WAYS[::-1]:
                seconds, obj, lib, names = build([c.sch.mod for c in share], target, way, out_dir)
                for k, v in seconds.items():
                    stages[way][k].append(v)
                last[(s, way)] = (obj, lib, names)
    report: dict = {"model": os.path.basename(args.model), "candidates": n, "rounds": args.rounds}
    report["build_ms_per_candidate"] = {
        way: {k: sum(v) / (n * args.rounds) * 1e3 for k, v in st.items()} for way, st in stages.items()
    }
    same = differ = 0
    for s in range(len(shares)):
        old, new = kernels(last[(s, WAYS[0])][0]), kernels(last[(s, WAYS[1])][0])
        for name, ins in old.items():
            same, differ = (same + 1, differ) if new.get(name) == ins else (same, differ + 1)
    report["kernel_functions"] = {"identical": same, "different": differ}
    report["object_bytes_per_share"] = {
        way: statistics.mean(os.path.getsize(last[(s, way)][0]) for s in range(len(shares))) for way in WAYS
    }
    ratios = []
    dev = tvm.cpu()
    for s, share in enumerate(shares):
        libs = [tvm.runtime.load_module(last[(s, way)][1]) for way in WAYS]
        for k, cand in enumerate(share):
            cand_args = default_alloc_argument(dev, [a.as_json() for a in cand.args_info], 1)[0]
            name = last[(s, WAYS[0])][2][k]
            old, new = time_pair(libs, name, cand_args, args.timing_rounds, args.repeat_ms)
            ratios.append(new / old)
    ratios.sort()
    report["kernel_time_new_over_old"] = {
        "median": statistics.median(ratios),
        "p10": ratios[len(ratios) // 10],
        "p90": ratios[(9 * len(ratios)) // 10],
        "min": ratios[0],
        "max": ratios[-1],
    }
    print(json.dumps(report, indent=1))
    if args.out:
        json.dump(report, open(args.out, "w"), indent=1)


if __name__ == "__main__":
    main()
