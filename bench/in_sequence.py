"""Each kernel of a compiled model, timed as the model runs it and again right after: where the model's time
goes beyond its kernels alone (issue #27).

    python bench/in_sequence.py --model M --artifact RUN/model.so [--artifact OTHER.so ...] [--rounds 40]
        [--threads 1] [--json OUT]

The VM's instrument records the kernel calls of one inference with their arguments (the model's own
buffers, so each kernel reads what its producer wrote). Then, ``--rounds`` times, every kernel is called
in the model's order from Python and timed twice in a row: *first* is its time in the model's sequence (its
input just written by the kernel before, possibly on the other core; its weights back from L3), *again*
its time with all of that in its own caches, as a kernel timed alone sees it, and *after its producer* its
time once the kernel before it ran again: its weights warm from the two calls before, its input just
written as in the model. Per kernel the medians over rounds, and their sums: first / again is what the
model's order costs its kernels; where *after its producer* lands between them says how much of that is
the input (written by the producer, on whichever core) and how much the weights (back from L3). Run it in a
fresh process per thread count (``--threads`` sets ``TVM_NUM_THREADS`` before TVM starts). Each artifact
is also timed whole (``invoke_stateful``) to show what the VM adds to the sum of first-in-sequence times.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)


def recorded_kernels(vm, model, inputs, device) -> list[tuple[str, object, list]]:
    """(symbol, callable, arguments) of every kernel one inference calls, in order."""
    import tvm
    from tvm.runtime.vm import VMInstrumentReturnKind

    calls = []

    def record(func, symbol, before, _ret, *args):
        if before and not symbol.startswith("vm.builtin."):
            calls.append((symbol, func, list(args)))
        return int(VMInstrumentReturnKind.NO_OP)

    vm.set_instrument(record)
    vm.set_input("main", *[tvm.runtime.tensor(inputs[i.name], device) for i in model.inputs])
    vm.invoke_stateful("main")
    return calls


def first_and_again(calls, rounds: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per kernel, the median seconds of its call in the model's order, of the same call repeated, and of
    a call after its predecessor ran again (its weights warm from the first call, its input just written
    as in the model)."""
    clock = time.perf_counter
    times = np.zeros((3, rounds, len(calls)))
    for r in range(rounds):
        for k, (_, func, args) in enumerate(calls):
            t0 = clock()
            func(*args)
            t1 = clock()
            func(*args)
            t2 = clock()
            if k > 0:
                calls[k - 1][1](*calls[k - 1][2])
            t3 = clock()
            func(*args)
            times[:, r, k] = t1 - t0, t2 - t1, clock() - t3
    first, again, after_producer = np.median(times, 1)
    return first, again, after_producer


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", required=True)
    ap.add_argument("--artifact", action="append", required=True, help="a compiled model.so")
    ap.add_argument("--rounds", type=int, default=40)
    ap.add_argument("--threads", type=int, help="TVM_NUM_THREADS (default: TVM's own)")
    ap.add_argument("--top", type=int, default=8, help="kernels listed per artifact, by first - again")
    ap.add_argument("--json")
    args = ap.parse_args()
    if args.threads:
        os.environ["TVM_NUM_THREADS"] = str(args.threads)
    import tvm

    from dynatune.compiler.profile import make_vm
    from dynatune.model.importer import load_model

    model, device = load_model(args.model), tvm.cpu()
    inputs, rows = model.random_inputs(0), []
    for path in args.artifact:
        calls = recorded_kernels(make_vm(path, device), model, inputs, device)
        first, again, after_producer = first_and_again(calls, args.rounds)
        whole = make_vm(path, device)
        whole.set_input("main", *[tvm.runtime.tensor(inputs[i.name], device) for i in model.inputs])
        timer = whole.time_evaluator("invoke_stateful", device, 1, args.rounds, min_repeat_ms=50)
        model_ms = float(np.median(timer("main").results)) * 1e3
        row = {
            "artifact": path,
            "threads": args.threads or "default",
            "kernels": len(calls),
            "model_ms": model_ms,
            "first_ms": float(first.sum()) * 1e3,
            "again_ms": float(again.sum()) * 1e3,
            "after_producer_ms": float(after_producer.sum()) * 1e3,
            "per_kernel": [
                {
                    "kernel": s,
                    "first_ms": float(f) * 1e3,
                    "again_ms": float(a) * 1e3,
                    "after_producer_ms": float(p) * 1e3,
                }
                for (s, _, _), f, a, p in zip(calls, first, again, after_producer)
            ],
        }
        rows.append(row)
        print(
            f"{path}: model {model_ms:.3f} ms; {len(calls)} kernels: in sequence {row['first_ms']:.3f} ms, "
            f"again {row['again_ms']:.3f} ms ({row['first_ms'] / row['again_ms']:.2f}x), after its producer "
            f"ran again {row['after_producer_ms']:.3f} ms"
        )
        for k in np.argsort(-(first - again))[: args.top]:
            print(
                f"  {calls[k][0][:48]:48s}",
                *(f"{t[k] * 1e3:8.4f}" for t in (first, again, after_producer)),
            )
    if args.json:
        with open(args.json, "w") as f:
            out = {"model": os.path.basename(args.model), "rounds": args.rounds, "rows": rows}
            json.dump(out, f, indent=1)


if __name__ == "__main__":
    main()
