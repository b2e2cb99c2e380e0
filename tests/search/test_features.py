"""Features extracted once per distinct candidate: the same features, the repeats gone (issue #29 item 3)."""

from __future__ import annotations

import numpy as np
import pytest

from tests.search.test_surrogate import matmul_search


@pytest.fixture(scope="module")
def search():
    """A real MetaSchedule search on a 64x64 matmul: its context and a batch of candidates."""
    from tvm.s_tir import meta_schedule as ms

    ctx = matmul_search(
        ms.cost_model.RandomModel(seed=0), max_trials=64, per_iter=6, rand_state=3, num_threads=1
    )
    yield ctx, list(ctx.generate_measure_candidates())
    ctx.post_tuning()


def _arrays(tensors):
    return [t.numpy() for t in tensors]


def test_cached_features_equal_the_extractors_and_are_extracted_once(search):
    from tvm.ir import load_json, save_json
    from tvm.s_tir import Schedule
    from tvm.s_tir.meta_schedule.feature_extractor import PerStoreFeature
    from tvm.s_tir.meta_schedule.search_strategy import MeasureCandidate

    from dynatune.search.features import cached_features

    ctx, cands = search
    plain = _arrays(PerStoreFeature().extract_from(ctx, cands))
    cached = cached_features()
    first = _arrays(cached.extract_from(ctx, cands))
    assert len(first) == len(plain) == len(cands)
    for a, b in zip(first, plain):
        np.testing.assert_array_equal(a, b)
    assert (cached.misses, cached.hits) == (len(cands), 0)
    # the same candidates again (a measured batch the model learns from), and a copy of one (another
    # schedule object, structurally equal: a record rebuilt from its trace): nothing extracted again
    copy = MeasureCandidate(Schedule(load_json(save_json(cands[0].sch.mod))), cands[0].args_info)
    assert not copy.sch.mod.same_as(cands[0].sch.mod)
    again = _arrays(cached.extract_from(ctx, [*cands, copy]))
    assert cached.misses == len(cands) and cached.hits == len(cands) + 1
    for a, b in zip(again, [*plain, plain[0]]):
        np.testing.assert_array_equal(a, b)


def test_cache_holds_at_most_its_capacity_and_still_answers_a_bigger_batch(search):
    from dynatune.search.features import cached_features

    ctx, cands = search
    cached = cached_features(capacity=2)
    assert len(cached.extract_from(ctx, cands)) == len(cands)  # more distinct candidates than it holds
    assert len(cached.cache) == 2


def test_the_cost_models_extract_through_the_cache():
    from dynatune.search.costmodel import make_cost_model

    for kind in ("xgb", "ensemble"):
        model = make_cost_model(kind)
        assert hasattr(getattr(model, "_inst", model).extractor, "hits"), kind
