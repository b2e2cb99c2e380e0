"""How well a belief model predicts the next slot's gain, scored on recorded (or synthetic) traces.

Round-robin is replayed over a trace document (every task gets slots in turn, so every task's whole
curve is seen); before each slot the belief model predicts the slot's weighted gain (mean, std) for the
task about to get it, and after the slot the realised gain is known. Scores, over the slots after each
task's first (the first slot's gain is 10-60x and any model ranks it first):

- ``spearman``: rank correlation of the predicted mean with the realised gain;
- ``spearman_weighted_latency``: the same for plain weighted latency (what gradient's ``best/n`` ranks by);
- ``spearman_seed_mean``: the same with the predicted and the realised gain each averaged over the
  recorded seeds of a task at the same slot number (several seeds per task take much of the search luck
  out of the realised gain: what the belief should predict is its expectation);
- ``coverage``: share of realised gains inside ``mean +- 2 std``;
- ``zero_gain_share``: share of slots that gained nothing (the staircase).

``dynatune bench calibration`` (:func:`calibrate_recorded`) scores every belief model on every recorded
model's traces, all of its seeds, and the headroom model a second time with ONNX Runtime's per-operator
times as reachable floors where the model has them (``headroom+anchors``, from ``bench.trace_anchors``).
"""

from __future__ import annotations

import numpy as np

from dynatune.bench.replay import default_slot, replay, total_trace_seconds
from dynatune.schedulers import make_scheduler
from dynatune.schedulers.base import Scheduler


class CalibrationProbe(Scheduler):
    """Round-robin that records (predicted mean, std, weighted latency, realised gain, visits, task) per
    slot."""

    name = "calibration_probe"

    def __init__(self, beliefs):
        super().__init__()
        self.rr, self.model, self.rows, self.pending = make_scheduler("round_robin"), beliefs, [], None

    def choose(self, ctx):
        if self.pending:
            i, mean, std, wl, before = self.pending
            t = ctx.tasks[i]
            self.rows.append((mean, std, wl, t.weight * (before - t.best_s), t.visits, i))
        i = self.rr.pick(ctx)
        if i is None:
            return None
        t = ctx.tasks[i]
        self.model.observe(ctx.tasks, ctx.slot_s)
        mean, std, _ = self.model.predict(t, ctx.slot_s)
        self.pending = (i, mean, std, t.weight * t.best_s, t.best_s)
        return i


def calibration_rows(doc, beliefs, slot_s: float | None = None) -> np.ndarray:
    """Round-robin over ``doc``'s whole recorded time; one row (mean, std, weighted latency, gain, visits,
    task) per slot."""
    probe = CalibrationProbe(beliefs)
    replay(doc, probe, total_trace_seconds(doc), slot_s or default_slot(doc))
    return np.array(probe.rows, dtype=float).reshape(-1, 6)


def seed_rows(doc, make_beliefs, seeds, slot_s: float | None = None) -> np.ndarray:
    """:func:`calibration_rows` for each recorded seed's traces (a fresh belief model each), stacked."""
    from dynatune.bench.traces import draw

    slot = slot_s or default_slot(doc)
    parts = [calibration_rows(draw(doc, None, seed=s), make_beliefs(), slot) for s in seeds]
    return np.vstack(parts) if parts else np.zeros((0, 6))


def calibration_scores(rows: np.ndarray) -> dict:
    """The scores of the slots after each task's first (see the module's docstring)."""
    from scipy.stats import spearmanr

    r = rows[rows[:, 4] >= 2]
    if len(r) < 3:
        return {
            "slots": int(len(r)),
            "spearman": None,
            "spearman_seed_mean": None,
            "spearman_weighted_latency": None,
            "coverage": None,
            "zero_gain_share": None,
        }
    mean, std, wl, gain = r[:, 0], r[:, 1], r[:, 2], r[:, 3]
    groups: dict = {}
    for row in r:  # (task, slot number) -> predicted and realised gains over the seeds
        groups.setdefault((row[5], row[4]), []).append((row[0], row[3]))
    averaged = np.array([np.mean(v, axis=0) for v in groups.values() if len(v) > 1]).reshape(-1, 2)
    return {
        "slots": int(len(r)),
        "spearman": _finite(spearmanr(mean, gain)[0]),
        "spearman_seed_mean": _finite(spearmanr(averaged[:, 0], averaged[:, 1])[0])
        if len(averaged) > 2
        else None,
        "spearman_weighted_latency": _finite(spearmanr(wl, gain)[0]),
        "coverage": float(np.mean((gain >= mean - 2 * std) & (gain <= mean + 2 * std))),
        "zero_gain_share": float(np.mean(gain <= 0)),
    }


def _finite(x) -> float | None:
    return float(x) if np.isfinite(x) else None


def calibrate_recorded(models=None) -> dict:
    """Per recorded model (all of them by default): its seeds, its roofline, and each belief model's
    scores (:func:`calibration_scores`) over all its seeds' traces."""
    from dynatune.beliefs import BELIEFS, make_beliefs
    from dynatune.bench.traces import available_traces, load_traces, recorded_seeds, with_anchors
    from dynatune.errors import DynatuneError

    out = {}
    for m in models or available_traces():
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
            out[m][label] = calibration_scores(
                seed_rows(trace_doc, lambda name=name: make_beliefs(name), seeds)
            )
    return out


def calibration_lines(out: dict) -> list[str]:
    """One line per (model, belief model) of :func:`calibrate_recorded`'s scores."""

    def f(x) -> str:
        return "  n/a" if x is None else f"{x:5.2f}"

    return [
        f"{m:18s} {label:16s} slots {s['slots']:4d}  spearman {f(s['spearman'])}  "
        f"seed-mean {f(s['spearman_seed_mean'])}  weighted latency {f(s['spearman_weighted_latency'])}  "
        f"coverage {f(s['coverage'])}  zero-gain {f(s['zero_gain_share'])}"
        for m, scores in out.items()
        for label, s in scores.items()
        if label not in ("seeds", "roofline")
    ]
