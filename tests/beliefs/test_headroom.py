"""Headroom beliefs on synthetic staircase curves with KNOWN headroom, the roofline, and the calibration
scores."""

import math

import numpy as np
import pytest
from helpers import calm_policy
from scipy.stats import spearmanr
from synthetic_traces import staircase_traces

from dynatune.beliefs import HeadroomBeliefs, make_beliefs, operator_kind
from dynatune.bench.belief_calibration import CalibrationProbe, calibration_rows, calibration_scores
from dynatune.bench.replay import default_slot, replay, total_trace_seconds
from dynatune.errors import DynatuneError
from dynatune.machine.roofline import Roofline, compulsory_bytes, machine_roofline
from dynatune.schedulers import make_scheduler
from dynatune.schedulers.base import TaskView

P0, GAMMA, U_MEAN = 0.6, 0.6, 0.4  # staircase_traces' defaults: jump law and Beta(2, 3) mean


class TrueGainProbe(CalibrationProbe):
    """Also records the slot's TRUE expected gain, from the generator's floors and jump law."""

    def __init__(self, beliefs, doc):
        super().__init__(beliefs)
        self.floor = {r["index"]: r["floor_s"] for r in doc["tasks"]}
        self.true = []

    def choose(self, ctx):
        i = super().choose(ctx)
        if i is not None:
            t = ctx.tasks[i]
            p = min(P0 * (t.visits + 1) ** -GAMMA, 1.0)
            self.true.append(p * U_MEAN * t.weight * max(t.best_s - self.floor[i], 0.0))
        return i


def rank_vs_true_gain(name: str, seed: int) -> float:
    doc = staircase_traces(seed=seed)
    probe = TrueGainProbe(make_beliefs(name), doc)
    replay(doc, probe, total_trace_seconds(doc), default_slot(doc))
    rows, true = np.array(probe.rows), np.array(probe.true[: len(probe.rows)])
    after_first = rows[:, 4] >= 2
    return spearmanr(rows[after_first, 0], true[after_first])[0]


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_headroom_ranks_the_true_expected_gain_far_better_than_the_curves(seed):
    headroom, curves = rank_vs_true_gain("headroom", seed), rank_vs_true_gain("curves", seed)
    assert headroom >= 0.9
    assert headroom > curves + 0.3


def test_jump_law_and_jump_size_are_recovered_from_many_staircases():
    doc = staircase_traces(n_tasks=90, slots=20, seed=5)
    model = HeadroomBeliefs()
    replay(doc, CalibrationProbe(model), total_trace_seconds(doc), default_slot(doc))
    for k in (2, 5, 15):
        assert model.jump_probability(k) == pytest.approx(P0 * k**-GAMMA, abs=0.08)
    assert model.u_mean == pytest.approx(U_MEAN, abs=0.1)


def view(i, name, default, history, bound, weight=1):
    return TaskView(i, name, f"k{i}", weight, 0.0, default, history, bound_s=bound)


def test_headroom_is_the_gap_to_the_kinds_attainable_fraction():
    # two convs with the same bound: one at 50 % of its roofline, one at 10 %
    near = view(0, "fused_conv2d_add", 1.0, [(3.0, 8, 0.2), (6.0, 16, 0.2)], bound=0.1)
    far = view(1, "fused_conv2d1_add1", 1.0, [(3.0, 8, 0.9), (6.0, 16, 0.9)], bound=0.1)
    pool = view(2, "max_pool2d", 1.0, [], bound=0.001)  # a kind nothing was tuned in yet
    m = HeadroomBeliefs(uplift=0.0)
    m.observe([near, far, pool], 3.0)
    assert m.phi_star["conv2d"] == pytest.approx(0.5)
    assert m.floor(near) == pytest.approx(0.2) and m.floor(far) == pytest.approx(0.2)
    assert m.predict(near, 3.0)[0] == 0.0  # at its kind's best fraction: no headroom without uplift
    gain, std, note = m.predict(far, 3.0)
    assert note == "headroom" and gain > 0 and std > 0
    assert m.phi_star["max"] == pytest.approx(0.5)  # the median of the kinds tuned so far
    lifted = HeadroomBeliefs(uplift=0.5)
    lifted.observe([near, far, pool], 3.0)
    assert lifted.phi_star["conv2d"] > 0.5 and lifted.predict(near, 3.0)[0] > 0.0
    assert (
        operator_kind("fused_conv2d7_add4_relu41") == "conv2d" and operator_kind("transpose1") == "transpose"
    )
    assert operator_kind("fused_matmul_add21") == "matmul"


