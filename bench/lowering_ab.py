"""Compiled models side by side with ONNX Runtime, in one process: the same tuning records compiled with
different lowerings (what a compile-time rewrite is worth on its own, the search's luck taken out; issue
#27), or the artifacts of several runs.

    python -m bench.lowering_ab --model M --work-dir W --variant copied:place_concat=false \\
        --variant placed: [--rounds 20] [--block-ms 200] [--label L]
    python -m bench.lowering_ab --model M --artifact before=RUN1/model.so --artifact after=RUN2/model.so

``--variant NAME:FIELD=VALUE,...`` is the model built from the work dir's records (``compile.build``, the
records read only) with a :class:`~dynatune.model.extract.Lowering` whose fields are set as given (the
others at the lowering's defaults, recorded with the results). Only fields that keep the task keys compare
this way (``place_concat``); the others (``prepack``, ``conv_layout``, ``fast_math``) change the keys, and
the records would not apply. ``--artifact NAME=PATH`` adds a compiled model (a run's ``model.so``) as it is.

Each is checked against ONNX Runtime on 3 random inputs, then every one and ONNX Runtime (the same
threads) are timed as their users call them, in blocks, their order reversed every other round
(:func:`bench.harness.side_by_side`). Reported per variant: the median ms, and the per-round ratio to the
first variant and to ONNX Runtime as median [min, max]; appended to ``bench/results/lowering_ab.json``
with the machine's load during the timing.
"""

from __future__ import annotations

import dataclasses
import datetime
import os

from bench.harness import parser, read_json, results_path, side_by_side, write_json


def parse_variant(text: str) -> tuple[str, dict]:
    name, _, fields = text.partition(":")
    values = {}
    for item in filter(None, fields.split(",")):
        key, _, value = item.partition("=")
        values[key] = {"true": True, "false": False}.get(value.lower(), value)
    return name, values


def main(argv=None) -> dict:
    ap = parser(__doc__)
    ap.add_argument("--model", required=True)
    ap.add_argument("--work-dir", help="a run's work dir: its records are compiled")
    ap.add_argument("--variant", action="append", default=[], help="NAME:FIELD=VALUE,... (a Lowering)")
    ap.add_argument("--artifact", action="append", default=[], help="NAME=PATH: a compiled model.so")
    ap.add_argument("--rounds", type=int, default=20)
    ap.add_argument("--block-ms", type=float, default=200.0)
    ap.add_argument("--label", default="")
    ap.add_argument("--out", default=results_path("lowering_ab.json"))
    args = ap.parse_args(argv)
    if args.variant and not args.work_dir:
        ap.error("--variant needs --work-dir")
    if not args.variant and not args.artifact:
        ap.error("give a --variant or an --artifact")

    import tvm

    from dynatune.compiler.compile import build, verify
    from dynatune.compiler.execution import load, relax_vm
    from dynatune.files import WorkDir
    from dynatune.machine.target import make_target, usable_cores
    from dynatune.model.extract import Lowering
    from dynatune.model.importer import load_model
    from dynatune.search.database import TuningDatabase

    model, target, dev, threads = load_model(args.model), make_target(), tvm.cpu(), usable_cores()
    records = TuningDatabase(WorkDir(args.work_dir).db, read_only=True).memory if args.variant else None
    variants = [parse_variant(v) for v in args.variant]
    variants += [(name, {"artifact": path}) for name, path in (a.partition("=")[::2] for a in args.artifact)]
    vms, settings, errors = {}, {}, {}
    for name, fields in variants:
        if "artifact" in fields:
            vms[name], settings[name] = load(fields["artifact"], dev), fields
        else:
            lowering = Lowering(**fields)
            vms[name] = relax_vm(build(model, target, records, lowering), dev)
            settings[name] = {"lowering": dataclasses.asdict(lowering)}
        errors[name] = verify(vms[name], model, dev, threads=threads).max_rel_err
    timing = side_by_side(model, vms, args.rounds, args.block_ms, threads)
    first = variants[0][0]
    for row in timing["variants"]:
        row |= {"settings": settings[row["variant"]], "max_rel_err": errors[row["variant"]]}
        f, o = row["vs_first"], row["vs_onnxruntime"]
        print(
            f"{row['variant']:>12}: {row['ms']:.3f} ms  / {first} {f['median']:.3f} [{f['min']:.3f}, "
            f"{f['max']:.3f}]  / ONNX Runtime {o['median']:.3f} [{o['min']:.3f}, {o['max']:.3f}]  "
            f"max rel err {row['max_rel_err']:.1e}"
        )
    print(f"ONNX Runtime: {timing['onnxruntime_ms']:.3f} ms; busy cores during the timing: {timing['load']}")
    entry = {
        "label": args.label,
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "model": os.path.basename(args.model),
        "work_dir": os.path.abspath(args.work_dir) if args.work_dir else None,
        **timing,
    }
    write_json(args.out, read_json(args.out, []) + [entry])
    return entry


if __name__ == "__main__":
    main()
