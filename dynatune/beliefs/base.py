"""What a belief model is: per task, the predicted drop of its weighted latency after one more slot.

:class:`Beliefs` is the base class of the belief models (one file per model, as Optuna has one per
sampler): it keeps what every model needs -- each task's history as a normalised learning curve with its
leading stall (:func:`task_curve`), the population prior of early relative drops, and the model of the
time to a task's first improvement -- and a model adds :meth:`Beliefs.predict`.

- ``curves`` (:mod:`.curves`): Bayesian learning-curve extrapolation (the model since session 1);
- ``headroom`` (:mod:`.headroom`): roofline headroom with a zero-inflated jump likelihood.

Beside one slot's gain, a model answers two questions the run asks of it: what a task could still gain over
the rest of a budget (:meth:`Beliefs.predict_rest`, what :mod:`dynatune.run.stopping` weighs to end a run
early), and whether a task is at a bound it cannot pass (:meth:`Beliefs.limit`: at its roof, ``at_roof`` of
its roofline bound or more), so that it gets no slot while another task can gain.
"""

from __future__ import annotations

import math
from abc import ABC, abstractmethod
from dataclasses import dataclass

import numpy as np

STALL_PRIOR = (0.8, 0.8)  # prior means of pi (task can improve) and h (per-slot chance it first does)
# a kernel at this share of its roofline bound or more is at its roof: the peak is one GEMM's, measured
# within 2-3 % from run to run (MLAS against numpy's BLAS, four measurements at 200-205 GFLOP/s, BENCHMARKS.md
# session 35), and the adaptive measurement settles a latency within 2 %; the last 5 % is inside their noise
AT_ROOF = 0.95
MAX_REST_SLOTS = 10_000  # a rest of budget is looked at this many slots ahead at most
OWN = ""  # the source of a gain's uncertainty that is the task's own, independent of every other task's


def combined_std(sources: dict) -> np.ndarray:
    """One standard deviation from its parts by source (:meth:`Beliefs.rest_spread`): their squares summed."""
    return np.sqrt(sum(sd**2 for sd in sources.values()))


def rest_slots(slots: float) -> int:
    """The whole slots of a rest of ``slots`` (a part slot counts: a run's last slot is a short one)."""
    return min(max(math.ceil(slots - 1e-9), 0), MAX_REST_SLOTS)


def _valid(b) -> bool:
    return b is not None and math.isfinite(b) and b > 0


@dataclass
class TaskCurve:
    """A task's history in normalised units, split into a stall and the effective learning curve."""

    ref: float | None  # latency that normalises y: the default (or, if unknown, the first valid best)
    stall: int  # slots before the first improvement over the default (tuning had not started yet)
    x: np.ndarray  # effective points: tuning seconds / slot_s
    y: np.ndarray  # running best / ref
    drops: list  # relative drop at effective slot 1, 2, ... (None where unknown)
    fit: object = None  # the curve model's cached fit


def task_curve(task, slot_s: float) -> TaskCurve:
    """Leading slots that left the best at the untuned default are a *stall* (no valid or better schedule
    found yet), not evidence of convergence: the learning curve starts at the first improvement."""
    default = float(task.default_s) if _valid(task.default_s) else None
    best, stall, xs, ys = default if default is not None else math.inf, 0, [], []
    for sec, _trials, b in task.history:
        if _valid(b) and b < best:
            best = b
        if not xs and (not math.isfinite(best) or (default is not None and best >= default)):
            stall += 1
            continue
        xs.append(float(sec) / slot_s)
        ys.append(best)
    ref = default if default is not None else (ys[0] if ys else None)
    y = np.array(ys) / ref if ys else np.zeros(0)
    drops = ([1.0 - y[0]] if default is not None else [None]) if ys else []
    drops += [1.0 - y[k] / y[k - 1] for k in range(1, len(ys))]
    return TaskCurve(ref, stall, np.array(xs), y, drops)


