"""The Bayesian belief model: calibrated predictions on synthetic learning curves, priors, speed-ups."""

import math

import numpy as np
import pytest

from dynatune.beliefs import FAMILIES, BeliefModel, basis, fit_curve, task_curve
from dynatune.schedulers.base import TaskView


def true_curve(rng, x):
    """A random monotone learning curve (one of several shapes, some outside the model's families)."""
    c, a = rng.uniform(0.05, 0.4), rng.uniform(0.1, 0.5)
    kind = rng.integers(4)
    if kind == 0:
        return c + a * x ** -rng.uniform(0.2, 1.5)
    if kind == 1:
        return c + a * np.exp(-x / rng.uniform(2, 30))
    if kind == 2:
        return c + a / np.log(x + np.e)  # ilog2: not one of the fitted families
    return c + a / (1 + (x / rng.uniform(1, 20)) ** rng.uniform(0.5, 2))


def test_basis_shapes_decay():
    g = basis(np.array([1.0, 2.0, 10.0, 100.0]))
    assert g.shape[1] == 4 and np.all(np.isfinite(g))
    assert np.all(np.diff(g, axis=1) <= 1e-12)  # every shape decays
    assert set(FAMILIES) >= {"pow3", "log_power", "exp3", "weibull"}


def test_predictive_interval_covers_next_value():
    rng = np.random.default_rng(0)
    hits, total = 0, 0
    for _ in range(200):
        n = int(rng.integers(4, 25))
        x = np.arange(1, n + 2, dtype=float)
        f = true_curve(rng, x)
        y = np.minimum.accumulate(f * (1 + 0.02 * np.abs(rng.standard_normal(x.size))))
        fit = fit_curve(x[:n], y[:n], x[n])
        assert fit.gain_mean >= 0 and fit.gain_std >= 0 and math.isfinite(fit.next_std)
        hits += abs(y[n] - fit.next_mean) <= 2 * fit.next_std
        total += 1
    assert hits / total >= 0.7


def test_mean_gain_tracks_true_drop():
    rng = np.random.default_rng(1)
    pred, true = 0.0, 0.0
    for _ in range(100):
        x = np.arange(1, 13, dtype=float)
        f = true_curve(rng, x)
        pred += fit_curve(x[:11], f[:11], x[11]).gain_mean
        true += f[10] - f[11]
    assert 0.5 < pred / true < 2.0


def test_flat_history_predicts_near_zero_gain():
    x = np.arange(1, 11, dtype=float)
    fit = fit_curve(x, np.full(10, 0.3), 11.0)
    assert fit.gain_mean < 1e-3 * 0.3
    assert fit.next_mean == pytest.approx(0.3, rel=1e-3)


def test_steeper_curve_predicts_larger_gain():
    x = np.arange(1, 11, dtype=float)
    slow = fit_curve(x, 0.2 + 0.3 * x**-0.2, 11.0).gain_mean
    fast = fit_curve(x, 0.2 + 0.3 * np.exp(-x / 30), 11.0).gain_mean
    flat = fit_curve(x, 0.2 + 0.3 * np.exp(-x / 1.0), 11.0).gain_mean
    assert fast > slow > flat


def task_with(history, default=1e-3, weight=2, index=0, name="t"):
    return TaskView(index, name, f"k{index}", weight, 1e6, default, list(history))


@pytest.mark.parametrize("n", [0, 1, 2])
def test_short_history_gets_prior(n):
    t = task_with([(3.0 * (k + 1), 8 * (k + 1), 1e-3 * 0.5 ** (k + 1)) for k in range(n)])
    m = BeliefModel()
    mean, std, note = m.predict(t, 3.0)
    assert note == "prior" and mean > 0 and std > 0
    assert mean <= t.weight * t.best_s  # a fraction of the current weighted latency
    assert m.fits == 0


def test_empty_and_failed_points_do_not_crash():
    t = task_with([(3.0, 8, None), (6.0, 16, math.inf), (9.0, 24, 5e-4), (12.0, 32, None)])
    mean, std, note = BeliefModel().predict(t, 3.0)
    assert math.isfinite(mean) and math.isfinite(std) and mean >= 0
    c = task_curve(t, 3.0)
    assert c.stall == 2 and list(c.y) == [0.5, 0.5] and list(c.x) == [3.0, 4.0]
    assert c.drops == [0.5, 0.0]


