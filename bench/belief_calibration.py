"""How well do the belief models predict the next slot's gain on the recorded traces? Old (curves) vs new
(headroom), on every recorded seed's traces.

Replays round-robin over each model's whole recorded time, once per recorded seed, and before every slot
asks each belief model for the predicted weighted gain (mean, std) of that slot; then compares with the
gain the trace realised (:mod:`dynatune.bench.belief_calibration`). Reports, per model and belief model, over
the slots after each task's first: the rank correlation (Spearman) of the predicted mean with the realised
gain, the same with both averaged over the seeds at each (task, slot number), plain weighted latency's
rank correlation, the coverage of ``mean +- 2 std`` and the share of slots that gained nothing.

With ONNX Runtime's per-operator times for a model's tasks (``bench/trace_anchors.py``), the headroom
model is scored a second time with them as reachable floors (``headroom+anchors``).

    python bench/belief_calibration.py        # writes bench/results/belief_calibration.json
"""

import json
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
from dynatune.beliefs import BELIEFS, make_beliefs  # noqa: E402
from dynatune.bench.belief_calibration import calibration_scores, seed_rows  # noqa: E402
from dynatune.bench.traces import available_traces, load_traces, recorded_seeds, with_anchors  # noqa: E402
from dynatune.errors import DynatuneError  # noqa: E402


def main() -> None:
    out = {}
    for m in available_traces():
        doc = load_traces(m)
        seeds = recorded_seeds(doc)
        out[m] = {"seeds": seeds, "roofline": doc.get("roofline")}
        try:
            anchored = with_anchors(doc)
        except DynatuneError:
            anchored = None
        variants = [(name, doc, name) for name in BELIEFS]
        variants += [("headroom+anchors", anchored, "headroom")] if anchored else []
        for label, trace_doc, name in variants:
            s = calibration_scores(seed_rows(trace_doc, lambda name=name: make_beliefs(name), seeds))
            out[m][label] = s
            print(
                f"{m:18s} {label:16s} slots {s['slots']:4d}  spearman {_f(s['spearman'])}  "
                f"seed-mean {_f(s['spearman_seed_mean'])}  "
                f"weighted latency {_f(s['spearman_weighted_latency'])}  "
                f"coverage {_f(s['coverage'])}  zero-gain {_f(s['zero_gain_share'])}",
                flush=True,
            )
    path = os.path.join(os.path.dirname(os.path.abspath(__file__)), "results", "belief_calibration.json")
    with open(path, "w") as f:
        json.dump(out, f, indent=1)


def _f(x) -> str:
    return "  n/a" if x is None else f"{x:5.2f}"


if __name__ == "__main__":
    main()
