"""The batches after a task's first: MetaSchedule's evolutionary search with its initial population carried
from batch to batch (``search.carry_population``; real TVM)."""

from __future__ import annotations

import numpy as np
import pytest
from test_analytic import conv_onnx, random_args, run


def _session(tmp_path, cpu_target, **search):
    from dynatune.model.extract import extract_tasks
    from dynatune.model.importer import load_model
    from dynatune.search.session import SearchConfig, TuningSession

    tasks = extract_tasks(load_model(conv_onnx(tmp_path / "m.onnx")), cpu_target)
    config = SearchConfig(trials_per_iter=8, population_size=16, init_min_unmeasured=4, **search)
    return tasks, TuningSession(tasks, cpu_target, str(tmp_path / "work"), search=config)


def _hashes(cands):
    from tvm_ffi import structural_hash

    return [structural_hash(getattr(c, "sch", c).mod) for c in cands]  # candidates or schedules


def _record(cand, workload, target, seconds: float):
    from tvm.s_tir import meta_schedule as ms

    return ms.database.TuningRecord(
        cand.sch.trace, workload, [seconds], target, ms.arg_info.ArgInfo.from_prim_func(cand.sch.mod["main"])
    )


def test_a_carried_population_draws_few_samples_and_never_returns_a_schedule_twice(tmp_path, cpu_target):
    from dynatune.search.population import CarriedPopulation

    tasks, session = _session(tmp_path, cpu_target)
    try:
        task, ctx = tasks[0], session._context(0)
        workload = session.db.workload(task.key, task.mod)
        pop = CarriedPopulation(ctx, session.db.memory, workload, measured_ratio=0.25, fresh=4, max_trials=20)
        batches, carried = [], []
        for _ in range(3):
            batches.append(pop.candidates(8))
            carried.append(len(pop.samples))
        assert [len(b) for b in batches] == [8, 8, 4]  # the third stops at max_trials
        assert pop.candidates(8) == []
        hashes = [h for b in batches for h in _hashes(b)]
        assert len(set(hashes)) == len(hashes) == 20
        # the first batch fills the population with samples (a postprocessor may reject a few); later ones
        # replace `fresh` of them, or fill what is missing
        assert pop.drawn[0] == 16 and 4 <= carried[0] <= 16 and max(carried) <= 16
        assert pop.drawn[1:3] == [max(4, 16 - carried[0]), max(4, 16 - carried[1])]

        args = random_args(task.mod)
        want = run(task.mod, cpu_target, [a.copy() for a in args])
        got = run(batches[1][0].sch.mod, cpu_target, [a.copy() for a in args])
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)

        # the database's best records join the population, each replayed once while it stays among the best
        for k, cand in enumerate(batches[0][:5]):
            session.db.memory.commit_tuning_record(_record(cand, workload, cpu_target, 1e-3 * (k + 1)))
        best = pop._best_schedules()
        assert pop.best_count == 4 and len(best) == 4 and pop.replays == 4
        assert _hashes(best) == _hashes(batches[0][:4])
        pop._best_schedules()
        assert pop.replays == 4
        session.db.memory.commit_tuning_record(_record(batches[1][0], workload, cpu_target, 1e-4))
        assert len(pop._best_schedules()) == 4 and pop.replays == 5  # only the new best is replayed
        pop.max_trials = 40
        assert len(pop.candidates(8)) == 8 and len(pop.samples) <= 12  # the population: 4 best + 12 samples
    finally:
        session.close()


@pytest.mark.slow
@pytest.mark.parametrize("carry", [True, False])
def test_a_sessions_batches_after_the_first_carry_their_population(carry, tmp_path, cpu_target):
    from tvm.s_tir import meta_schedule as ms

    tasks, session = _session(tmp_path, cpu_target, carry_population=carry)
    try:
        session.tune(0, trials=8, batch=8)  # the first batch: its head and random samples
        with ms.Profiler() as later:
            res = session.tune(0, trials=16)
        assert res.trials == 16 and res.build_errors == res.run_errors == 0
        assert session.db.num_records(tasks[0].key) == 24
        scopes = later.get()
        assert "EvoSearch/SampleInitPopulation" in scopes and "EvoSearch/Evolve/Mutation" in scopes
        # MetaSchedule's own batches replay the database's best in C++ every batch; carried, in Python once
        assert ("EvoSearch/PickBestFromDatabase" in scopes) is not carry
        assert (0 in session._populations) is carry
        if carry:
            pop = session._populations[0]
            assert pop.best_count == 3 and pop.drawn[0] == 16 - 3 and pop.drawn[1] < pop.drawn[0]
    finally:
        session.close()