def test_onnx_runtimes_time_lowers_the_floor_while_the_task_is_slower_and_never_raises_it():
    """A reachable point: 0.9 x ONNX Runtime's time for the operator lowers a roofline floor guessed above it
    while the task is slower; a roofline floor below it stays (a kernel can pass ONNX Runtime's: mnasnet0_5's
    first convolution went from 0.92x ONNX Runtime's to 0.30x in one slot, while a floor at ONNX Runtime's
    called it negligible); past it, the roofline's floor is all there is."""
    slow = view(0, "fused_conv2d_add", 1.0, [(3.0, 8, 0.9)], bound=0.1)
    anchored = view(1, "fused_conv2d1_add1", 1.0, [(3.0, 8, 0.9)], bound=0.1)
    anchored.anchor_s = 0.5
    lowered = view(3, "fused_conv2d3_add3", 1.0, [(3.0, 8, 0.9)], bound=0.1)
    lowered.anchor_s = 0.3
    past = view(2, "fused_conv2d2_add2", 1.0, [(3.0, 8, 0.4)], bound=0.1)
    past.anchor_s = 0.5
    m = HeadroomBeliefs(uplift=0.0)
    m.observe([slow, anchored, lowered, past], 3.0)
    roofline_floor = 0.1 / m.phi_star["conv2d"]  # the best of the kind (0.4) reaches 25 % of its bound
    assert m.floor(slow) == pytest.approx(roofline_floor) == pytest.approx(0.4)
    assert m.floor(anchored) == pytest.approx(roofline_floor)  # ONNX Runtime's 0.45 would raise it: not
    assert m.floor(lowered) == pytest.approx(0.27)  # known reachable: ONNX Runtime's 0.3 x 0.9
    assert m.floor(past) == pytest.approx(roofline_floor)
    assert m.predict(lowered, 3.0)[0] > m.predict(slow, 3.0)[0]
    assert HeadroomBeliefs(anchor_reach=0.0).floor(lowered) != pytest.approx(0.27)  # off


def test_dynatune_takes_the_belief_model_by_name():
    assert isinstance(make_scheduler("dynatune", belief_model="headroom").model, HeadroomBeliefs)
    with pytest.raises(DynatuneError, match="unknown belief model 'psychic'"):
        make_scheduler("dynatune", belief_model="psychic")


def test_calibration_scores_of_the_staircase():
    rows = calibration_rows(staircase_traces(seed=0), make_beliefs("headroom"))
    s = calibration_scores(rows)
    assert s["slots"] > 200 and 0.6 < s["zero_gain_share"] < 0.95
    assert -1 <= s["spearman"] <= 1 and 0 <= s["coverage"] <= 1
    assert calibration_scores(rows[:2])["spearman"] is None


def test_roofline_bound_and_bytes(tmp_path, cpu_target):
    roof = Roofline(peak_flops=1e11, bandwidth=1e10)
    assert roof.bound_s(2e9, 1e6) == pytest.approx(0.02) and roof.bound_s(0, 1e9) == pytest.approx(0.1)
    from helpers import make_tiny_onnx

    from dynatune.model.extract import extract_tasks
    from dynatune.model.importer import load_model

    model = load_model(make_tiny_onnx(str(tmp_path / "t.onnx")), {"x": (1, 3, 16, 16)})
    conv = next(t for t in extract_tasks(model, cpu_target) if t.name.startswith("fused_conv2d_add_relu"))
    # input 3x16x16, weight 8x3x3x3, bias 8, output 8x16x16, float32
    assert compulsory_bytes(conv.mod) == 4 * (3 * 256 + 8 * 27 + 8 + 8 * 256)
    measured = machine_roofline(cpu_target, cache_dir=str(tmp_path / "roof"), quiet=calm_policy())
    assert measured.peak_flops > 1e9 and measured.bandwidth > 1e8 and "llvm" in measured.fingerprint
    again = machine_roofline(cpu_target, cache_dir=str(tmp_path / "roof"))
    assert again == measured or measured.under_load  # cached per machine: not measured twice, once final
    assert math.isfinite(measured.bound_s(conv.flops, compulsory_bytes(conv.mod)))


@pytest.mark.slow
def test_a_live_tuner_gives_the_scheduler_each_tasks_bound_and_headroom_beliefs(tmp_path, cpu_target):
    from helpers import make_tiny_onnx

    from dynatune.model.extract import extract_tasks
    from dynatune.model.importer import load_model
    from dynatune.run.tuner import Tuner
    from dynatune.search.measure import MeasureConfig
    from dynatune.search.session import SearchConfig, TuningSession

    tasks = extract_tasks(load_model(make_tiny_onnx(str(tmp_path / "t.onnx"), batch=1)), cpu_target)
    session = TuningSession(
        tasks,
        cpu_target,
        str(tmp_path / "work"),
        search=SearchConfig(trials_per_iter=4, population_size=32),
        measure=MeasureConfig(repeat=3, min_repeat_ms=5),
    )
    roof = Roofline(peak_flops=5e12, bandwidth=1e11)  # out of reach: every task has headroom
    tuner = Tuner(
        session,
        "dynatune",
        budget_s=600,
        slot_s=1.0,
        scheduler_params={"belief_model": "headroom"},
        roofline=roof,
    )
    try:
        tuner.prepare()
        for _ in range(len(tasks) + 2):
            tuner.step()
        views = tuner.context().tasks
        conv = next(v for v in views if v.name.startswith("fused_conv2d"))
        t = tasks[conv.index]
        assert (
            conv.bound_s == pytest.approx(roof.bound_s(t.flops, compulsory_bytes(t.mod))) and conv.bound_s > 0
        )
        notes = {b.note for b in tuner.belief_table()}
        assert "headroom" in notes or any(n.startswith(("prior", "stalled")) for n in notes)
    finally:
        tuner.close()
    bare = Tuner(TuningSession(tasks, cpu_target, str(tmp_path / "w2")), "gradient", budget_s=1, slot_s=1)
    try:
        assert bare.context().tasks[0].bound_s == 0.0  # no roofline: unknown
    finally:
        bare.close()


