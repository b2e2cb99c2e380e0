"""Batches: candidates built as a few libraries (two shares per build worker), each timed from one load of it
(real TVM)."""

from functools import partial

import faults
import numpy as np
import pytest
from helpers import make_tiny_onnx

from dynatune.search.builder import BuildTimeLimit, PersistentBuilder, build_and_export, split_artifact
from dynatune.search.measure import MeasureConfig, make_runner

FAST = MeasureConfig(adaptive=False, repeat=2, min_repeat_ms=1)  # exactly 2 repeats each


def _vector_funcs():
    """Three real PrimFuncs over float32[16]: a good one, one whose build fails (a free variable), one that
    crashes when run (it reads 2^36 elements past its input)."""
    from tvm import te, tirx

    n16 = tirx.IntImm("int64", 16)
    a = te.placeholder((n16,), name="A")
    good = te.create_prim_func([a, te.compute((n16,), lambda i: a[i] * 2.0, name="B")])
    free = tirx.Var("n", "float32")
    broken = te.create_prim_func([a, te.compute((n16,), lambda i: a[i] + free, name="B")])
    far = tirx.IntImm("int64", 1 << 36)
    crash = te.create_prim_func([a, te.compute((n16,), lambda i: a[i * far], name="B")])
    return good, broken, crash


def _inputs(funcs, target):
    import tvm
    from tvm.s_tir.meta_schedule.builder import BuilderInput

    return [BuilderInput(tvm.IRModule({"main": f}), target) for f in funcs]


def _run(runner, built, n=16):
    from tvm.s_tir.meta_schedule.arg_info import TensorInfo
    from tvm.s_tir.meta_schedule.runner import RunnerInput

    info = [TensorInfo("float32", [n]), TensorInfo("float32", [n])]
    return [f.result() for f in runner.run([RunnerInput(b.artifact_path, "cpu", info) for b in built])]


@pytest.fixture
def builder(tmp_path):
    b = PersistentBuilder(2, timeout_sec=60, artifact_dir=str(tmp_path / "build"))
    yield b
    b.close()


def test_a_batch_is_two_libraries_per_worker_and_a_candidate_that_fails_to_build_fails_alone(
    builder, cpu_target
):
    good, broken, _ = _vector_funcs()
    built = builder.build(_inputs([good] * 8, cpu_target))
    libraries = [split_artifact(b.artifact_path)[0] for b in built]
    assert libraries[0] == libraries[1] != libraries[2] and len(set(libraries)) == 4  # 2 workers x 2 shares
    assert all(split_artifact(b.artifact_path)[1] for b in built)

    built = builder.build(_inputs([good, broken, good, good, good, good, good, good], cpu_target))
    assert [b.error_msg is None for b in built] == [True, False] + [True] * 6
    assert "build failed" in built[1].error_msg and "(n,) are used" in built[1].error_msg
    runner = make_runner(FAST, cpu_target)
    try:
        results = _run(runner, [b for b in built if b.error_msg is None])
    finally:
        runner.close()
    assert all(r.error_msg is None and len(r.run_secs) == 2 for r in results)


@pytest.mark.slow  # a crashed measurement worker, restarted (subprocesses)
def test_a_candidate_that_crashes_inside_a_batch_fails_alone_and_the_rest_are_measured(builder, cpu_target):
    good, _, crash = _vector_funcs()
    built = builder.build(_inputs([good, crash, good, good, good, good, good, good], cpu_target))
    assert all(b.error_msg is None for b in built)
    assert (
        split_artifact(built[1].artifact_path)[0] == split_artifact(built[0].artifact_path)[0]
    )  # one library
    runner = make_runner(FAST, cpu_target)
    try:
        results = _run(runner, built)
    finally:
        runner.close()
    assert [r.error_msg is None for r in results] == [True, False] + [True] * 6
    assert "Subprocess terminated" in results[1].error_msg
    assert all(
        len(r.run_secs) == 2 and all(float(s) > 0 for s in r.run_secs)
        for i, r in enumerate(results)
        if i != 1
    )


