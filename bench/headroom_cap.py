"""Replay: the headroom belief with a kind's attained fraction of the roofline bound capped at 1.0 (as it is)
against the same belief with the cap lifted, on the recorded traces (``dynatune/bench/data/traces``).

    python bench/headroom_cap.py [MODEL ...] [--draws 8] [--scale 1.0 --scale 1.3]

Each task's bound is the recorded one times ``--scale`` (a peak underestimated by that factor, as the
1024^3 SGEMM's is on Zen 4). Per model and scale: the tasks whose recorded best beats their bound, and the
DynaTune scheduler's objective at 10 % and 25 % of the model's recorded time, lifted over capped, per draw.
"""

from __future__ import annotations

import argparse
import copy
import os
import statistics
import sys

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

from dynatune.beliefs import headroom  # noqa: E402
from dynatune.bench.replay import default_slot, objective_at, replay, total_trace_seconds  # noqa: E402
from dynatune.bench.replay_bench import draw_rng  # noqa: E402
from dynatune.bench.traces import draw, load_traces, task_bound  # noqa: E402
from dynatune.schedulers import make_scheduler  # noqa: E402

TRACES = os.path.join(os.path.dirname(__file__), "..", "dynatune", "bench", "data", "traces")
_fit = headroom.HeadroomBeliefs._fit_attainable


def _lifted_fit(self, tasks):
    """``_fit_attainable`` with its ``min(x, 1.0)`` caps lifted (the module's ``min`` shadowed meanwhile)."""

    def uncapped_min(*args, **kwargs):
        if len(args) == 2 and 1.0 in args and not kwargs:
            return args[0] if args[1] == 1.0 else args[1]
        return min(*args, **kwargs)

    headroom.min = uncapped_min
    try:
        return _fit(self, tasks)
    finally:
        del headroom.min


def with_bounds_scaled(doc, scale: float):
    doc = copy.deepcopy(doc)
    for row in doc["tasks"]:
        row["bound_s"] = task_bound(doc, row) * scale
    return doc


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("models", nargs="*", default=["squeezenet1_1", "mnasnet0_5", "transformer_tiny"])
    ap.add_argument("--draws", type=int, default=8)
    ap.add_argument("--scale", type=float, action="append")
    args = ap.parse_args(argv)
    for model in args.models:
        doc = load_traces(os.path.join(TRACES, f"{model}.json"))
        total, slot = total_trace_seconds(doc), default_slot(doc)
        for scale in args.scale or [1.0, 1.3]:
            ratios, beat = [], None
            for d in range(args.draws):
                drawn = with_bounds_scaled(draw(doc, draw_rng(0, d)), scale)
                if beat is None:
                    beat = sum(1 for r in drawn["tasks"] if min(p[2] for p in r["trace"]) < r["bound_s"])
                for frac in (0.1, 0.25):
                    at = {}
                    for name, fit in (("capped", _fit), ("lifted", _lifted_fit)):
                        headroom.HeadroomBeliefs._fit_attainable = fit
                        try:
                            curve = replay(drawn, make_scheduler("dynatune", d), frac * total, slot).curve
                        finally:
                            headroom.HeadroomBeliefs._fit_attainable = _fit
                        at[name] = objective_at(curve, frac * total)
                    ratios.append(at["lifted"] / at["capped"])
            print(
                f"{model} bounds x{scale}: {beat}/{len(doc['tasks'])} tasks beat their bound; "
                f"lifted / capped objective: median {statistics.median(ratios):.4f} "
                f"[{min(ratios):.4f}, {max(ratios):.4f}] over {len(ratios)}",
                flush=True,
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
