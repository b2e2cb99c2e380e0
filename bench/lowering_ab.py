"""The same tuning records compiled with different lowerings, timed side by side with ONNX Runtime: what a
compile-time rewrite is worth on its own, with the search's luck taken out (issue #27).

    python bench/lowering_ab.py --model M --work-dir W --variant copied:place_concat=false --variant placed: \
        [--rounds 20] [--label L]

``--artifact NAME=PATH`` adds a compiled model (a run's ``model.so``) as it is: two runs' artifacts, say,
timed side by side in one process (no ``--work-dir`` needed then).

Each ``--variant NAME:FIELD=VALUE,...`` is the model built from the work dir's records (``compile.build``,
the records read only) with a :class:`~dynatune.model.extract.Lowering` whose fields are set as given, and
checked against ONNX Runtime on 3 random inputs. Only fields that keep the task keys compare this way
(``place_concat``); the others (``prepack``, ``conv_layout``, ``fast_math``) change the keys, and the
records would not apply. Then every variant and ONNX Runtime (the same threads) are timed in one process,
in 200 ms blocks, their order reversed every other round. Reported per variant: the median ms, and the
per-round ratio to the first variant and to ONNX Runtime as median [min, max]; appended to
``bench/results/lowering_ab.json`` with the machine's load during the timing.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import statistics
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)


def parse_variant(text: str) -> tuple[str, dict]:
    name, _, fields = text.partition(":")
    values = {}
    for item in filter(None, fields.split(",")):
        key, _, value = item.partition("=")
        values[key] = {"true": True, "false": False}.get(value.lower(), value)
    return name, values


def spread(values: list[float]) -> dict:
    return {"median": statistics.median(values), "min": min(values), "max": max(values)}


def main() -> None:
    import tvm

    from dynatune.compiler.compile import build, verify
    from dynatune.compiler.execution import load, onnxruntime_session, relax_vm
    from dynatune.compiler.timing import interleave, ort_block_timer, vm_block_timer
    from dynatune.files import WorkDir
    from dynatune.machine.load import LoadProbe
    from dynatune.machine.target import make_target, usable_cores
    from dynatune.model.extract import Lowering
    from dynatune.model.importer import load_model
    from dynatune.search.database import TuningDatabase

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", required=True)
    ap.add_argument("--work-dir", help="a run's work dir: its records are compiled")
    ap.add_argument("--variant", action="append", default=[], help="NAME:FIELD=VALUE,... (a Lowering)")
    ap.add_argument("--artifact", action="append", default=[], help="NAME=PATH: a compiled model.so")
    ap.add_argument("--rounds", type=int, default=20)
    ap.add_argument("--label", default="")
    ap.add_argument("--out", default=os.path.join(ROOT, "bench", "results", "lowering_ab.json"))
    args = ap.parse_args()

    model, target, dev, threads = load_model(args.model), make_target(), tvm.cpu(), usable_cores()
    if args.variant and not args.work_dir:
        ap.error("--variant needs --work-dir")
    records = TuningDatabase(WorkDir(args.work_dir).db, read_only=True).memory if args.variant else None
    inputs = model.random_inputs(0)
    variants = [parse_variant(v) for v in args.variant]
    artifacts = [a.partition("=")[::2] for a in args.artifact]
    variants += [(name, {"artifact": path}) for name, path in artifacts]
    timers, errors = [], {}
    for name, fields in variants:
        if "artifact" in fields:
            vm = load(fields["artifact"], dev)
        else:
            vm = relax_vm(build(model, target, records, Lowering(**fields)), dev)
        errors[name] = verify(vm, model, dev, threads=threads).max_rel_err
        timers.append(vm_block_timer(vm, inputs, dev, 200.0))
    sess = onnxruntime_session(model, threads)
    probe = LoadProbe()
    *tvm_ms, ort_ms = interleave([*timers, ort_block_timer(sess, inputs, 200.0)], args.rounds, 0.05)
    load = probe.stop().as_dict()
    rows = []
    for (name, fields), ms in zip(variants, tvm_ms):
        row = {
            "variant": name,
            "lowering": fields,
            "ms": statistics.median(ms),
            "vs_first": spread([a / b for a, b in zip(ms, tvm_ms[0])]),
            "vs_onnxruntime": spread([a / b for a, b in zip(ms, ort_ms)]),
            "max_rel_err": errors[name],
        }
        rows.append(row)
        print(
            f"{name:>12}: {row['ms']:.3f} ms  / {variants[0][0]} {row['vs_first']['median']:.3f} "
            f"[{row['vs_first']['min']:.3f}, {row['vs_first']['max']:.3f}]  / ONNX Runtime "
            f"{row['vs_onnxruntime']['median']:.3f} [{row['vs_onnxruntime']['min']:.3f}, "
            f"{row['vs_onnxruntime']['max']:.3f}]  max rel err {row['max_rel_err']:.1e}"
        )
    print(f"ONNX Runtime: {statistics.median(ort_ms):.3f} ms; busy cores during the timing: {load}")
    entry = {
        "label": args.label,
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "model": os.path.basename(args.model),
        "work_dir": os.path.abspath(args.work_dir) if args.work_dir else None,
        "rounds": args.rounds,
        "onnxruntime_ms": statistics.median(ort_ms),
        "load": load,
        "variants": rows,
    }
    results = json.load(open(args.out)) if os.path.exists(args.out) else []
    with open(args.out, "w") as f:
        json.dump(results + [entry], f, indent=1)


if __name__ == "__main__":
    main()
