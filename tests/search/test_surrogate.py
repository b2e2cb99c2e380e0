"""AdaTune's bootstrap-ensemble cost model (dynatune.search.surrogate)."""

import math
import sys

import numpy as np
import pytest

from dynatune.search.surrogate import _Ensemble, acquisition_kappa, pack_sum

NF = 8  # synthetic feature width
FAST = {"nthread": 1, "num_boost_round": 40}  # cheap members: 2 busy cores in CI


def _g(rows: np.ndarray) -> np.ndarray:
    """Per-row synthetic target; a candidate's score is the sum over its rows (pack-sum)."""
    return 0.1 + 0.1 * np.exp(-((rows[:, 0] - 5.0) ** 2) / 8.0) + 0.02 * rows[:, 1]


def _candidates(rng, n, lo=0.0, hi=10.0):
    """n candidates of 1-4 rows each (features uniform in [lo, hi]) and their scores."""
    xs = [rng.uniform(lo, hi, size=(int(rng.integers(1, 5)), NF)).astype(np.float32) for _ in range(n)]
    return xs, np.array([_g(x).sum() for x in xs])


@pytest.fixture(scope="module")
def data():
    rng = np.random.default_rng(0)
    train = _candidates(rng, 150)
    test = _candidates(rng, 100)
    far = _candidates(rng, 100, 20.0, 30.0)
    farther = _candidates(rng, 100, 40.0, 50.0)
    return train, test, far, farther


@pytest.fixture(scope="module")
def fitted(data):
    (xs, ys), *_ = data
    ens = _Ensemble(num_members=5, seed=0, **FAST)
    ens.fit(xs, ys)
    return ens


def _model(**kw):
    from dynatune.search.surrogate import EnsembleModel

    return EnsembleModel(**{**FAST, **kw})


# -- one real MetaSchedule integration
# (TuneContext needs TVM's tensor-intrinsic registry: imported the fast way)
def _matmul_mod(n=64):
    import tvm
    from tvm import te

    a = te.placeholder((n, n), name="A", dtype="float32")
    b = te.placeholder((n, n), name="B", dtype="float32")
    k = te.reduce_axis((0, n), name="k")
    c = te.compute((n, n), lambda i, j: te.sum(a[i, k] * b[k, j], axis=k), name="C")
    return tvm.IRModule({"main": te.create_prim_func([a, b, c])})


def matmul_search(cost_model, *, max_trials: int, per_iter: int, rand_state: int, num_threads: int):
    """A real MetaSchedule search on a 64x64 matmul with ``cost_model``: its TuneContext, pre-tuned."""
    import tvm
    from tvm.s_tir import meta_schedule as ms

    target = tvm.target.Target(
        {"kind": "llvm", "mcpu": tvm.target.codegen.llvm_get_system_cpu(), "num-cores": 2}
    )
    strategy = ms.search_strategy.EvolutionarySearch(
        population_size=16, init_measured_ratio=0.2, init_min_unmeasured=8, genetic_num_iters=1
    )
    ctx = ms.TuneContext(
        mod=_matmul_mod(),
        target=target,
        space_generator="post-order-apply",
        search_strategy=strategy,
        task_name="mm64",
        rand_state=rand_state,
        num_threads=num_threads,
    )
    ctx.pre_tuning(
        max_trials=max_trials,
        num_trials_per_iter=per_iter,
        design_spaces=ctx.generate_design_space(),
        database=ms.database.MemoryDatabase(),
        cost_model=cost_model,
    )
    return ctx


@pytest.mark.slow
def test_evolutionary_search_with_ensemble(tmp_path):
    from tvm.s_tir.meta_schedule.runner import RunnerResult

    model = _model(seed=0, contextual_exploration=True, num_members=3, num_boost_round=20)
    ctx = matmul_search(model, max_trials=32, per_iter=4, rand_state=1, num_threads=2)
    try:
        cands = ctx.generate_measure_candidates()  # untrained model: random predictions
        assert cands and len(cands) <= 4
        pre = model.predict(ctx, cands)
        assert pre.shape == (len(cands),) and np.all(np.isfinite(pre))
        results = [
            RunnerResult([0.001 * (1 + 0.1 * i), 0.0011 * (1 + 0.1 * i)], None) for i in range(len(cands))
        ]
        ctx.notify_runner_results(cands, results)
        model.update(ctx, cands, results)
        assert model.data_size == len(cands) and model.stale and not model.ensemble.trained
        pred = model.predict(ctx, cands)  # the prediction trains it, then sets kappa from the batch
        assert not model.stale and model.ensemble.fits == 1
        assert len(model.exploration_log) == 1 and math.isfinite(model.exploration)
        mean, std = model.predict_mean_std(ctx, cands)
        assert pred.dtype == np.float64 and pred.shape == mean.shape == std.shape == (len(cands),)
        assert np.all(np.isfinite(pred)) and np.all(std >= 0)
        np.testing.assert_allclose(pred, mean + model.exploration * std)
        # (TVM's CostModel.predict wrapper cannot pass an empty buffer; the Python side handles it)
        assert model._inst.predict(ctx, []).shape == (0,)
        assert model.predict_mean_std(ctx, [])[0].shape == (0,)
        # the search keeps running with the trained model inside it
        cands2 = ctx.generate_measure_candidates()
        assert cands2 is not None
        if cands2:
            assert np.all(np.isfinite(model.predict(ctx, cands2)))
        path = str(tmp_path / "cm")
        model.save(path)
        again = _model(seed=0, contextual_exploration=True, num_members=3)
        again.load(path)
        np.testing.assert_array_equal(again.predict(ctx, cands), pred)
    finally:
        ctx.post_tuning()


