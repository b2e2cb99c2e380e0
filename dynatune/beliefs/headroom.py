"""Headroom beliefs (``beliefs: headroom``): how far a task is from what the machine allows, and the
staircase by which real tuning curves get there.

Headroom. A task's latency is bounded below by its roofline (:mod:`dynatune.machine.roofline`):
``bound_s`` from its FLOPs and compulsory bytes at the machine's measured peak compute and bandwidth
(``TaskView.bound_s``, 0 when unknown). No kernel reaches the bound, but kernels of one operator kind
(conv2d, matmul, ...) in one regime (compute-bound, or ``/memory``-bound like a depthwise conv) reach
similar fractions of it. The achieved fraction ``phi = bound / best`` of the best task of a kind,
raised by an uplift that fades as the kind gets tuned (``uplift x sqrt(uplift_slots / (uplift_slots +
slots spent on the kind))``: the best of a kind can still improve, less so the more it was tuned), is the
kind's attainable fraction ``phi*``. A task's floor is ``bound / phi*`` and its headroom, in weighted
seconds, ``H = weight x max(best - floor, 0)``. A kind nothing has been tuned in yet takes the median of
the other kinds' attainable fractions (``phi_prior`` before any). A task without a bound takes the median
relative headroom of the others. Where ONNX Runtime's time for the task's operator is known
(``TaskView.anchor_s``, :mod:`dynatune.compiler.anchors`), that time is reachable: while the task is slower,
its floor is no higher than ``anchor_reach`` x that time (a reachable point lowers a floor guessed too high;
it never raises one).

Staircase (a zero-inflated jump likelihood). After a task's first improvement, each slot either gains
nothing or jumps. At the task's ``k``-th effective slot it jumps with probability
``p(k) = min(1, p0 k^-gamma)`` (``p0`` may pass 1: ``k`` starts at 2): ``(p0, gamma)`` are fitted by
maximum likelihood on a grid to every task's slots (Bernoulli outcomes, with ``prior_slots`` pseudo-slots at
``p_prior``), and a task's own record scales it, ``r = (J + a) / (E + a)`` (``J`` jumps seen, ``E = sum p(k)``
expected, ``a`` = ``task_strength``: a Gamma-Poisson posterior). A jump takes a fraction ``u`` of the
headroom left before it; ``u``'s mean is pooled over every jump seen, shrunk towards ``u_prior``. Drops
smaller than ``jump_rel_tol`` are measurement noise, not jumps.

Prediction. ``E[gain] = p x E[u] x H``; its standard deviation combines the uncertainty of ``p`` (the
Gamma posterior), of ``E[u]`` and of ``H`` (the attainable fraction; coefficient of variation
``h_cv / sqrt(1 + tuned tasks of the kind)``), as the product of independent factors. Before its first
improvement a task has the shared prior of :class:`~.base.Beliefs` (first drops and the stall model),
capped at its headroom.

Over the rest of a budget (:meth:`HeadroomBeliefs.predict_rest`, ``R`` slots) the jumps compound on what is
left: the ``j``-th future slot jumps with ``p(n + j) r`` and takes ``E[u]`` of the headroom left, so the
expected gain is ``H (1 - prod_j (1 - p(n + j) r E[u]))``, never more than the headroom. Its
standard deviation, by source (:meth:`HeadroomBeliefs.rest_spread`): the same share with the task's own rate
``r`` one standard deviation higher (its Gamma posterior: the task's own), with ``E[u]`` one higher (pooled
over every task: shared by all), and the headroom's coefficient of variation (its kind's attainable
fraction: shared by the kind). What the rest could buy over many tasks adds the first in squares and each
shared one in full (:mod:`dynatune.run.stopping`).

Bounds (:meth:`HeadroomBeliefs.limit`): a task at its roof (``at_roof`` of its compute or memory bound), or at
its floor within ``jump_rel_tol`` (no jump left to see), can gain nothing more: the scheduler gives it no slot
while another task can gain.
"""

from __future__ import annotations

import math
import re
import statistics

import numpy as np

from dynatune.beliefs.base import OWN, Beliefs, _valid, combined_std, rest_slots

