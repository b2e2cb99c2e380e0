"""How well do DynaTune's beliefs predict the next slot's gain on the recorded traces?

Replays round-robin over each model's whole recorded time and, before every slot after a task's first,
asks the belief model for the predicted weighted gain (mean, std) of that slot; then compares with the
gain the trace realised. Prints the rank correlation (Spearman) of the predicted mean with the realised
gain, the same for plain weighted latency (what the gradient rule's best/n term ranks by), the share of
slots that gained nothing, and how often the realised gain was <= mean + 2 std.

    python bench/belief_calibration.py
"""
import os
import sys

import numpy as np
from scipy.stats import spearmanr

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
from dynatune.beliefs import BeliefModel  # noqa: E402
from dynatune.replay import available_traces, default_slot, load_traces, replay, total_trace_seconds  # noqa: E402
from dynatune.schedulers import make_scheduler  # noqa: E402
from dynatune.schedulers.base import Scheduler  # noqa: E402


class Probe(Scheduler):
    """Round-robin that records (predicted mean, std, weighted latency, realised gain, visits) per slot."""

    def __init__(self):
        super().__init__()
        self.rr, self.model, self.rows, self.pending = make_scheduler("round_robin"), BeliefModel(), [], None

    def choose(self, ctx):
        if self.pending:
            i, mean, std, wl, before = self.pending
            t = ctx.tasks[i]
            self.rows.append((mean, std, wl, t.weight * (before - t.best_s), t.visits))
        i = self.rr.pick(ctx)
        if i is None:
            return None
        t = ctx.tasks[i]
        self.model.observe(ctx.tasks, ctx.slot_s)
        mean, std, _ = self.model.predict(t, ctx.slot_s)
        self.pending = (i, mean, std, t.weight * t.best_s, t.best_s)
        return i


for m in available_traces():
    doc = load_traces(m)
    probe = Probe()
    replay(doc, probe, total_trace_seconds(doc), default_slot(doc))
    r = np.array([row for row in probe.rows if row[4] >= 2])  # slots after a task's first
    mean, std, wl, gain = r[:, 0], r[:, 1], r[:, 2], r[:, 3]
    print(f"{m:18s} slots {len(r):4d}  spearman(belief mean, gain) {spearmanr(mean, gain)[0]:5.2f}  "
          f"spearman(weighted latency, gain) {spearmanr(wl, gain)[0]:5.2f}  "
          f"zero-gain slots {np.mean(gain == 0):.2f}  gain <= mean+2std {np.mean(gain <= mean + 2 * std):.2f}")