def test_stalled_task_keeps_a_fading_untuned_prior():
    m = BeliefModel(prior_gain=0.5)
    fresh = m.predict(task_with([]), 3.0)
    stalled = [task_with([(3.0 * (k + 1), 8 * (k + 1), 1e-3) for k in range(n)]) for n in (1, 4, 8)]
    gains = [m.predict(t, 3.0) for t in stalled]
    assert all(g[2].startswith("stalled") for g in gains)
    assert fresh[0] > gains[0][0] > gains[1][0] > gains[2][0] > 0
    assert gains[2][0] < 0.05 * fresh[0]  # geometric fade
    # the curve starts at the first improvement: 4 stalled slots then a 75x drop is not a trend
    t = task_with([(3.0 * (k + 1), 8 * (k + 1), 1e-3) for k in range(4)] + [(15.0, 40, 1.3e-5)])
    assert m.predict(t, 3.0)[2] == "prior" and m.fits == 0


def test_stall_model_learns_from_tasks_that_never_improve():
    m = BeliefModel()
    p_before = m.p_first_improvement(3)
    # 10 tasks improved at their first slot, 10 are still at their default after 10 slots
    improved = [task_with([(3.0, 8, 5e-4)], index=i) for i in range(10)]
    stuck = [task_with([(3.0 * (k + 1), 8, 1e-3) for k in range(10)], index=10 + i) for i in range(10)]
    m.observe(improved + stuck, 3.0)
    pi, h = m.stall_model()
    assert 0.4 < pi < 0.7 and h > 0.7  # about half can improve, and those do so quickly
    assert m.p_first_improvement(0) > 0.4
    assert m.p_first_improvement(3) < 0.1 * p_before  # 3 empty slots: probably one that never improves


def test_unknown_default_uses_first_valid_best():
    t = task_with([(3.0, 8, None), (6.0, 16, 2e-4), (9.0, 24, 1.8e-4), (12.0, 32, 1.7e-4)], default=math.inf)
    c = task_curve(t, 3.0)
    assert c.ref == 2e-4 and c.stall == 1 and c.drops[0] is None
    mean, std, note = BeliefModel().predict(t, 3.0)
    assert math.isfinite(mean) and mean >= 0 and note != "prior"
    assert BeliefModel().predict(task_with([(3.0, 8, None)], default=math.inf), 3.0) == (
        0.0,
        0.0,
        "no latency",
    )


def test_scale_free():
    hist = [(5.0 * k, 8 * k, 1e-3 * (0.3 + 0.4 * k**-0.7)) for k in range(1, 9)]
    a = BeliefModel().predict(task_with(hist, default=1e-3), 5.0)
    scaled = [(60 * s, n, 1000 * b) for s, n, b in hist]
    b = BeliefModel().predict(task_with(scaled, default=1.0), 300.0)
    assert b[0] == pytest.approx(1000 * a[0], rel=1e-6)
    assert b[1] == pytest.approx(1000 * a[1], rel=1e-6)


def test_fit_cached_until_history_changes():
    hist = [(3.0 * k, 8 * k, 1e-3 * (0.3 + 0.4 * k**-0.7)) for k in range(1, 6)]
    t = task_with(hist)
    m = BeliefModel()
    first = m.predict(t, 3.0)
    for _ in range(5):
        assert m.predict(t, 3.0) == first
    assert m.fits == 1
    t.history.append((18.0, 48, 1e-3 * 0.3))
    m.predict(t, 3.0)
    assert m.fits == 2


def test_shared_prior_learns_from_other_tasks():
    m = BeliefModel(prior_gain_tuned=0.1, prior_strength=2.0)
    fresh = task_with([(3.0, 8, 5e-4)], index=9)
    before = m.predict(fresh, 3.0)[0]
    # many tasks whose second slot halved their latency
    others = [task_with([(3.0, 8, 8e-4), (6.0, 16, 4e-4)], index=i) for i in range(20)]
    m.observe(others + [fresh], 3.0)
    after = m.predict(fresh, 3.0)[0]
    assert after > 3 * before
    m.observe([task_with([(3.0, 8, 8e-4), (6.0, 16, 8e-4)], index=i) for i in range(20)], 3.0)  # replaced
    assert m.predict(fresh, 3.0)[0] < before