def _sends(runner) -> list:
    """Each call the runner sends its worker, recorded (the worker is real)."""
    worker, sent = runner.inner.worker, []
    send = worker.send

    def recorded(fn, args=(), kwargs=None, timeout=None):
        sent.append(fn.__name__)
        return send(fn, args, kwargs, timeout)

    worker.send = recorded
    return sent


def test_a_batch_is_measured_in_one_call_and_an_evaluator_error_fails_alone(builder, cpu_target, tmp_path):
    faults.register()
    good, _, _ = _vector_funcs()
    built = builder.build(_inputs([good] * 8, cpu_target))
    evaluator = partial(faults.raising_second_evaluator, counter=str(tmp_path / "calls"))
    runner = make_runner(FAST, cpu_target, evaluator=evaluator)
    runner.warm_up()  # the worker starts before the first batch
    assert runner.inner.worker.is_alive()
    pid = runner.inner.worker._proc.pid
    sent = _sends(runner)
    try:
        results = _run(runner, built)
        assert runner.inner.worker._proc.pid == pid
        again = _run(runner, built)
        assert runner.inner.worker._proc.pid == pid  # an error the evaluator raises keeps the worker
    finally:
        runner.close()
    assert sent == ["measure_batch", "measure_batch"]  # one call per batch
    assert [r.error_msg is None for r in results] == [True, False] + [True] * 6
    assert "LocalRunner: An exception occurred" in results[1].error_msg
    assert "injected evaluator error" in results[1].error_msg
    assert all(r.error_msg is None and len(r.run_secs) == 2 for r in again)


@pytest.mark.slow  # a measurement worker ended and started afresh (subprocesses)
def test_a_worker_that_ended_between_batches_is_started_afresh(builder, cpu_target):
    import os
    import signal

    good, _, _ = _vector_funcs()
    built = builder.build(_inputs([good] * 4, cpu_target))
    runner = make_runner(FAST, cpu_target)
    try:
        runner.warm_up()
        pid = runner.inner.worker._proc.pid
        os.kill(pid, signal.SIGKILL)  # e.g. the kernel's OOM killer, while the worker waited
        runner.inner.worker.join(timeout=10)
        results = _run(runner, built)
        assert runner.inner.worker._proc.pid != pid
    finally:
        runner.close()
    assert all(r.error_msg is None and len(r.run_secs) == 2 for r in results)


@pytest.mark.slow  # waits out a hanging candidate's timeout in a worker (subprocesses)
def test_a_candidate_that_hangs_inside_a_batch_times_out_alone(builder, cpu_target, tmp_path, monkeypatch):
    """The worker's watchdog ends the hanging candidate after measure.timeout_s; the candidates after it
    are measured by a fresh worker, and the batch costs one timeout, not the batch's backstop."""
    import glob
    import tempfile
    import time

    from dynatune.search.measure import MeasureConfig

    faults.register()
    good, _, _ = _vector_funcs()
    built = builder.build(_inputs([good] * 8, cpu_target))
    # timeout_s: the fresh worker that measures the rest starts within it even beside another test worker
    cfg = MeasureConfig(adaptive=False, repeat=2, min_repeat_ms=1, timeout_s=5)
    evaluator = partial(faults.hanging_second_evaluator, counter=str(tmp_path / "calls"))
    runner = make_runner(cfg, cpu_target, evaluator=evaluator)
    sent = _sends(runner)
    # its progress files go to a folder of its own: another test worker's runs may have theirs in /tmp
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path / "progress"))
    (tmp_path / "progress").mkdir()
    try:
        t0 = time.perf_counter()
        results = _run(runner, built)
        elapsed = time.perf_counter() - t0
    finally:
        runner.close()
    assert [r.error_msg is None for r in results] == [True, False] + [True] * 6
    assert results[1].error_msg == "LocalRunner: Timeout, killed after 5.0 seconds\n"
    assert all(len(r.run_secs) == 2 for i, r in enumerate(results) if i != 1)
    assert sent == ["measure_batch", "measure_batch"]  # the rest of the batch: one more call
    assert 5 <= elapsed < 25  # one timeout and a fresh worker, far below the batch's backstop: 5 s x 9 = 45 s
    assert not glob.glob(str(tmp_path / "progress" / "dynatune-progress-*"))  # progress files removed


