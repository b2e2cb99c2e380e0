"""Batches: candidates built as a few libraries (two shares per build worker), each timed from one load of it
(real TVM)."""

import numpy as np
import pytest
from helpers import make_tiny_onnx

from dynatune.search.builder import PersistentBuilder, build_and_export, split_artifact
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