# the jump law's grid: p0 x gamma x slots. p0 is the law at k = 1, never observed (jumps count from the second
# effective slot). A task's first search slot nearly always jumps (0.76-1.0 on three live runs); capped at 1,
# p0 could fit that only with a flat law, even where later slots seldom jump (from the fifth on: 1 in 35 on
# the README job's model, 1 in 10 on mnasnet0_5; 1 in 3 on squeezenet1_1, whose fit stays flatter)
_P0 = np.geomspace(0.02, 8.0, 40)[:, None, None]
_GAMMA = np.linspace(0.0, 2.0, 21)[None, :, None]


def _bound(task) -> float:
    return float(getattr(task, "bound_s", 0.0) or 0.0)


def _anchor(task) -> float:
    return float(getattr(task, "anchor_s", 0.0) or 0.0)


def operator_kind(name: str) -> str:
    """The operator a task is built around, from its name: ``fused_conv2d7_add4_relu41`` -> ``conv2d``."""
    first = re.sub(r"^fused_", "", name).split("_")[0]
    return re.sub(r"\d+$", "", first) or name


class HeadroomBeliefs(Beliefs):
    def __init__(
        self,
        uplift: float = 0.5,
        uplift_slots: float = 10.0,
        phi_prior: float = 0.3,
        jump_rel_tol: float = 0.005,
        p_prior: float = 0.3,
        prior_slots: float = 4.0,
        task_strength: float = 2.0,
        u_prior: float = 0.3,
        u_strength: float = 2.0,
        h_cv: float = 0.5,
        anchor_reach: float = 0.9,
        **shared,
    ):
        super().__init__(**shared)
        self.uplift, self.uplift_slots, self.phi_prior = uplift, uplift_slots, phi_prior
        self.jump_rel_tol, self.p_prior, self.prior_slots = jump_rel_tol, p_prior, prior_slots
        self.task_strength, self.u_prior, self.u_strength, self.h_cv = (
            task_strength,
            u_prior,
            u_strength,
            h_cv,
        )
        self.anchor_reach = anchor_reach
        self._key = None
        self._step_cache: dict[int, tuple] = {}
        self._memory_bound: dict[int, bool] = {}
        self.phi_star: dict[str, float] = {}  # operator kind -> attainable fraction of the roofline
        self.tuned_in_kind: dict[str, int] = {}
        self.jump_law = (p_prior, 0.0)  # (p0, gamma)
        self.u_mean, self.u_var = u_prior, u_prior**2
        self._rel_headroom = 0.5  # median relative headroom of the tasks with a bound

    # -- population statistics -------------------------------------------------------------------
    def observe(self, tasks, slot_s: float) -> None:
        super().observe(tasks, slot_s)
        key = (
            slot_s,
            tuple((t.index, t.visits, t.history[-1][2] if t.history else None, _bound(t)) for t in tasks),
        )
        if key == self._key:
            return
        self._key = key
        self._fit_attainable(tasks)
        self._fit_jumps(tasks, slot_s)

    def kind(self, task) -> str:
        """The task's operator, and ``/memory`` when its roofline bound is its bytes, not its FLOPs: a
        depthwise conv and a dense one reach different fractions of their bounds."""
        kind = operator_kind(task.name)
        return kind + "/memory" if self._memory_bound.get(task.index, False) else kind

    def _regimes(self, tasks) -> None:
        """Which tasks are memory-bound: FLOPs per bound second below the machine's peak (the largest such
        rate over the tasks, reached by the compute-bound ones)."""
        rates = {t.index: t.flops / _bound(t) for t in tasks if _bound(t) > 0}
        peak = max(rates.values(), default=0.0)
        self._memory_bound = {i: r < 0.99 * peak for i, r in rates.items()}

    def _fit_attainable(self, tasks) -> None:
        self._regimes(tasks)
        best_phi, slots, tuned = {}, {}, {}
        for t in tasks:
            kind = self.kind(t)
            slots[kind] = slots.get(kind, 0) + t.visits
            if _bound(t) > 0 and t.history and _valid(t.best_s) and t.best_s < t.default_s:
                best_phi[kind] = max(best_phi.get(kind, 0.0), min(_bound(t) / t.best_s, 1.0))
                tuned[kind] = tuned.get(kind, 0) + 1
        fallback = statistics.median(best_phi.values()) if best_phi else self.phi_prior
        self.phi_star, self.tuned_in_kind = {}, tuned
        for kind in slots:
            phi = best_phi.get(kind, fallback)
            lift = self.uplift * math.sqrt(self.uplift_slots / (self.uplift_slots + slots[kind]))
            self.phi_star[kind] = min(1.0, phi * (1.0 + lift))
        rel = [1.0 - self.floor(t) / t.best_s for t in tasks if _bound(t) > 0 and _valid(t.best_s)]
        self._rel_headroom = statistics.median(rel) if rel else 0.5

    def _steps(self, task, slot_s: float):
        """(effective slot numbers from 2, jumped?, normalised (before, after) of each jump), cached per
        curve."""
        c = self.curve(task, slot_s)
        hit = self._step_cache.get(task.index)
        if hit is None or hit[0] is not c:
            jumped = c.y[1:] < c.y[:-1] * (1.0 - self.jump_rel_tol)
            pairs = [(c.y[k], c.y[k + 1]) for k in np.flatnonzero(jumped)]
            hit = (c, np.arange(2, c.y.size + 1), jumped, pairs)
            self._step_cache[task.index] = hit
        return hit[1:]

    def _fit_jumps(self, tasks, slot_s: float) -> None:
        slots, jumps, fractions = {}, {}, []
        for t in tasks:
            ks, jumped, pairs = self._steps(t, slot_s)
            for k, j in zip(ks.tolist(), jumped.tolist()):
                slots[k] = slots.get(k, 0) + 1
                jumps[k] = jumps.get(k, 0) + j
            ref = self.curve(t, slot_s).ref
            floor = self.floor(t) / ref if ref else 0.0
            fractions += [min((prev - now) / (prev - floor), 1.0) for prev, now in pairs if prev > floor]
        k = np.array(sorted(slots), dtype=float)
        n = np.array([slots[x] for x in sorted(slots)], dtype=float)
        j = np.array([jumps[x] for x in sorted(slots)], dtype=float)
        p = np.minimum(_P0 * k[None, None, :] ** -_GAMMA, 0.999)
        loglik = (j * np.log(p) + (n - j) * np.log1p(-p)).sum(-1)
        p2 = np.minimum(_P0 * 2.0**-_GAMMA, 0.999)[..., 0]  # prior: pseudo-slots at the second effective slot
        loglik = loglik + self.prior_slots * (self.p_prior * np.log(p2) + (1 - self.p_prior) * np.log1p(-p2))
        i, g = np.unravel_index(int(np.argmax(loglik)), loglik.shape)
        self.jump_law = (float(_P0[i, 0, 0]), float(_GAMMA[0, g, 0]))
        count, a = len(fractions), self.u_strength
        self.u_mean = (sum(fractions) + a * self.u_prior) / (count + a)
        spread = statistics.pvariance(fractions) if count > 1 else self.u_prior**2
        self.u_var = spread / (count + a)

    # -- per task -----------------------------------------------------------------------------------
    def floor(self, task) -> float:
        """The latency the task could reach here: its roofline bound over its kind's attainable fraction,
        and no more than ``anchor_reach`` x ONNX Runtime's time for its operator while the task is slower
        than that (a point known to be reachable lowers a floor the roofline guessed too high; it never
        raises one: a kernel can pass ONNX Runtime's, mnasnet0_5's first convolution 3x)."""
        best = task.best_s
        if _bound(task) <= 0:
            guess = best * (1.0 - self._rel_headroom) if _valid(best) else 0.0
        else:
            guess = _bound(task) / self.phi_star.get(self.kind(task), self.phi_prior)
        reachable = _anchor(task) * self.anchor_reach
        if reachable > 0 and _valid(best) and best > reachable:
            return min(guess, reachable)
        return guess

    def limit(self, task) -> str:
        """At its roof (the compute or the memory bound, :meth:`kind`), or at its floor within
        ``jump_rel_tol``: "" when it can still gain."""
        roof = super().limit(task)
        if roof:
            which = "memory" if self._memory_bound.get(task.index, False) else "compute"
            return roof.replace("roofline bound", f"{which} bound")
        best, floor = task.best_s, self.floor(task)
        if _valid(best) and floor > 0 and best <= floor * (1.0 + self.jump_rel_tol):
            return f"at its reachable floor ({floor * 1e3:.4g} ms)"
        return ""

    def predict_rest(
        self, task, slot_s: float, slots: float, best_s: float | None = None
    ) -> tuple[np.ndarray, np.ndarray]:
        mean, sources = self.rest_spread(task, slot_s, slots, best_s)
        return mean, combined_std(sources)

    def rest_spread(
        self, task, slot_s: float, slots: float, best_s: float | None = None
    ) -> tuple[np.ndarray, dict[str, np.ndarray]]:
        """The gain of ``n = 1 .. R`` more slots and its uncertainty by source: the task's own jump rate
        (its Gamma posterior: independent of other tasks'), the pooled jump size ``E[u]`` (shared by every
        task) and its kind's attainable fraction (the headroom, shared by the tasks of its kind)."""
        best = task.best_s if best_s is None else best_s
        headroom = task.weight * max(best - self.floor(task), 0.0) if _valid(best) else 0.0
        c = self.curve(task, slot_s)
        if c.x.size == 0:  # no improvement yet: the shared prior's, at most the headroom
            mean, std = super().predict_rest(task, slot_s, slots, best)
            return np.minimum(mean, headroom), {OWN: np.minimum(std, headroom)}
        ks, jumped, _ = self._steps(task, slot_s)
        expected = sum(self.jump_probability(k) for k in ks.tolist())
        jumps, a = int(jumped.sum()), self.task_strength
        record = (jumps + a) / (expected + a)  # the task's own record, as in predict
        p0, gamma = self.jump_law
        future = np.arange(c.x.size + 1, c.x.size + 1 + rest_slots(slots), dtype=float)
        step = np.minimum(p0 * future**-gamma * record, 0.999) * self.u_mean  # expected share of each slot

        def taken(scale: float) -> np.ndarray:  # the share of the headroom n slots take, jumps compounding
            return 1.0 - np.cumprod(1.0 - np.minimum(step * scale, 1.0))

        share = taken(1.0)
        cv = self.h_cv / math.sqrt(1 + self.tuned_in_kind.get(self.kind(task), 0))
        lift = math.sqrt(1.0 + cv * cv)  # the headroom's spread widens the others' (independent factors)
        rate = taken(1.0 + math.sqrt(1.0 / (jumps + a))) - share  # one sd of the task's own jump rate
        size = taken(1.0 + math.sqrt(self.u_var) / self.u_mean) - share  # ... of the pooled jump size
        return headroom * share, {
            OWN: headroom * rate * lift,
            "jump size": headroom * size * lift,
            f"headroom of {self.kind(task)}": headroom * share * cv,
        }

    def jump_probability(self, k: int) -> float:
        p0, gamma = self.jump_law
        return min(p0 * k**-gamma, 0.999)

    def predict(self, task, slot_s: float, best_s: float | None = None) -> tuple[float, float, str]:
        best = task.best_s if best_s is None else best_s
        if not _valid(best):
            return 0.0, 0.0, "no latency"
        headroom = task.weight * max(best - self.floor(task), 0.0)
        c = self.curve(task, slot_s)
        if c.x.size == 0:  # no improvement yet: the shared prior of first drops, at most the headroom
            mean, std, note = self.prior_predict(task, slot_s, best)
            return min(mean, headroom), min(std, headroom), note
        n = c.x.size
        ks, jumped, _ = self._steps(task, slot_s)
        expected = sum(self.jump_probability(k) for k in ks.tolist())
        jumps = int(jumped.sum())
        a = self.task_strength
        base = self.jump_probability(n + 1)
        p = min(base * (jumps + a) / (expected + a), 0.999)
        p_var = (base * math.sqrt(jumps + a) / (expected + a)) ** 2
        cv = self.h_cv / math.sqrt(1 + self.tuned_in_kind.get(self.kind(task), 0))
        mean = p * self.u_mean * headroom
        second = (p * p + p_var) * (self.u_mean**2 + self.u_var) * headroom**2 * (1 + cv * cv)
        return mean, math.sqrt(max(second - mean * mean, 0.0)), "headroom"

    def clear(self) -> None:
        super().clear()
        self._key = None
        self._step_cache.clear()
