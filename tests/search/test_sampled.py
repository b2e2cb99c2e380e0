"""A task's first batch: its head, then random samples of its design space instead of the evolutionary
search (real TVM)."""

from __future__ import annotations

import numpy as np
import pytest
from test_analytic import conv_onnx, random_args, run


def _task_and_space(tmp_path, cpu_target):
    from tvm.s_tir import meta_schedule as ms

    from dynatune.model.extract import extract_tasks
    from dynatune.model.importer import load_model

    task = extract_tasks(load_model(conv_onnx(tmp_path / "m.onnx")), cpu_target)[0]
    ctx = ms.TuneContext(mod=task.mod, target=cpu_target, space_generator="post-order-apply")
    return task, ctx.generate_design_space(), ctx.space_generator.postprocs


def _hashes(cands):
    from tvm_ffi import structural_hash

    return [structural_hash(c.sch.mod) for c in cands]


def test_samples_are_distinct_reproducible_and_compute_what_the_task_does(tmp_path, cpu_target):
    from dynatune.search.sampled import sampled_candidates

    task, spaces, postprocs = _task_and_space(tmp_path, cpu_target)
    first = sampled_candidates(task.mod, spaces, postprocs, 5, seed=3)
    assert len(first) == 5 and len(set(_hashes(first))) == 5
    assert _hashes(sampled_candidates(task.mod, spaces, postprocs, 5, seed=3)) == _hashes(first)
    assert _hashes(sampled_candidates(task.mod, spaces, postprocs, 5, seed=4)) != _hashes(first)
    # none of the candidates it is told to leave out (a batch's head)
    others = sampled_candidates(task.mod, spaces, postprocs, 5, seed=3, exclude=first[:2])
    assert not set(_hashes(others)) & set(_hashes(first[:2]))
    assert sampled_candidates(task.mod, spaces, postprocs, 0, seed=3) == []

    args = random_args(task.mod)
    want = run(task.mod, cpu_target, [a.copy() for a in args])
    for cand in first[:2]:
        got = run(cand.sch.mod, cpu_target, [a.copy() for a in args])
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)


@pytest.mark.slow
@pytest.mark.parametrize("sampled", [True, False])
def test_the_first_batch_is_its_head_then_samples_not_the_evolutionary_search(sampled, tmp_path, cpu_target):
    from tvm.s_tir import meta_schedule as ms

    from dynatune.model.extract import extract_tasks
    from dynatune.model.importer import load_model
    from dynatune.search.session import SearchConfig, TuningSession

    tasks = extract_tasks(load_model(conv_onnx(tmp_path / "m.onnx")), cpu_target)
    search = SearchConfig(trials_per_iter=8, population_size=16, sampled_first_batch=sampled)
    session = TuningSession(tasks, cpu_target, str(tmp_path / "work"), search=search)
    try:
        with ms.Profiler() as first:
            res = session.tune(0, trials=8, batch=8)
        assert res.trials == 8 and res.build_errors == res.run_errors == 0
        assert session.analytic_counts[tasks[0].key] >= 1  # the head: the analytic candidates
        assert ("EvoSearch/SampleInitPopulation" in first.get()) is not sampled
        model = session.cost_model._inst  # learned from the batch, trained when the search next asks
        assert model.trainings == 0 and model.stale and model.data_size == 8
        with ms.Profiler() as second:
            session.tune(0, trials=8, batch=8)  # the next batch: the evolutionary search
        assert "EvoSearch/SampleInitPopulation" in second.get()
        assert model.trainings >= 1
        assert session.db.num_records(tasks[0].key) == 16
    finally:
        session.close()
