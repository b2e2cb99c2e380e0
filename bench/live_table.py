"""The BENCHMARKS.md tables of a live scheduler benchmark (``dynatune bench live``), from its raw JSON.

    python bench/live_table.py [bench/results/live14/live.json]

Per (model, seed): each scheduler's measured model at its periodic points and at the end, its estimate at
a quarter, half, three quarters and all of the budget, and its final ratio to ONNX Runtime. Then TTQ: the
seconds of tuning each scheduler needed to reach gradient's final quality (x (1 + rtol)), on the measured
model and on the estimate, and whether DynaTune counts as sooner (``dynatune.bench.livebench.SOONER``).
"""

import json
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
from dynatune.bench.replay import objective_at  # noqa: E402

path = sys.argv[1] if len(sys.argv) > 1 else "bench/results/live14/live.json"
doc = json.load(open(path))
budget = doc["budget_s"]


def ms(x):
    return "never" if x is None else f"{x:.0f}"


print(
    "| model | seed | scheduler | measured model at the periodic points / end (ms) "
    "| estimate at 25 / 50 / 75 / 100 % (ms) | final vs ONNX Runtime |"
)
print("|---|---|---|---|---|---|")
for p in doc["pairs"]:
    for k, r in p["runs"].items():
        # the last measured point is the final compiled model
        meas = " / ".join(f"{v * 1e3:#.3g}" for _, v in r["measured"][:-1]) + f" / **{r['latency_ms']:#.3g}**"
        est = " / ".join(f"{objective_at(r['curve'], f * budget) * 1e3:#.3g}" for f in (0.25, 0.5, 0.75, 1.0))
        print(f"| {p['model']} | {p['seed']} | {k} | {meas} | {est} | {r['ratio_vs_onnxruntime']:.2f}x |")

print()
print(
    "| model | seed | on | gradient's final (ms) | TTQ DynaTune / gradient / round-robin (s) "
    "| vs gradient | vs round-robin | DynaTune sooner |"
)
print("|---|---|---|---|---|---|---|---|")
for p in doc["pairs"]:
    for on in ("measured", "estimate"):
        c = p[on]
        t = c["ttq_s"]

        def ratio(key):
            return "n/a" if c[key] is None else f"{c[key]:.2f}x"

        print(
            f"| {p['model']} | {p['seed']} | {on} | {c['target_ms']:#.3g} | {ms(t['dynatune'])} / "
            f"{ms(t['gradient'])} / {ms(t['round_robin'])} | {ratio('ttq_vs_gradient')} "
            f"| {ratio('ttq_vs_round_robin')} | {'yes' if c['dynatune_sooner_than_gradient'] else 'no'} |"
        )
print()
print(
    f"DynaTune sooner than gradient: {doc['dynatune_sooner_measured']} of {len(doc['pairs'])} pairs on the "
    f"measured model, {doc['dynatune_sooner_estimate']} on the estimate (rtol {doc['rtol']})."
)