# -- the numpy core -------------------------------------------------------------------------------------
def test_numpy_core_imports_without_tvm():
    import subprocess

    code = (
        "import sys; from dynatune.search.surrogate import _Ensemble; import numpy as np; "
        "e=_Ensemble(seed=0);"
        "e.fit([np.ones((2,3),np.float32)]*4, np.ones(4)); e.predict_mean_std([np.ones((1,3),np.float32)]);"
        "assert 'tvm' not in sys.modules, 'numpy core pulled in tvm'"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)


def test_pack_sum_ids_and_empty_candidates():
    rows, ids = pack_sum([np.ones((2, 3)), np.zeros((0, 3)), np.ones((1, 3))])
    assert rows.shape == (3, 3) and ids.tolist() == [0, 0, 2]
    ens = _Ensemble(seed=0)
    m, s = ens.predict_mean_std([])  # untrained, empty
    assert m.shape == (0,) and s.shape == (0,)


def test_std_larger_away_from_training_data(fitted, data):
    (xs, _), (xt, _), (xf, _), _ = data
    _, s_train = fitted.predict_mean_std(xs)
    _, s_test = fitted.predict_mean_std(xt)  # new points, same region as the data
    _, s_far = fitted.predict_mean_std(xf)  # every feature 10-20 units beyond the data
    assert np.all(np.isfinite(s_far)) and np.all(s_test >= 0)
    assert s_far.mean() > 1.5 * s_test.mean(), (s_test.mean(), s_far.mean())
    assert s_far.mean() > 1.5 * s_train.mean(), (s_train.mean(), s_far.mean())


def test_random_prior_makes_std_grow_with_distance(data):
    (xs, ys), (xt, yt), (xf, _), (xff, _) = data
    ens = _Ensemble(num_members=5, seed=1, prior_scale=0.1, **FAST)
    ens.fit(xs, ys)
    m, s_test = ens.predict_mean_std(xt)
    s_far, s_farther = ens.predict_mean_std(xf)[1].mean(), ens.predict_mean_std(xff)[1].mean()
    assert s_farther > s_far > 3 * s_test.mean()
    assert np.corrcoef(m, yt)[0, 1] > 0.9  # the trees cancel the priors on the data


def test_mean_tracks_synthetic_function(fitted, data):
    _, (xt, yt), _, _ = data
    m, s = fitted.predict_mean_std(xt)
    assert m.shape == (100,) and s.shape == (100,)
    assert np.corrcoef(m, yt)[0, 1] > 0.95
    assert np.sqrt(np.mean((m - yt) ** 2)) < 0.3 * yt.std()
    members = fitted.predict_members(xt)
    assert members.shape == (5, 100)
    assert not np.allclose(members[0], members[1])  # bootstrap resamples differ


def test_bootstrap_resamples_whole_candidates():
    rng = np.random.default_rng(0)
    xs = [np.full((k % 3 + 1, NF), k, np.float32) for k in range(20)]  # candidate k: k%3+1 rows of value k
    ys = np.arange(20, dtype=np.float64)
    bx, by = _Ensemble._resample(xs, ys, rng)
    assert len(bx) == 20 and len(set(map(id, bx))) < 20  # with replacement
    for x, y in zip(bx, by):
        assert x.shape[0] == int(y) % 3 + 1 and np.all(x == y)  # each draw is a whole candidate + its label


def test_acquisition_kappa_rule():
    assert acquisition_kappa(np.array([0.1, 0.3]), np.array([0.5, 1.0]), (0.0, 2.0)) == pytest.approx(0.2)
    assert acquisition_kappa(np.array([5.0]), np.array([1.0]), (0.0, 2.0)) == 2.0
    assert acquisition_kappa(np.array([0.1]), np.array([-1.0]), (0.0, 2.0)) == 2.0  # best clipped to tiny
    assert acquisition_kappa(np.array([]), np.array([]), (0.5, 2.0)) == 0.5


