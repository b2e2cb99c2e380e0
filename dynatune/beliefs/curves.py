"""Bayesian belief over how much one task's best latency will still drop.

Data. A task's history is a list of points ``(x_j, y_j)``: ``x`` = tuning seconds spent on the task,
``y`` = best latency found so far (monotone non-increasing). Everything is made scale-free first:
``y <- y / default_s`` (the untuned latency) and ``x <- x / slot_s`` (one unit = one slot).

Model (learning-curve extrapolation, after Domhan et al. 2015). The best-so-far curve follows one of
four parametric families, each written as ``f(x) = c + a * g(x; theta)`` where ``g`` decays to 0:

===========  =============================  ==========================================
family       g(x; theta)                    also known as
===========  =============================  ==========================================
pow3         x^-alpha                       power law ``c + a x^-alpha``
log_power    1 / (1 + (x/tau)^alpha)        MMF (the same curve, re-parametrised)
exp3         exp(-x/tau)                    exponential saturation
weibull      exp(-(x/tau)^delta)            Janoschek (the same curve, re-parametrised)
===========  =============================  ==========================================

``y_j = f(x_j) + eps_j`` with ``eps ~ N(0, sigma^2)``; ``c`` is the asymptote, ``a >= 0`` the remaining
drop. Priors: families equally likely; the shape ``theta`` log-uniform on a fixed grid; ``sigma``
log-uniform on a grid; ``(c, a) ~ N(m0, S0)`` with an empirical-Bayes scale (``c`` centred on the best
so far, ``a`` centred on 0 -- "no more gain" -- both with a broad standard deviation, ``PRIOR_WIDTH``
times the first tuned value). ``a >= 0`` is not imposed on the prior; ``D+`` below clips its effect.

Inference -- exact up to grid quadrature, no MCMC. Given ``(theta, sigma)`` the model is *linear* in
``(c, a)`` with a Gaussian prior, so the posterior of ``(c, a)`` is Gaussian and the marginal likelihood
``p(y | theta, sigma) = N(y; Phi m0, sigma^2 I + Phi S0 Phi^T)`` is closed form (all algebra is 2x2, done
for every grid point at once with numpy). Summing over the ``(theta, sigma)`` grid with the prior weights
gives the posterior weight of every grid component; a family's share of that weight is its Bayesian
evidence, so the prediction is a Bayesian model average over families, shapes and noise levels.
Compared with MCMC over ``(c, a, theta, sigma)`` this integrates ``(c, a)`` analytically and
``(theta, sigma)`` by deterministic quadrature: same posterior, no sampling noise, ~1 ms per fit.

Prediction. The best-so-far curve is a staircase: a Gaussian residual around the trend is not a chance
to improve (treating it as one -- expected improvement of ``f + eps`` over the best -- predicts a gain
from noise alone, forever, on a flat curve). So the gain of one more slot is the drop of the *trend*::

    D = f(x_last) - f(x_last + 1) = a (g(x_last) - g(x_last + 1)),   best_next = best_now - D+

For a grid component ``D ~ N(mu, s^2)`` (``a``'s Gaussian posterior; ``c`` cancels), and ``D+ = max(D, 0)``
has closed-form moments::

    E[D+]   = mu Phi(z) + s phi(z),                       z = mu / s
    E[D+^2] = (mu^2 + s^2) Phi(z) + mu s phi(z)

mixed over components by the posterior weights (law of total variance). ``gain_std`` is this epistemic
spread (it shrinks as data come in: what a UCB should explore); ``next_std`` adds the posterior noise
level for a predictive interval of the next observed best.

Stalls. Slots that leave the best at the untuned default (no valid, or no better, schedule found yet:
MetaSchedule's first batch can take several slots) say nothing about convergence; the learning curve
starts at the first improvement, and a stalled task keeps an untuned prior that fades with each
empty slot.

Little data. With fewer than ``min_points`` points there is nothing to fit. The prior is optimistic and
shared: the next slot may win a fraction of the current weighted latency, with a standard deviation as
large -- ``prior_gain`` for an untuned task, ``prior_gain_tuned`` once it has 1-2 points -- updated
(empirical Bayes) by the relative drops the model's other tasks actually saw at the same slot number
(see :class:`BeliefModel`).

Over the rest of a budget (``predict_rest``, ``R`` slots) the gain is the trend's drop from the last point to
``R`` slots later, by the same closed form.

Speed. Fits are cached per task, keyed by the history (length and last point) and the slot length,
so only the task that was just tuned is refitted; long histories are thinned to ``max_points``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np
from scipy.special import ndtr

from dynatune.beliefs.base import Beliefs, _valid, rest_slots

FAMILIES = ("pow3", "log_power", "exp3", "weibull")
_LOG_2PI = math.log(2.0 * math.pi)
_INV_SQRT_2PI = 1.0 / math.sqrt(2.0 * math.pi)


def _shape_grid():
    """Fixed shape-parameter grids: family id and parameters per grid point (built once)."""
    fam, p1, p2 = [], [], []
    for a in np.geomspace(0.02, 4.0, 40):  # pow3: alpha
        fam.append(0), p1.append(a), p2.append(0.0)
    for tau in np.geomspace(0.1, 2000.0, 16):  # log_power: tau x alpha
        for a in np.geomspace(0.25, 4.0, 8):
            fam.append(1), p1.append(tau), p2.append(a)
    for tau in np.geomspace(0.2, 2000.0, 40):  # exp3: tau
        fam.append(2), p1.append(tau), p2.append(0.0)
    for tau in np.geomspace(0.2, 2000.0, 16):  # weibull: tau x delta
        for d in np.geomspace(0.2, 3.0, 8):
            fam.append(3), p1.append(tau), p2.append(d)
    fam = np.array(fam)
    counts = np.bincount(fam, minlength=len(FAMILIES))
    log_prior = -np.log(len(FAMILIES)) - np.log(counts[fam])  # families equal, uniform within one
    return fam, np.array(p1)[:, None], np.array(p2)[:, None], log_prior


_FAM, _P1, _P2, _LOG_PRIOR_SHAPE = _shape_grid()
PRIOR_WIDTH = 3.0  # prior std of c and a, in units of the first tuned value
_SIGMA_REL = np.geomspace(1e-4, 0.3, 12)  # noise grid, relative to the first tuned value
_SL = [
    slice(int(np.argmax(_FAM == f)), int(np.argmax(_FAM == f)) + int((_FAM == f).sum()))
    for f in range(len(FAMILIES))
]  # grid points are grouped by family


def basis(x: np.ndarray) -> np.ndarray:
    """g(x; theta) for every grid shape: array (n_shapes, len(x)); x in slots, x > 0."""
    x = np.maximum(np.asarray(x, dtype=float)[None, :], 1e-6)
    g = np.empty((_FAM.size, x.shape[1]))
    s0, s1, s2, s3 = _SL
    with np.errstate(over="ignore", under="ignore"):
        g[s0] = x ** -_P1[s0]
        g[s1] = 1.0 / (1.0 + (x / _P1[s1]) ** _P2[s1])
        g[s2] = np.exp(-x / _P1[s2])
        g[s3] = np.exp(-((x / _P1[s3]) ** _P2[s3]))
    return g


@dataclass
class CurveFit:
    """Predictive summary after one more slot, in normalised units (fractions of the default latency)."""

    gain_mean: float  # E[best_now - best_next] = E[D+]
    gain_std: float  # std of D+ from the posterior over curves (epistemic: what UCB explores)
    best_now: float
    noise_std: float = 0.0  # posterior mean of sigma (how far observations scatter around the curve)
    family_weights: dict = field(default_factory=dict)  # posterior probability of each family
    n_points: int = 0

    @property
    def next_mean(self) -> float:
        """Expected best after one more slot."""
        return self.best_now - self.gain_mean

    @property
    def next_std(self) -> float:
        """Predictive std of the next observed best: curve uncertainty plus observation scatter."""
        return math.hypot(self.gain_std, self.noise_std)


def fit_curve(x, y, x_next: float, prior_width: float = PRIOR_WIDTH) -> CurveFit:
    """Bayesian model average over the curve families; predictive gain at ``x_next`` (normalised units).

    ``x`` (slots) and ``y`` (fraction of the default latency, monotone non-increasing), >= 3 points.
    """
    x = np.asarray(x, dtype=float)
    y = np.asarray(y, dtype=float)
    n = x.size
    b = float(y.min())
    scale = max(float(y[0]), 1e-12)
    g = basis(np.append(x, x_next))  # (K, n + 1)
    g, g_next, g_last = g[:, :n], g[:, n:], g[:, n - 1 : n]
    sg, sgg, sgy = g.sum(1, keepdims=True), (g * g).sum(1, keepdims=True), (g @ y)[:, None]
    sy, syy = y.sum(), y @ y
    # prior on (c, a): c ~ N(b, (w scale)^2), a ~ N(0, (w scale)^2), w = prior_width
    mc, ma, vc, va = b, 0.0, (prior_width * scale) ** 2, (prior_width * scale) ** 2
    s2 = (scale * _SIGMA_REL)[None, :] ** 2  # (1, L) noise variances
    # Gaussian posterior of (c, a) for every (shape, sigma): precision P, mean m = P^-1 r
    p11 = 1.0 / vc + n / s2
    p12 = sg / s2
    p22 = 1.0 / va + sgg / s2
    r1 = mc / vc + sy / s2
    r2 = ma / va + sgy / s2
    det = p11 * p22 - p12 * p12
    m1 = (p22 * r1 - p12 * r2) / det
    m2 = (p11 * r2 - p12 * r1) / det
    # log marginal likelihood: N(y; Phi m0, s2 I + Phi S0 Phi^T), via the 2x2 posterior
    quad = syy / s2 + mc * mc / vc + ma * ma / va - (m1 * r1 + m2 * r2)
    log_ml = -0.5 * n * (_LOG_2PI + np.log(s2)) - 0.5 * np.log(vc * va * det) - 0.5 * np.maximum(quad, 0.0)
    logw = log_ml + _LOG_PRIOR_SHAPE[:, None] - math.log(_SIGMA_REL.size)
    w = np.exp(logw - logw.max())
    w /= w.sum()
    # drop of the curve over the next slot: D = a (g(x_last) - g(x_next)) ~ N(m2 dg, dg^2 var(a))
    dg = g_last - g_next
    mu = m2 * dg
    sd = np.sqrt(np.maximum(dg * dg * p11 / det, 1e-300))
    z = mu / sd
    cdf, pdf = ndtr(z), np.exp(-0.5 * z * z) * _INV_SQRT_2PI
    eg = mu * cdf + sd * pdf  # E[D+]
    eg2 = (mu * mu + sd * sd) * cdf + mu * sd * pdf  # E[(D+)^2]
    mean = float((w * eg).sum())
    var = float((w * eg2).sum()) - mean * mean
    fam_w = w.sum(1)
    families = {name: float(fam_w[_FAM == f].sum()) for f, name in enumerate(FAMILIES)}
    noise = math.sqrt(float((w * s2).sum()))
    return CurveFit(max(mean, 0.0), math.sqrt(max(var, 0.0)), b, noise, families, n)


def _thin(x: np.ndarray, y: np.ndarray, max_points: int):
    """Keep the last max_points/2 points and an even subsample of the earlier ones."""
    if x.size <= max_points:
        return x, y
    tail = max_points // 2
    head = np.unique(np.linspace(0, x.size - tail - 1, max_points - tail).round().astype(int))
    idx = np.concatenate([head, np.arange(x.size - tail, x.size)])
    return x[idx], y[idx]


class BeliefModel(Beliefs):
    """The learning-curve belief model (``beliefs: curves``): a Bayesian model average of curve families
    fitted to each task's history once it has ``min_points`` effective points; the shared prior before."""

    # -- per-task fits -----------------------------------------------------------------------------
    def fit_task(self, task, slot_s: float) -> CurveFit | None:
        """The (cached) curve fit of ``task``, or None while it has fewer than ``min_points`` points."""
        c = self.curve(task, slot_s)
        if c.x.size < self.min_points:
            return None
        if c.fit is None:
            x, y = _thin(c.x, c.y, self.max_points)
            c.fit = fit_curve(x, y, x[-1] + 1.0)
            self.fits += 1
        return c.fit

    def predict(self, task, slot_s: float, best_s: float | None = None) -> tuple[float, float, str]:
        best = task.best_s if best_s is None else best_s
        if not _valid(best):
            return 0.0, 0.0, "no latency"  # nothing measured yet: no gain can be quantified
        fit = self.fit_task(task, slot_s)
        if fit is None:
            return self.prior_predict(task, slot_s, best)
        unit = task.weight * self.curve(task, slot_s).ref
        top = max(fit.family_weights, key=fit.family_weights.get)
        return fit.gain_mean * unit, fit.gain_std * unit, top

    def predict_rest(
        self, task, slot_s: float, slots: float, best_s: float | None = None
    ) -> tuple[np.ndarray, np.ndarray]:
        """The drop of the fitted trend over the whole rest (one fit, at its end), spread evenly over its
        slots."""
        best = task.best_s if best_s is None else best_s
        fit = self.fit_task(task, slot_s) if _valid(best) and slots > 0 else None
        if fit is None:
            return super().predict_rest(task, slot_s, slots, best)
        c = self.curve(task, slot_s)
        x, y = _thin(c.x, c.y, self.max_points)
        n = rest_slots(slots)
        rest = fit_curve(x, y, x[-1] + n)
        unit = task.weight * c.ref
        share = np.arange(1, n + 1, dtype=float) / n
        return rest.gain_mean * unit * share, rest.gain_std * unit * share


CurveBeliefs = BeliefModel
