"""The BENCHMARKS.md table of a live scheduler benchmark, from its raw JSON.

    python bench/live_table.py [bench/results/live/live.json]

TTQ = seconds of tuning each scheduler needed to reach the gradient rule's final estimate; ratio =
TTQ(other) / TTQ(dynatune) (> 1: DynaTune sooner); a run that never reaches it counts as the budget, so
its ratio is only a bound (printed with < or >).
"""
import json
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
from dynatune.replay import objective_at, time_to_quality, ttq_ratio  # noqa: E402

path = sys.argv[1] if len(sys.argv) > 1 else "bench/results/live/live.json"
doc = json.load(open(path))
budget = doc["budget_s"]
print("| model | scheduler | rounds | trials | estimate at 25/50/100 % of budget (ms) | measured (ms) "
      "| TTQ to gradient's final (s) | DynaTune sooner by |")
print("|---|---|---|---|---|---|---|---|")
for model, res in doc["models"].items():
    runs = res["runs"]
    target = runs["gradient"]["curve"][-1][1]
    ttq = {k: time_to_quality(r["curve"], target) for k, r in runs.items()}
    for k, r in runs.items():
        est = " / ".join(f"{objective_at(r['curve'], f * budget) * 1e3:.2f}" for f in (0.25, 0.5, 1.0))
        ratio = "" if k == "dynatune" else f"{ttq_ratio(ttq[k], ttq['dynatune'], budget):.2f}x"
        if ratio and ttq["dynatune"] == ttq[k] == float("inf"):
            ratio = "n/a (neither reached it)"
        elif ratio and ttq["dynatune"] == float("inf"):
            ratio = "< " + ratio + " (DynaTune never reached it)"  # its TTQ is > budget: an upper bound
        elif ratio and ttq[k] == float("inf"):
            ratio = "> " + ratio + f" ({k} never reached it)"  # a lower bound
        t = "never" if ttq[k] == float("inf") else f"{ttq[k]:.0f}"
        print(f"| {model} | {k} | {r['rounds']} | {r['trials']} | {est} | {r['latency_ms']:.2f} | {t} | {ratio} |")