# -- bounds and the rest of a budget ---------------------------------------------------------------------
def _tuned(i, name, best, bound, weight=1, slots=6):
    """A task tuned for ``slots`` slots: at twice its final best, then a step to ``best``, then flat."""
    hist = [(3.0, 8, 2 * best), (6.0, 16, best)] + [(3.0 * k, 8 * k, best) for k in range(3, slots + 1)]
    return view(i, name, 10 * best, hist, bound, weight)


def test_a_task_at_its_roof_or_its_floor_is_at_a_bound_and_says_which():
    at_roof = _tuned(0, "fused_conv2d_add", 1.0, bound=0.97)  # 97 % of its (compute) bound
    below = _tuned(1, "fused_conv2d1_add1", 1.0, bound=0.5)
    pool = _tuned(2, "max_pool2d", 1.0, bound=0.99)
    at_roof.flops, below.flops = 0.97e9, 0.5e9  # the peak's FLOPs per bound second: compute-bound
    pool.flops = 1.0  # far below the peak per bound second: memory-bound
    m = HeadroomBeliefs()
    m.observe([at_roof, below, pool], 3.0)
    assert m.limit(at_roof) == "at its roof (97% of its compute bound)"
    assert m.limit(pool) == "at its roof (99% of its memory bound)"
    assert m.limit(below) == ""
    # at its reachable floor, within the jump tolerance: 0.9 x ONNX Runtime's time for its operator, where
    # that is below the roofline's guess (the task alone of its kind, at 18.5 % of its bound, no uplift)
    anchored = _tuned(3, "fused_dense_add2", 0.9 * 0.6 * 1.001, bound=0.1)
    anchored.anchor_s = 0.6
    flat = HeadroomBeliefs(uplift=0.0)
    flat.observe([at_roof, below, pool, anchored], 3.0)
    assert flat.floor(anchored) == pytest.approx(0.54)
    assert flat.limit(anchored) == "at its reachable floor (540 ms)"
    assert make_beliefs("curves").limit(at_roof).startswith("at its roof")  # every model knows the roof


def test_the_gain_over_the_rest_compounds_jumps_on_the_headroom_left():
    far = _tuned(0, "fused_conv2d_add", 1.0, bound=0.1)
    near = _tuned(1, "fused_conv2d1_add1", 0.5, bound=0.1)
    m = HeadroomBeliefs()
    m.observe([far, near], 3.0)
    mean, std = m.predict_rest(far, 3.0, 40)
    one, one_std, _ = m.predict(far, 3.0)
    headroom = far.weight * (far.best_s - m.floor(far))
    assert mean.shape == std.shape == (40,)
    assert mean[0] == pytest.approx(one)  # one slot's gain: the one-slot prediction
    assert np.all(np.diff(mean) > 0) and mean[-1] < headroom  # more slots buy more, never the whole headroom
    assert np.all(np.diff(mean)[1:] <= np.diff(mean)[:-1] + 1e-15)  # and less per slot as the task tunes on
    assert std[0] == pytest.approx(one_std, rel=0.5) and np.all(std > 0)
    assert m.predict_rest(far, 3.0, 2.3)[0].shape == (3,)  # a part slot is a slot
    assert m.predict_rest(near, 3.0, 40)[0][-1] < mean[-1]  # less headroom, less to gain
    assert m.predict_rest(far, 3.0, 0)[0].size == 0


def test_the_gain_over_the_rest_of_the_other_models():
    curves = make_beliefs("curves")
    task = view(
        0, "fused_conv2d_add", 1.0, [(3.0 * k, 8 * k, 0.2 + 0.8 * math.exp(-k / 3)) for k in range(1, 9)], 0
    )
    curves.observe([task], 3.0)
    mean, _ = curves.predict_rest(task, 3.0, 10)
    assert (
        mean.shape == (10,) and mean[-1] > 0 and np.allclose(np.diff(mean), mean[0])
    )  # one fit, spread evenly
    assert mean[-1] < task.best_s  # the trend's drop, not ten times one slot's
    young = view(
        1, "fused_conv2d1_add1", 1.0, [(3.0, 8, 0.5)], 0
    )  # too few points to fit: one slot's, n times
    curves.observe([task, young], 3.0)
    one, one_std, _ = curves.predict(young, 3.0)
    mean, std = curves.predict_rest(young, 3.0, 4)
    assert mean == pytest.approx(np.minimum(one * np.arange(1, 5), young.best_s))