# -- the MetaSchedule wrapper, on synthetic features ------------------------------------------------------
def test_kappa_recomputed_each_update_bounded_and_logged():
    model = _model(seed=0, contextual_exploration=True, kappa_bounds=(0.05, 0.5))
    rng = np.random.default_rng(0)
    sizes = []
    for batch in range(4):
        xs, ys = _candidates(rng, 16)
        costs = (1.0 / ys).astype(np.float32)  # cost ~ 1/score
        model._add("g0", xs, costs)
        model.train_if_stale()  # what the search's next prediction does
        sizes.append(model.data_size)
        assert 0.05 <= model.exploration <= 0.5
        assert len(model.exploration_log) == batch + 1
        assert model.exploration_log[-1] == (model.data_size, model.exploration)
    assert [s for s, _ in model.exploration_log] == sizes == [16, 32, 48, 64]
    # adaptive training: 48 -> 64 is >= 20 % growth, but 64 -> 70 is not (no retrain, kappa still updated)
    fits = model.ensemble.fits
    xs, ys = _candidates(rng, 6)
    model._add("g0", xs, (1.0 / ys).astype(np.float32))
    assert model.ensemble.fits == fits and len(model.exploration_log) == 5


def test_updates_train_nothing_until_a_prediction_needs_it():
    """Updates only mark the ensemble stale; the next prediction trains it once, on all the data, as an
    ensemble fitted at once on the same data (the coverage pass's updates train nothing)."""
    rng = np.random.default_rng(2)
    model = _model(seed=5, contextual_exploration=True)
    batches = [_candidates(rng, n) for n in (16, 16, 4)]
    for xs, ys in batches:
        model._add("g0", xs, (1.0 / ys).astype(np.float32))
    assert model.stale and model.ensemble.fits == 0 and model.exploration_log == []
    model.train_if_stale()
    assert not model.stale and model.ensemble.fits == 1
    model.train_if_stale()  # nothing new to learn: no training
    assert model.ensemble.fits == 1
    at_once = _Ensemble(num_members=5, seed=5, **FAST)
    xs = [x for b, _ in batches for x in b]
    ys = np.concatenate([g.scores() for g in model.data.values()])
    at_once.fit(xs, ys)
    xt, _ = _candidates(rng, 30)
    np.testing.assert_array_equal(model.ensemble.predict_mean_std(xt), at_once.predict_mean_std(xt))
    # kappa from the latest batch, by the trained ensemble
    mean, std = at_once.predict_mean_std(batches[-1][0])
    assert model.exploration_log == [(36, acquisition_kappa(std, mean, model.kappa_bounds))]


def test_a_stale_ensemble_saved_and_loaded_trains_on_its_first_prediction(tmp_path):
    rng = np.random.default_rng(3)
    model = _model(seed=1)
    xs, ys = _candidates(rng, 24)
    model._add("g0", xs, (1.0 / ys).astype(np.float32))
    path = str(tmp_path / "cost_model")
    model.save(path)
    other = _model(seed=9)
    other.load(path)
    assert other.stale and not other.ensemble.trained and other.data_size == 24
    model.train_if_stale()
    other.train_if_stale()
    xt, _ = _candidates(rng, 20)
    np.testing.assert_array_equal(model.ensemble.predict_mean_std(xt), other.ensemble.predict_mean_std(xt))
    model.save(path)  # trained now: saved as such
    other.load(path)
    assert not other.stale and other.ensemble.trained


def test_kappa_bounds_validated():
    with pytest.raises(ValueError):
        _model(kappa_bounds=(2.0, 1.0))


def test_save_load_round_trip(tmp_path):
    rng = np.random.default_rng(1)
    model = _model(seed=3, contextual_exploration=True, prior_scale=0.05)
    xs, ys = _candidates(rng, 40)
    model._add("g0", xs, (1.0 / ys).astype(np.float32))
    xs2, ys2 = _candidates(rng, 20)
    model._add("g1", xs2, (2.0 / ys2).astype(np.float32))
    model.train_if_stale()
    path = str(tmp_path / "cost_model")  # no extension, as the session uses
    model.save(path)
    other = _model(seed=99, contextual_exploration=True)
    other.load(path)
    xt, _ = _candidates(rng, 30)
    m1, s1 = model.ensemble.predict_mean_std(xt)
    m2, s2 = other.ensemble.predict_mean_std(xt)
    np.testing.assert_array_equal(m1, m2)
    np.testing.assert_array_equal(s1, s2)
    assert other.data_size == model.data_size == 60
    assert other.exploration == model.exploration and other.exploration_log == model.exploration_log
    assert list(other.data) == ["g0", "g1"]
    # loading continues training where it left off
    xs3, ys3 = _candidates(rng, 30)
    other._add("g0", xs3, (1.0 / ys3).astype(np.float32))
    assert other.data_size == 90
    bad = tmp_path / "bad"
    bad.write_bytes(b"not a model")
    with pytest.raises(Exception):
        _model().load(str(bad))


def test_make_cost_model_passes_contextual_exploration():
    from dynatune.search.costmodel import make_cost_model

    m = make_cost_model("ensemble", seed=4, contextual_exploration=True)
    assert m.contextual_exploration is True and m.seed == 4
    assert make_cost_model("ensemble").contextual_exploration is False
