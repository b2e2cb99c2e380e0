"""What a tuned model's calls cost without their kernels: a run's artifact beside the same model with every
kernel emptied (:mod:`dynatune.compiler.dispatch`), timed in one process, interleaved.

    python -m bench.dispatch W1 [W2 ...] [--rounds 20] [--block-ms 200] [--label L]

Each ``W`` is a run's work dir: its ``model.so`` is timed as it is, and the empty twin is built from the
records its compile reads (each task's best, where it beats the default schedule) with the lowering it
was compiled with (its config's, with the convolutions its Winograd choice kept direct lowered direct: the
calls of both are counted by the profile's instrument and must be the same). Blocks of runs as the
profile times the model (``invoke_stateful`` on its entry), their order reversed every other round.
Reported per model: the artifact's and the empty twin's median ms, and the twin's share of the artifact
per round, median [min, max]: what the VM's instructions, the calls' argument checks and the builtins cost
a run, against issue #55's 3 % for calls no task stands for and time between calls. Appended to
``bench/results/dispatch.json``.
"""

from __future__ import annotations

import datetime
import os

from bench.harness import parser, read_json, results_path, spread, write_json


def measure(work: str, rounds: int, block_ms: float) -> dict:
    import tvm

    from dynatune.compiler.dispatch import empty_kernels_executable
    from dynatune.compiler.profile import make_vm, profile_calls
    from dynatune.compiler.timing import interleave, vm_block_timer
    from dynatune.compiler.winograd_choice import chosen_lowering
    from dynatune.files import WorkDir
    from dynatune.run.config import saved_config
    from dynatune.run.pipeline import TuningRun

    wd = WorkDir(work)
    cfg = saved_config(work)
    dev = tvm.cpu()
    with TuningRun(cfg) as r:  # the records the run's compile reads: a task's best where it beats its default
        model = r.model
        database = r.session.compile_database()
        # as the run compiled it: the convolutions its Winograd choice kept direct lowered direct
        lowering = chosen_lowering(cfg.compile.lowering(), wd.report_dir)
        empty = empty_kernels_executable(model, r.target, database, lowering)
    vms = {"model": make_vm(wd.model_so, dev), "empty": make_vm(empty, dev)}
    inputs = model.random_inputs(0)
    calls = {}
    for name, lib in (("model", wd.model_so), ("empty", empty)):  # on VMs of their own: the instrument stays
        runs, _ = profile_calls(make_vm(lib, dev), model, inputs, dev, block_ms=1, min_runs=1)
        # a kernel's name without its prepacked suffix: the direct kernels a run's Winograd choice compiled
        # are not in the records the twin reads, and a kernel of the default schedule reads its weight as
        # it lies: the same call, with an argument of the same count
        calls[name] = {sym.replace("_prepacked", ""): n for sym, (n, _secs) in runs[-1].items()}
    if calls["empty"] != calls["model"]:
        raise SystemExit(f"{work}: the empty twin's calls are not the artifact's: {calls}")
    model_ms, empty_ms = interleave(
        [vm_block_timer(vm, inputs, dev, block_ms) for vm in vms.values()], rounds
    )
    return {
        "work_dir": os.path.abspath(work),
        "model": model.name,
        "calls_a_run": sum(calls["model"].values()),
        "model_ms": spread(model_ms)["median"],
        "dispatch_ms": spread(empty_ms)["median"],
        "dispatch_share": spread(e / m for e, m in zip(empty_ms, model_ms)),
    }


def main(argv=None) -> dict:
    ap = parser(__doc__)
    ap.add_argument("work_dirs", nargs="+")
    ap.add_argument("--rounds", type=int, default=20)
    ap.add_argument("--block-ms", type=float, default=200.0)
    ap.add_argument("--label", default="")
    ap.add_argument("--out", default=results_path("dispatch.json"))
    args = ap.parse_args(argv)
    rows = []
    for work in args.work_dirs:
        row = measure(work, args.rounds, args.block_ms)
        s = row["dispatch_share"]
        print(
            f"{row['model']:>30}: {row['calls_a_run']} calls a run; model {row['model_ms']:.3f} ms, "
            f"its calls with empty kernels {row['dispatch_ms'] * 1e3:.1f} us = {100 * s['median']:.2f} % "
            f"[{100 * s['min']:.2f}, {100 * s['max']:.2f}]",
            flush=True,
        )
        rows.append(row)
    entry = {
        "label": args.label,
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "rounds": args.rounds,
        "block_ms": args.block_ms,
        "rows": rows,
    }
    write_json(args.out, read_json(args.out, []) + [entry])
    return entry


if __name__ == "__main__":
    main()
