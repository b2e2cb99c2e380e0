"""MetaSchedule's XGBoost model, trained when a prediction needs it: a batch's update only marks it stale,
and it is trained (once, on all its data) by the next prediction, also after a save and a load."""

from __future__ import annotations

import numpy as np
import pytest

from tests.search.test_surrogate import matmul_search


@pytest.fixture(scope="module")
def search():
    """A real MetaSchedule search on a 64x64 matmul: its context and two batches of candidates."""
    from tvm.s_tir import meta_schedule as ms

    ctx = matmul_search(
        ms.cost_model.RandomModel(seed=0), max_trials=64, per_iter=8, rand_state=5, num_threads=1
    )
    cands = list(ctx.generate_measure_candidates())
    yield ctx, cands[:4], cands[4:]
    ctx.post_tuning()


def _results(cands, scale=1.0):
    from tvm.s_tir.meta_schedule.runner import RunnerResult

    return [RunnerResult([scale * 1e-3 * (1 + 0.3 * i)], None) for i in range(len(cands))]


def _xgb():
    from dynatune.search.costmodel import make_cost_model

    model = make_cost_model("xgb")
    return model, getattr(model, "_inst", model)


def test_updates_train_nothing_until_a_prediction_needs_it(search):
    ctx, first, second = search
    model, inst = _xgb()
    model.update(ctx, first, _results(first))
    model.update(ctx, second, _results(second, 2.0))
    assert inst.stale and inst.booster is None and inst.trainings == 0
    lazy = model.predict(ctx, first + second)
    assert not inst.stale and inst.booster is not None and inst.trainings == 1
    model.predict(ctx, first)  # nothing new to learn: no training
    assert inst.trainings == 1
    # the same predictions as MetaSchedule's own model, which trained at the second update on the same data
    from tvm.s_tir.meta_schedule.cost_model import XGBModel
    from tvm.s_tir.meta_schedule.cost_model.xgb_model import XGBConfig

    from dynatune.machine.target import usable_cores

    eager = XGBModel(num_warmup_samples=0, adaptive_training=True, config=XGBConfig(nthread=usable_cores()))
    eager.update(ctx, first, _results(first))
    eager.update(ctx, second, _results(second, 2.0))
    np.testing.assert_allclose(lazy, eager.predict(ctx, first + second), rtol=1e-6)


def test_a_stale_model_saved_and_loaded_trains_on_its_first_prediction(search, tmp_path):
    from dynatune.search.costmodel import load_cost_model

    ctx, first, second = search
    model, inst = _xgb()
    model.update(ctx, first + second, _results(first + second))
    path = str(tmp_path / "cost_model")
    model.save(path)
    other, other_inst = _xgb()
    load_cost_model(other, path)
    assert other_inst.stale and other_inst.booster is None and other_inst.data_size == len(first + second)
    np.testing.assert_allclose(other.predict(ctx, first), model.predict(ctx, first), rtol=1e-6)
    assert other_inst.trainings == inst.trainings == 1
    model.save(path)  # trained now: saved as such
    load_cost_model(other, path)
    assert not other_inst.stale and other_inst.booster is not None
