"""Integration: real TVM tuning, a few trials, two sessions (processes' worth of state), compile, verify."""

import json
import math
import os

import numpy as np
import pytest
from helpers import no_wait_policy, randomized_light_model, run_in_plain_tvm

from dynatune.compiler.compile import compare, compile_and_verify
from dynatune.model.extract import extract_tasks
from dynatune.model.importer import load_model
from dynatune.search.database import TuningDatabase, _trim_partial_line, read_jsonl
from dynatune.search.measure import MeasureConfig
from dynatune.search.session import SearchConfig, TuningSession

pytestmark = pytest.mark.slow  # real tuning, servers or subprocesses

SMALL = SearchConfig(trials_per_iter=4, population_size=32, init_min_unmeasured=16, genetic_num_iters=1)
FAST = MeasureConfig(repeat=3, min_repeat_ms=5)


@pytest.fixture(scope="module")
def squeezenet(cpu_target, tmp_path_factory):
    path = randomized_light_model("squeezenet", str(tmp_path_factory.mktemp("m") / "squeezenet.onnx"))
    model = load_model(path)
    return model, extract_tasks(model, cpu_target)


@pytest.fixture(scope="module")
def small_net(cpu_target, tmp_path_factory):
    """Convolutions, a residual add, a 1x1 conv, pooling and a classifier, at 16x16: a whole model that
    compiles in seconds (squeezenet at 224x224 took 80 s here, most of it untuned kernels)."""
    from helpers import make_tiny_onnx

    path = make_tiny_onnx(
        str(tmp_path_factory.mktemp("m") / "small.onnx"), batch=1, channels=16, extra_layer=True
    )
    model = load_model(path)
    return model, extract_tasks(model, cpu_target)


def test_two_sessions_resume_compile_and_verify(small_net, cpu_target, tmp_path):
    model, tasks = small_net
    work = str(tmp_path / "work")
    s1 = TuningSession(tasks, cpu_target, work, search=SMALL, measure=FAST)
    defaults = s1.measure_defaults()
    assert all(d is not None and math.isfinite(d) and d > 0 for d in defaults.values())
    est0 = s1.estimated_latency()
    assert est0 == pytest.approx(sum(t.weight * defaults[t.index] for t in tasks))
    r0 = s1.tune(0, trials=4)
    r1 = s1.tune(1, trials=4)
    for r in (r0, r1):
        assert r.trials >= 4 and r.build_errors + r.run_errors < r.trials
        assert r.best_after_s <= r.best_before_s
        assert r.search_s > 0 and r.build_s > 0 and r.measure_s > 0
        assert r.wall_s >= r.build_s + r.measure_s
    best1 = [s1.best_latency(0), s1.best_latency(1)]
    n_records = s1.db.num_records()
    assert n_records >= 8
    est1 = s1.estimated_latency()
    assert est1 <= est0
    s1.close()

    # a second session (as a new process would): records, defaults and history come back from disk
    s2 = TuningSession(tasks, cpu_target, work, search=SMALL, measure=FAST)
    assert s2.db.num_records() == n_records
    assert [s2.best_latency(0), s2.best_latency(1)] == best1
    assert s2.state(0).default_s == defaults[0] and len(s2.state(0).history) == 1
    r = s2.tune(0, trials=4)
    assert r.best_before_s == best1[0] and r.best_after_s <= best1[0]
    assert s2.estimated_latency() <= est1
    assert s2.state(0).trials >= 8
    report = compile_and_verify(
        model,
        cpu_target,
        s2.compile_database(),
        str(tmp_path / "model.so"),
        threads=2,
        repeat=3,
        quiet=no_wait_policy(),
        timing_processes=1,
    )
    s2.close()
    assert report.numerics_ok and report.max_rel_err < 1e-4
    assert report.latency_ms > 0 and report.untuned_latency_ms > 0 and report.onnxruntime_latency_ms > 0
    assert os.path.exists(report.artifact)


def test_artifact_runs_without_dynatune(squeezenet, cpu_target, tmp_path):
    """The exported library loads and runs in a plain TVM process that never imports dynatune."""
    from dynatune.compiler.compile import build, export

    model, _ = squeezenet
    path = export(build(model, cpu_target, None), str(tmp_path / "plain.so"))
    assert run_in_plain_tvm(model, path, tmp_path).ok


