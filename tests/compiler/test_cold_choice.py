"""The final choice among each task's best few kernels timed cold, as the model runs them
(:mod:`dynatune.compiler.cold_choice`; real TVM tuning and timing, the tiny conv net, ONNX Runtime)."""

import json
import math

import pytest
from helpers import few_trials_session

from dynatune.compiler import cold_choice
from dynatune.compiler.cold_choice import FINALISTS, WITHIN, choose_cold, finalists, pick
from dynatune.compiler.compile import build, verify
from dynatune.compiler.execution import relax_vm
from dynatune.search.database import mean_secs
from dynatune.search.measure import ColdProtocol


def test_the_fastest_cold_is_chosen_and_a_near_tie_stays_with_tunings_choice():
    assert pick([1.0, 0.9, 0.95]) == 1
    assert pick([1.0, 0.98]) == 0  # within the tie margin
    assert pick([math.inf, 2.0]) == 1  # tuning's choice failed to run cold
    assert pick([1.0, math.inf]) == 0
    assert pick([1.0]) == 0


@pytest.fixture(scope="module")
def tuned(tiny_model, tiny_tasks, cpu_target, tmp_path_factory):
    """The tiny model's heaviest task tuned for a few real trials: records to choose among."""
    session = few_trials_session(tiny_tasks, cpu_target, str(tmp_path_factory.mktemp("cold") / "work"))
    session.measure_defaults()
    session.tune(0, trials=12)
    yield session
    session.close()


@pytest.mark.slow  # builds and times a few kernels cold, compiles the model
def test_each_tuned_task_compiles_one_of_its_finalists_and_the_model_matches(
    tuned, tiny_model, cpu_target, tmp_path, monkeypatch
):
    import tvm

    session, database = tuned, tuned.compile_database()
    task = session.tasks[0]
    assert database.has_workload(task.mod)
    top = session.db.memory.get_top_k(session.db.workload(task.key, task.mod), FINALISTS)
    records, schedules = finalists(top)
    assert str(records[0].trace) == str(top[0].trace) and len(records) == len(schedules)
    assert all(mean_secs(r.run_secs) <= WITHIN * mean_secs(top[0].run_secs) for r in records)
    # every distinct record a finalist (a few trials' may all be far slower than the best), and the last
    # finalist forced: it is the one the compile database holds, and the model still matches
    monkeypatch.setattr(cold_choice, "WITHIN", math.inf)
    monkeypatch.setattr(cold_choice, "pick", lambda cold_s: len(cold_s) - 1)
    choice = choose_cold(session, database, ColdProtocol(repeats=3, passes=2))
    [final] = [f for f in choice.finalists if f.task == task.index]
    assert 2 <= len(final.cold_s) <= FINALISTS and final.chosen == len(final.cold_s) - 1
    assert all(0 < c < math.inf for c in final.cold_s) and final.warm_s == sorted(final.warm_s)
    [record] = choice.database.get_top_k(choice.database.commit_workload(task.mod), 10)
    assert mean_secs(record.run_secs) == pytest.approx(final.warm_s[-1])
    # every task the session's database compiles is in the cold choice's, with one record
    for t in session.tasks:
        if database.has_workload(t.mod):
            assert len(choice.database.get_top_k(choice.database.commit_workload(t.mod), 10)) == 1
    dev = tvm.cpu()
    check = verify(relax_vm(build(tiny_model, cpu_target, choice.database), dev), tiny_model, dev, threads=2)
    assert check.ok and check.max_rel_err < 1e-4
    path = choice.write(str(tmp_path / "report"))
    saved = json.load(open(path))
    assert saved["cold_protocol"] == {"repeats": 3, "passes": 2}
    assert [t["task"] for t in saved["tasks"]] == [f.task for f in choice.finalists]
    assert "tasks timed cold took another kernel" in choice.summary()


@pytest.mark.slow
def test_a_cold_timing_gives_every_pass_its_runs(tuned):
    from dynatune.search.reapply import measure_candidate

    session = tuned
    task = session.tasks[0]
    sch = session.db.memory.query_schedule(task.mod, session.target, "main")
    [cold] = session.time_candidates([measure_candidate(sch)], [task], cold=ColdProtocol(repeats=4, passes=3))
    assert cold.error_msg is None and len(cold.run_secs) == 12 and all(float(x) > 0 for x in cold.run_secs)
    # the next batch is timed as tuning times it again: the configured (adaptive) protocol, 3 to 10 repeats
    [warm] = session.time_candidates([measure_candidate(sch)], [task])
    assert warm.error_msg is None and 3 <= len(warm.run_secs) <= 10


def test_cold_choice_is_for_cpu_targets_only():
    import tvm

    assert cold_choice.applies(tvm.target.Target("llvm"))
    assert not cold_choice.applies(tvm.target.Target("cuda"))
