"""How much better than the gradient rule can ANY task scheduler be on the recorded traces?

A clairvoyant scheduler that reads the future off the traces: each round it gives the slot to the task
whose next 1..LOOK slots (replayed exactly as the replay does) drop the weighted latency fastest per
second; when no task gains within LOOK slots it shares slots by weighted latency per visit. It is an upper
reference, not a bound in the strict sense (greedy lookahead is not optimal), but no scheduler that only
sees the past can expect to beat it by much. Same TTQ definition as ``dynatune bench replay``.

    python bench/replay_oracle.py            # writes bench/results/replay_oracle.json
"""
import json
import math
import os
import statistics
import sys
from bisect import bisect_right

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
from dynatune.replay import (available_traces, default_slot, load_traces, replay, running_bests,  # noqa: E402
                             slot_end, time_to_quality, total_trace_seconds)
from dynatune.schedulers import make_scheduler  # noqa: E402
from dynatune.schedulers.base import Scheduler  # noqa: E402

LOOK = 5
BUDGETS = (0.25, 0.5, 1.0)
HORIZON = 3.0


class Clairvoyant(Scheduler):
    name = "clairvoyant"

    def __init__(self, doc, slot_s: float, look: int = LOOK):
        super().__init__()
        self.slot, self.look = slot_s, look
        self.times = [[float(p[0]) for p in r["trace"]] for r in doc["tasks"]]
        self.bests = [running_bests(r) for r in doc["tasks"]]

    def choose(self, ctx):
        best, alive = None, []
        for i, t in enumerate(ctx.tasks):
            if t.exhausted or not math.isfinite(t.best_s):
                continue
            alive.append(t)
            end = t.seconds
            for _ in range(self.look):
                end = slot_end(self.times[i], end, self.slot)
                j = bisect_right(self.times[i], end + 1e-9) - 1
                rate = t.weight * max(t.best_s - self.bests[i][j], 0.0) / (end - t.seconds)
                if rate > 0 and (best is None or rate > best[0]):
                    best = (rate, i)
        if best is not None:
            return best[1]
        if not alive:
            return None
        return max(alive, key=lambda t: (t.weight * t.best_s / max(t.visits, 1), -t.index)).index


def main():
    out, ratios = [], {str(f): [] for f in BUDGETS}
    for m in available_traces():
        doc = load_traces(m)
        slot, total = default_slot(doc), total_trace_seconds(doc)
        rows = []
        for frac in BUDGETS:
            budget = frac * total
            target = replay(doc, make_scheduler("gradient"), budget, slot).final
            ttq = {}
            for name in ("gradient", "round_robin", "dynatune", "clairvoyant"):
                sch = Clairvoyant(doc, slot) if name == "clairvoyant" else make_scheduler(name)
                res = replay(doc, sch, HORIZON * budget, slot, stop_at=target, stop_after_s=budget)
                ttq[name] = min(time_to_quality(res.curve, target), HORIZON * budget)
            r = {"fraction": frac, "budget_s": budget, "ttq_s": ttq,
                 "clairvoyant_vs_gradient": ttq["gradient"] / ttq["clairvoyant"],
                 "clairvoyant_vs_round_robin": ttq["round_robin"] / ttq["clairvoyant"],
                 "dynatune_vs_gradient": ttq["gradient"] / ttq["dynatune"]}
            ratios[str(frac)].append(r)
            rows.append(r)
            print(f"{m:18s} {frac:5.2f}  " + "  ".join(f"{k} {v:7.1f}" for k, v in ttq.items())
                  + f"   clairvoyant vs gradient {r['clairvoyant_vs_gradient']:.2f}"
                  f" vs round-robin {r['clairvoyant_vs_round_robin']:.2f}")
        out.append({"model": m, "budgets": rows})

    summary = {f: {k: statistics.median([r[k] for r in rs]) for k in
                   ("clairvoyant_vs_gradient", "clairvoyant_vs_round_robin", "dynatune_vs_gradient")}
               for f, rs in ratios.items()}
    print("medians over models:", json.dumps(summary))
    path = os.path.join(os.path.dirname(os.path.abspath(__file__)), "results", "replay_oracle.json")
    with open(path, "w") as f:
        json.dump({"look": LOOK, "horizon": HORIZON, "models": out, "medians": summary}, f, indent=1)


if __name__ == "__main__":
    main()