def test_compare_flags_wrong_outputs():
    ref = [np.ones((2, 3), np.float32)]
    assert compare([np.ones((2, 3), np.float32)], ref).ok
    bad = compare([np.ones((2, 3), np.float32) * 1.01], ref)
    assert not bad.ok and bad.max_rel_err == pytest.approx(0.01, rel=1e-3)


def test_database_survives_partial_line(tmp_path):
    path = tmp_path / "r.jsonl"
    path.write_bytes(b'{"a": 1}\n{"b": 2}\n{"c": 3')  # a kill mid-write
    assert read_jsonl(str(path)) == [{"a": 1}, {"b": 2}]
    _trim_partial_line(str(path))
    assert path.read_bytes() == b'{"a": 1}\n{"b": 2}\n'


def test_database_reopen_keeps_records(squeezenet, cpu_target, tmp_path):
    from tvm.s_tir import meta_schedule as ms
    from tvm.s_tir.meta_schedule.arg_info import ArgInfo

    _, tasks = squeezenet
    t = tasks[0]
    db = TuningDatabase(str(tmp_path / "db"))
    wl = db.workload(t.key, t.mod)
    ctx = ms.TuneContext(mod=t.mod, target=cpu_target, space_generator="post-order-apply")
    sch = ctx.generate_design_space()[0]  # a real (sampled) schedule trace
    db.commit(
        t.key,
        ms.database.TuningRecord(
            sch.trace, wl, [0.002, 0.004], cpu_target, ArgInfo.from_prim_func(t.mod["main"])
        ),
    )
    db.close()
    # simulate a kill during the next write: half a line at the end
    with open(db.records_path, "ab") as f:
        f.write(b'{"key": "' + t.key.encode() + b'", "rec')
    db2 = TuningDatabase(str(tmp_path / "db"))
    assert db2.num_records() == 1 and db2.best_latency(t.key) == pytest.approx(0.003)
    assert len(db2.memory.get_top_k(db2.workload(t.key, t.mod), 5)) == 1
    wl2 = db2.workload(t.key, t.mod)
    db2.commit(
        t.key,
        ms.database.TuningRecord(sch.trace, wl2, [0.001], cpu_target, ArgInfo.from_prim_func(t.mod["main"])),
    )
    # a batch's records: one write, each its own line
    batch = [
        ms.database.TuningRecord(sch.trace, wl2, secs, cpu_target, ArgInfo.from_prim_func(t.mod["main"]))
        for secs in ([0.0005], [0.05])
    ]
    assert [r[1] for r in db2.commit_many(t.key, batch)] == [[0.0005], [0.05]]
    db2.close()
    lines = [json.loads(x) for x in open(db.records_path)]
    assert len(lines) == 4  # the partial line was trimmed, not merged
    db3 = TuningDatabase(str(tmp_path / "db"))
    assert db3.num_records(t.key) == 4 and db3.best_latency(t.key) == pytest.approx(0.0005)
    db3.close()


def test_a_warm_start_carries_an_exhausted_search_space_but_tries_a_failing_task_again():
    """A task whose design space its source exhausted has nothing new here either (its records came along):
    it stays retired, so a retune's beliefs give it no gain. One retired for its failures is tried again."""
    from types import SimpleNamespace

    from dynatune.search.retirement import SEARCH_EXHAUSTED
    from dynatune.search.session_state import TaskState

    history = [[1.0, 8, 2e-5]]
    session = SimpleNamespace(states={k: TaskState() for k in ("spent", "failing", "tuned here")})
    session.states["tuned here"].history = [[2.0, 8, 1e-5]]
    earlier = {"history": history, "seconds": 1.0, "trials": 8, "default_s": 3e-5, "exhausted": True}
    TuningSession.adopt_progress(session, "spent", earlier | {"note": SEARCH_EXHAUSTED})
    failed = "retired: the last 48 candidates failed to build or run"
    TuningSession.adopt_progress(session, "failing", earlier | {"note": failed})
    TuningSession.adopt_progress(session, "tuned here", earlier | {"note": SEARCH_EXHAUSTED})
    spent, failing, own = (session.states[k] for k in ("spent", "failing", "tuned here"))
    assert spent.exhausted and spent.note == SEARCH_EXHAUSTED and spent.history == history
    assert not failing.exhausted and failing.history == history and failing.default_s == 3e-5
    assert not own.exhausted and own.history == [[2.0, 8, 1e-5]]  # its own progress kept