def test_the_build_time_limit_follows_the_builds_it_has_seen():
    limits = BuildTimeLimit(cap=15.0)  # factor 10, floor 4 s, after 8 candidates
    assert limits.limit(4) == 15.0  # nothing seen yet: the cap
    limits.record(0.7, 7)
    assert limits.limit(1) == 15.0  # 7 seen
    limits.record(0.1, 1)
    assert limits.limit(1) == 4.0  # 10 x 0.1 s = 1 s: the floor
    assert limits.limit(4) == pytest.approx(4.6)  # the floor for the slowest, 2 x 0.1 s for 3 others
    for _ in range(64):
        limits.record(1.0, 1)  # a loaded machine: builds of 1 s
    assert limits.limit(1) == pytest.approx(10.0)  # 10 x 1 s
    assert limits.limit(4) == 15.0  # 10 + 3 x 2 s: never above the cap


@pytest.mark.slow
def test_a_pathological_build_costs_the_limit_of_its_jobs_not_the_cap(cpu_target, tmp_path):
    """One candidate of a batch whose build would take 10 minutes: its share is stopped at the share's limit,
    the share's candidates are built alone, and it fails alone at one candidate's limit (4 s here), not at
    the cap (60 s) twice."""
    import time

    faults.register()
    good, _, _ = _vector_funcs()
    slow = good.with_attr(faults.SLOW_BUILD, 1)
    builder = PersistentBuilder(
        2,
        timeout_sec=60,
        artifact_dir=str(tmp_path / "build"),
        build_fn=faults.slow_build,
        batch_fn=faults.slow_batch,
    )
    try:
        assert all(b.error_msg is None for b in builder.build(_inputs([good] * 8, cpu_target)))
        assert builder.limits.limit(1) == 4.0  # 8 candidates seen, each in well under 0.2 s
        t0 = time.perf_counter()
        built = builder.build(_inputs([good, good, good, slow, good, good, good, good], cpu_target))
        elapsed = time.perf_counter() - t0
    finally:
        builder.close()
    assert [b.error_msg is None for b in built] == [True] * 3 + [False] + [True] * 4
    assert built[3].error_msg == "build timed out after 4s"
    assert elapsed < 20  # a share's limit (about 4 s) + one candidate's (4 s) + worker restarts


@pytest.mark.slow
def test_a_candidate_computes_the_same_built_in_a_batch_as_built_alone(cpu_target, tmp_path):
    """Real candidates of a convolution task: each function of the batch library gives the outputs of the
    same candidate built alone."""
    import tvm
    from tvm.s_tir.meta_schedule.builder import BuilderInput

    from dynatune.model.extract import extract_tasks
    from dynatune.model.importer import load_model
    from dynatune.search.local_runner import load_candidate
    from dynatune.search.session import SearchConfig, TuningSession

    model = load_model(make_tiny_onnx(str(tmp_path / "tiny.onnx"), batch=1))
    tasks = extract_tasks(model, cpu_target)
    session = TuningSession(tasks, cpu_target, str(tmp_path / "work"), search=SearchConfig(trials_per_iter=6))
    try:
        conv = next(i for i, t in enumerate(tasks) if "conv2d" in t.name)
        cands = list(session._context(conv).generate_measure_candidates())
        batch = session.builder.build([BuilderInput(c.sch.mod, cpu_target) for c in cands])
        rng = np.random.default_rng(0)
        for cand, b in zip(cands, batch):
            assert split_artifact(b.artifact_path)[1] is not None
            alone = build_and_export(cand.sch.mod, cpu_target, str(tmp_path))
            args = [rng.standard_normal([int(d) for d in a.shape]).astype(a.dtype) for a in cand.args_info]
            outs = []
            for f in (load_candidate(b.artifact_path), tvm.runtime.load_module(alone)):
                arrays = [tvm.runtime.tensor(x) for x in args]
                (f.library[f.entry_name] if hasattr(f, "library") else f[f.entry_name])(*arrays)
                outs.append(arrays[-1].numpy())
            np.testing.assert_array_equal(outs[0], outs[1])
    finally:
        session.close()
