"""What folding constants in one LLVM build saves a run's extraction and compile: each model lowered into
its fused tasks (the passes every run and every compile use, ``dynatune.model.extract.fuse_passes``) twice
per round, alternating: once as TVM's ``FoldConstant`` alone folds it, once with
``dynatune.model.constant_folding`` first. Reported per model: the seconds of each (median [min, max]
over ``--rounds``), their ratio, how many calls on constants were folded, and whether the two fused modules
are the same (structurally, constants' bytes included)::

    python -m bench.constant_folding M.onnx [M.onnx ...] [--rounds 2] \\
        [--out bench/results/constant_folding.json]
"""

from __future__ import annotations

import datetime
import sys
import time

from bench.harness import parser, results_path, spread, stem, write_json


def pipelines(target) -> tuple[list, dict]:
    """The lowering's passes before constant folding, and the two ways on from there:
    ``{"fold_constant_alone": passes, "one_build": passes}``."""
    from dynatune.model.extract import fuse_passes

    passes = fuse_passes(target)
    at = [p.info.name for p in passes].index("FoldCallsOnConstants")
    return passes[:at], {"fold_constant_alone": passes[at + 1 :], "one_build": passes[at:]}


def lower_both_ways(model, target) -> dict:
    """One round: the seconds with FoldConstant alone and with the one-build folding first, and the two
    fused modules."""
    import tvm

    before, ways = pipelines(target)
    out = {}
    for name, after in ways.items():
        with target, tvm.transform.PassContext(opt_level=3):
            t0 = time.perf_counter()
            fused = tvm.transform.Sequential(before + after)(model.bound_module())
            out[name] = (time.perf_counter() - t0, fused)
    return out


def folded_calls(model, target) -> int:
    """How many calls on constants the one-build folding evaluates in ``model``'s lowering."""
    import tvm

    from dynatune.model.constant_folding import calls_on_constants

    before, _ = pipelines(target)
    with target, tvm.transform.PassContext(opt_level=3):
        legalized = tvm.transform.Sequential(before)(model.bound_module())
    return len(calls_on_constants(legalized, legalized["main"]))


def measure(path: str, rounds: int) -> dict:
    import tvm_ffi

    from dynatune.machine.target import make_target
    from dynatune.model.importer import load_model

    model, target = load_model(path), make_target()
    seconds = {"fold_constant_alone": [], "one_build": []}
    same = True
    for _ in range(rounds):
        both = lower_both_ways(model, target)
        for name, (s, _) in both.items():
            seconds[name].append(s)
        same = same and tvm_ffi.structural_equal(both["fold_constant_alone"][1], both["one_build"][1])
    return {
        "model": stem(path),
        "path": path,
        "calls_on_constants": folded_calls(model, target),
        "seconds": {name: spread(v) for name, v in seconds.items()},
        "ratio": spread(o / a for o, a in zip(seconds["one_build"], seconds["fold_constant_alone"])),
        "same_module": same,
    }


def main(argv=None) -> int:
    ap = parser(__doc__)
    ap.add_argument("models", nargs="+", help="ONNX files")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--out", default=results_path("constant_folding.json"))
    args = ap.parse_args(argv)
    from dynatune.machine.target import cpu_model_and_isa

    rows = []
    for path in args.models:
        row = measure(path, args.rounds)
        rows.append(row)
        s = row["seconds"]
        print(
            f"{row['model']}: {row['calls_on_constants']} calls on constants; FoldConstant alone "
            f"{s['fold_constant_alone']['median']:.2f} s, one build {s['one_build']['median']:.2f} s "
            f"({row['ratio']['median']:.2f}x); same module: {row['same_module']}",
            flush=True,
        )
    doc = {
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "cpu": cpu_model_and_isa()[0],
        "isa": cpu_model_and_isa()[1],
        "rounds": args.rounds,
        "models": rows,
    }
    write_json(args.out, doc)
    return 0 if all(r["same_module"] for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