class Beliefs(ABC):
    """Per-task predictive gain of one more slot, with a cache so only changed tasks are refitted.

    ``predict(task, slot_s)`` returns ``(gain_mean_s, gain_std_s, note)`` in *weighted seconds*: the
    expected drop of ``weight x best latency`` after one more slot and its standard deviation.

    A task's curve starts at its first improvement over the untuned default (:func:`task_curve`); with
    fewer than ``min_points`` effective points it gets an empirical-Bayes prior shared by all tasks of
    the model: ``observe(tasks)`` collects the relative drop ``r_k = 1 - y_k / y_{k-1}`` every task saw
    at its k-th effective slot (``y_0`` = default). The prior gain of a task about to get its k-th
    effective slot is the mean of ``r_k`` over tasks, shrunk towards ``prior_gain`` (k = 1) or
    ``prior_gain_tuned`` (k > 1) with ``prior_strength`` pseudo-observations; its std is the matching
    spread (the fixed prior's std equals its mean).

    Stalls: whether the next slot brings the *first* improvement follows a zero-inflated geometric
    model -- a task can improve at all with probability ``pi``, and then does so in each slot with
    probability ``h`` -- fitted by EM over the model's tasks (first improvement after ``k`` slots, or
    still stalled after ``m``; Beta priors worth ``stall_strength`` tasks, means ``STALL_PRIOR``).
    After ``m`` empty slots ``P(improve next) = h q``, ``q = pi (1-h)^m / (pi (1-h)^m + 1 - pi)``, so a
    task that never improves fades geometrically. Its expected gain is ``P x E[r_1]`` and its std
    ``P x std(r_1)``: the uncertainty of the *expected* gain (what UCB explores), not the Bernoulli
    spread of the outcome.
    """

    def __init__(
        self,
        min_points: int = 3,
        prior_gain: float = 0.5,
        prior_gain_tuned: float = 0.1,
        prior_strength: float = 2.0,
        stall_strength: float = 2.0,
        max_points: int = 96,
        at_roof: float = AT_ROOF,
    ):
        self.min_points = min_points
        self.at_roof = at_roof
        self.prior_gain = prior_gain
        self.prior_gain_tuned = prior_gain_tuned
        self.prior_strength = prior_strength
        self.stall_strength = stall_strength
        self._first: dict[int, tuple] = {}  # task index -> (improved?, slots to first improvement or stalled)
        self._stall_fit = None  # cached (pi, h)
        self.max_points = max_points
        self._curves: dict[int, tuple] = {}  # task index -> (history key, TaskCurve)
        self._drops: dict[int, list] = {}  # task index -> its drops counted in the population
        self._pop = np.zeros((3, max(min_points, 1)))  # per effective slot k: count, sum r, sum r^2
        self.fits = 0  # number of curve fits done (for tests / profiling)

    def curve(self, task, slot_s: float) -> TaskCurve:
        """The task's :class:`TaskCurve`, recomputed only when its history changed."""
        h = task.history
        key = (len(h), tuple(h[-1]) if h else None, task.default_s, slot_s)
        hit = self._curves.get(task.index)
        if hit is not None and hit[0] == key:
            return hit[1]
        c = task_curve(task, slot_s)
        self._curves[task.index] = (key, c)
        self._set_drops(task.index, c.drops[: self._pop.shape[1]])
        first = (True, c.stall + 1) if c.x.size else (False, c.stall)
        if self._first.get(task.index) != first:
            self._first[task.index] = first
            self._stall_fit = None
        return c

    # -- shared prior ------------------------------------------------------------------------------
    def observe(self, tasks, slot_s: float) -> None:
        """Bring the population statistics of early relative drops up to date with the tasks' histories."""
        for t in tasks:
            self.curve(t, slot_s)

    def _set_drops(self, index: int, drops: list) -> None:
        for k, r in enumerate(self._drops.get(index, [])):
            if r is not None:
                self._pop[:, k] -= (1.0, r, r * r)
        for k, r in enumerate(drops):
            if r is not None:
                self._pop[:, k] += (1.0, r, r * r)
        self._drops[index] = drops

    def prior(self, k: int) -> tuple[float, float]:
        """(mean, std) of the relative drop at a task's k-th effective slot, shrunk to the fixed prior."""
        p0 = self.prior_gain if k <= 1 else self.prior_gain_tuned
        n, s1, s2 = self._pop[:, k - 1] if 1 <= k <= self._pop.shape[1] else (0.0, 0.0, 0.0)
        kappa = self.prior_strength
        mean = (s1 + kappa * p0) / (n + kappa)
        second = (s2 + kappa * 2.0 * p0 * p0) / (n + kappa)  # fixed prior: mean p0, std p0
        return mean, math.sqrt(max(second - mean * mean, 0.0))

    def stall_model(self) -> tuple[float, float]:
        """(pi, h) of the zero-inflated geometric time to first improvement, by EM over the tasks."""
        if self._stall_fit is None:
            k = np.array([n for ok, n in self._first.values() if ok], dtype=float)
            m = np.array([n for ok, n in self._first.values() if not ok and n > 0], dtype=float)
            a = self.stall_strength
            pi, h = STALL_PRIOR
            for _ in range(20):
                stay = pi * (1.0 - h) ** m
                q = stay / (stay + 1.0 - pi)  # P(stalled task can still improve)
                pi = (k.size + q.sum() + a * STALL_PRIOR[0]) / (k.size + m.size + a)
                h = (k.size + a * STALL_PRIOR[1]) / (k.sum() + (q * m).sum() + a)
            self._stall_fit = (float(pi), float(min(h, 1.0)))
        return self._stall_fit

    def p_first_improvement(self, stalled_slots: int) -> float:
        pi, h = self.stall_model()
        stay = pi * (1.0 - h) ** stalled_slots
        return h * stay / (stay + 1.0 - pi)

    def prior_predict(self, task, slot_s: float, best: float) -> tuple[float, float, str]:
        """The shared prior's gain for a task with fewer than ``min_points`` effective points (weighted s)."""
        c = self.curve(task, slot_s)
        mean, std = self.prior(c.x.size + 1)
        scale = task.weight * best
        if c.x.size == 0:  # expected gain = P(first improvement) x E[drop r_1]; std: of r_1, likewise
            p = self.p_first_improvement(c.stall)
            mean, std = p * mean, p * std
            return mean * scale, std * scale, f"stalled {c.stall}" if c.stall else "prior"
        return mean * scale, std * scale, "prior"

    @abstractmethod
    def predict(self, task, slot_s: float, best_s: float | None = None) -> tuple[float, float, str]:
        """``(gain_mean_s, gain_std_s, note)``: the expected drop of ``weight x best`` after one more slot,
        in seconds, its standard deviation (the uncertainty of that expectation, what UCB explores), and
        a short note on where the figure comes from."""

    def predict_rest(
        self, task, slot_s: float, slots: float, best_s: float | None = None
    ) -> tuple[np.ndarray, np.ndarray]:
        """``(gain_mean_s, gain_std_s)``, each an array over ``n = 1 .. ceil(slots)``: the expected drop of
        ``weight x best`` if the task got ``n`` more slots (of the rest of a budget), in seconds, and the
        uncertainty of that expectation.

        This default knows nothing of how gains fade: ``n`` times one slot's, never more than the task's whole
        weighted latency. A model that knows better says so (the headroom's jumps compound on what is left, a
        learning curve's trend flattens)."""
        best = task.best_s if best_s is None else best_s
        n = np.arange(1, rest_slots(slots) + 1, dtype=float)
        if not _valid(best):
            return np.zeros_like(n), np.zeros_like(n)
        mean, std, _ = self.predict(task, slot_s, best)
        whole = task.weight * best
        return np.minimum(n * mean, whole), np.minimum(n * std, whole)

    def rest_spread(
        self, task, slot_s: float, slots: float, best_s: float | None = None
    ) -> tuple[np.ndarray, dict[str, np.ndarray]]:
        """:meth:`predict_rest`'s mean, and its standard deviation split by source: ``{source: std array}``,
        their squares summing to :meth:`predict_rest`'s. The source :data:`OWN` is the task's own, independent
        of every other task's; a named one is shared, so the tasks' parts of it move together (the headroom
        model's pooled jump size, an operator kind's attainable fraction). What the rest of a budget could buy
        over many tasks adds their own parts as independent and a shared source's parts in full
        (:mod:`dynatune.run.stopping`). This default knows of no shared source."""
        mean, std = self.predict_rest(task, slot_s, slots, best_s)
        return mean, {OWN: std}

    def limit(self, task) -> str:
        """Why ``task`` can gain nothing more here, or "" when it can: its best is at its roof (``at_roof`` of
        its roofline bound, ``TaskView.bound_s``, or faster). Call after :meth:`observe`."""
        bound, best = float(getattr(task, "bound_s", 0.0) or 0.0), task.best_s
        if bound > 0 and _valid(best) and bound / best >= self.at_roof:
            return f"at its roof ({bound / best:.0%} of its roofline bound)"
        return ""

    def clear(self) -> None:
        self._curves.clear()
        self._drops.clear()
        self._first.clear()
        self._stall_fit = None
        self._pop[:] = 0.0
