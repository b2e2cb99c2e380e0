"""Convolutions padded and sliced back inside their own kernel (``dynatune.model.channel_padding``): each
padded task's analytic first candidates against the same convolution lowered without that padding.

    python bench/sliced_padding.py --model ../shared/models/mnasnet0_5.onnx [--rounds 7] [--json OUT]

The model is lowered twice for this machine's target: as shipped, and with the in-kernel slices turned off
(a convolution is then padded only before a global pooling, as before session 26). Every task of the first
whose convolution is padded and sliced in its kernel is paired with the task of the second that has the same
input, output and weight; the analytic candidates of both
(:func:`~dynatune.search.analytic.task_analytic_candidates`) are built and timed interleaved, round by round
(median of the rounds, best candidate of each side). The table gives each pair's times and their ratio, and
the weighted sum over the pairs: what the padding changes in a model whose tasks kept their first
candidates.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from unittest import mock

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.join(ROOT, "bench"))


def shape_pair(task) -> tuple:
    """What pairs a task across the two lowerings: its input's and output's shapes, and its weight."""
    func = task.mod["main"]
    return (
        tuple(int(d) for d in func.params[0].ty.shape),
        tuple(int(d) for d in func.params[-1].ty.shape),
        task.weight,
    )


def padded_pairs(model, target) -> list[tuple]:
    """``(sliced task, unsliced task)`` for each convolution the shipped lowering pads and slices in its
    kernel."""
    from dynatune.model import channel_padding
    from dynatune.model.extract import extract_tasks

    shipped = [t for t in extract_tasks(model, target) if "conv2d" in t.name and "strided_slice" in t.name]
    with mock.patch.object(channel_padding, "_worth_a_slice_in_its_kernel", lambda *a: False):
        before = {shape_pair(t): t for t in extract_tasks(model, target) if "conv2d" in t.name}
    return [(t, before[shape_pair(t)]) for t in shipped if shape_pair(t) in before]


def main() -> None:
    from kernels import tvm_timer

    from dynatune.machine.target import make_target
    from dynatune.model.importer import load_model
    from dynatune.search.analytic import task_analytic_candidates

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", required=True)
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--json")
    args = ap.parse_args()
    target = make_target()
    pairs = padded_pairs(load_model(args.model), target)
    timers = {}
    for k, pair in enumerate(pairs):
        for side, task in zip(("sliced", "before"), pair):
            candidates, _ = task_analytic_candidates(task.mod, target)
            for j, c in enumerate(candidates):
                timers[(k, side, j)] = tvm_timer(c.sch.mod, target)[0]
    times = {key: [] for key in timers}
    for _ in range(args.rounds):
        for key, once in timers.items():
            times[key].append(once())
    rows, total = [], {"sliced": 0.0, "before": 0.0}
    for k, (sliced, before) in enumerate(pairs):
        best = {
            side: min(statistics.median(v) for key, v in times.items() if key[:2] == (k, side))
            for side in ("sliced", "before")
        }
        for side in total:
            total[side] += best[side] * sliced.weight
        func = sliced.mod["main"]
        rows.append(
            {
                "task": before.name,
                "sliced_task": sliced.name,
                "weight": sliced.weight,
                "input": list(shape_pair(sliced)[0]),
                "channels": int(func.params[-1].ty.shape[-1]),
                "padded": int(func.params[int(func.attrs["layout_free_buffers"][0])].ty.shape[0]),
                "before_us": round(best["before"] * 1e6, 2),
                "sliced_us": round(best["sliced"] * 1e6, 2),
                "ratio": round(best["sliced"] / best["before"], 3),
            }
        )
    print("| task (unpadded) | weight | input | channels -> padded | before us | sliced us | sliced/before |")
    print("|---|---:|---|---|---:|---:|---:|")
    for r in rows:
        print(
            f"| `{r['task']}` | {r['weight']} | {'x'.join(map(str, r['input']))} | {r['channels']} -> "
            f"{r['padded']} | {r['before_us']:.1f} | {r['sliced_us']:.1f} | {r['ratio']:.3f} |"
        )
    print(f"weighted sum: before {total['before'] * 1e6:.1f} us, sliced {total['sliced'] * 1e6:.1f} us")
    if args.json:
        with open(args.json, "w") as f:
            doc = {"model": args.model, "target": str(target), "rounds": args.rounds, "rows": rows}
            doc["weighted_us"] = {k: v * 1e6 for k, v in total.items()}
            doc["date"] = time.strftime("%Y-%m-%d %H:%M")
            json.dump(doc, f, indent=1)


if __name__ == "__main__":
    main()
