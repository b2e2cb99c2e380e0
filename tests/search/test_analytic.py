"""Analytic first candidates: derived from the target's vector unit, verified numerically with real TVM, and
measured at the head of a task's first batch."""

from __future__ import annotations

import numpy as np
import pytest

from dynatune.machine.register_block import register_blocks
from dynatune.machine.target import cpu_model_and_isa
from dynatune.machine.vector import VectorUnit
from dynatune.search.analytic import plan_tiles

AVX512 = VectorUnit("avx512", 16, 32)
AVX2 = VectorUnit("avx2", 8, 16)
ISA = set(cpu_model_and_isa()[1])
X86 = {"mcpu": {"avx2": "haswell", "avx512": "skylake-avx512"}}


def conv_onnx(path, cin=16, cout=32, size=12, kernel=3, group=1, seed=0):
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(seed)
    w = rng.standard_normal((cout, cin // group, kernel, kernel)).astype(np.float32) * 0.2
    b = rng.standard_normal(cout).astype(np.float32)
    pad = kernel // 2
    nodes = [
        helper.make_node("Conv", ["x", "w", "b"], ["c"], pads=[pad] * 4, group=group),
        helper.make_node("Relu", ["c"], ["y"]),
    ]
    graph = helper.make_graph(
        nodes,
        "conv",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, cin, size, size])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, cout, size, size])],
        [numpy_helper.from_array(w, "w"), numpy_helper.from_array(b, "b")],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.save(model, str(path))
    return str(path)


def matmul_onnx(path, m=24, k=32, n=48, seed=0):
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    w = np.random.default_rng(seed).standard_normal((k, n)).astype(np.float32)
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "w"], ["y"])],
        "matmul",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [m, k])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [m, n])],
        [numpy_helper.from_array(w, "w")],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.save(model, str(path))
    return str(path)


def x86_target(isa: str):
    import tvm

    return tvm.target.Target({"kind": "llvm", "mcpu": X86["mcpu"][isa], "num-cores": 2})


def heaviest_task(path, target):
    from dynatune.model.extract import extract_tasks
    from dynatune.model.importer import load_model

    return extract_tasks(load_model(path), target)[0]


def candidates_for(task, target, limit=2):
    from dynatune.search.analytic import task_analytic_candidates

    return task_analytic_candidates(task.mod, target, limit=limit)[0]


def run(mod, target, args):
    """Run a task module (its weight layout rewritten inside, as built) on numpy arguments; the output."""
    import tvm

    lib = tvm.build(mod, target=target)
    dev = tvm.cpu()
    tensors = [tvm.runtime.tensor(a, dev) for a in args]
    lib["main"](*tensors)
    return tensors[-1].numpy()


def random_args(mod, seed=0):
    from tvm.s_tir.meta_schedule.arg_info import ArgInfo

    rng = np.random.default_rng(seed)
    return [
        rng.standard_normal([int(d) for d in a.shape]).astype(a.dtype)
        for a in ArgInfo.from_prim_func(mod["main"])
    ]


# -- the plan follows the target ---------------------------------------------------------------------------


def test_register_block_fills_the_registers_of_each_isa():
    spatial = [1, 55, 55, 64]
    for unit in (AVX512, AVX2):
        best = register_blocks(spatial, unit)[0]
        vectors = -(-best.columns // unit.lanes)
        assert best.columns % unit.lanes == 0
        assert 8 <= best.row_count * vectors <= unit.accumulators
    assert register_blocks(spatial, AVX512)[0] != register_blocks(spatial, AVX2)[0]


def test_columns_are_whole_vectors_or_a_power_of_two_part():
    # 1000 output channels: 8 (a half AVX-512 register) is chosen, never 25 or 40
    for b in register_blocks([1, 13, 13, 1000], AVX512):
        assert b.columns in (1, 2, 4, 8)
    assert register_blocks([1, 13, 13, 1000], AVX512)[0].columns == 8


def test_plan_splits_every_loop_exactly_and_balances_the_threads():
    spatial, reduction = [1, 27, 27, 128], [3, 3, 32]
    plan = plan_tiles(spatial, reduction, AVX512, cores=2)
    for extent, tiles in zip(spatial, plan.spatial):
        assert np.prod(tiles) == extent
    assert [np.prod(r) for r in plan.reduction] == reduction
    assert all(r[1] == 1 for r in plan.reduction)  # one broadcast per row and reduction step
    jobs = np.prod([t[0] for t in plan.spatial])
    assert jobs >= 2 * 8
    assert plan_tiles(spatial, reduction, AVX512, 2, rank=1).block != plan.block
    assert plan_tiles([4], [], AVX512, 2) is None  # no reduction: nothing to block


# -- real TVM: numerics, fallback, code generation ----------------------------------------------------------


@pytest.mark.parametrize("isa", ["avx2", "avx512"])
@pytest.mark.parametrize(
    "model", ["conv3x3", "conv1x1_strided_grouped", "depthwise", "depthwise5x5", "matmul"]
)
def test_analytic_candidates_compute_what_the_operator_does(isa, model, tmp_path):
    target = x86_target(isa)
    path = {
        "conv3x3": lambda: conv_onnx(tmp_path / "m.onnx"),
        "conv1x1_strided_grouped": lambda: conv_onnx(tmp_path / "m.onnx", cin=16, cout=32, kernel=1, group=2),
        "depthwise": lambda: conv_onnx(tmp_path / "m.onnx", cin=16, cout=16, group=16),
        "depthwise5x5": lambda: conv_onnx(tmp_path / "m.onnx", cin=32, cout=32, kernel=5, group=32),
        "matmul": lambda: matmul_onnx(tmp_path / "m.onnx"),
    }[model]()
    check_candidates_compute(heaviest_task(path, target), target, isa)


def check_candidates_compute(task, target, isa: str) -> None:
    """``task`` has analytic candidates for ``target`` (an ``isa`` one), and where this CPU runs ``isa``,
    each computes what the unscheduled task does on random data."""
    cands = candidates_for(task, target)
    assert cands, f"no analytic candidate for {task.name}"
    if {"avx2": "avx2", "avx512": "avx512f"}[isa] not in ISA:
        pytest.skip(f"this CPU cannot run {isa} code (compiled only)")
    args = random_args(task.mod)
    want = run(task.mod, target, [a.copy() for a in args])
    for c in cands:
        got = run(c.sch.mod, target, [a.copy() for a in args])
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("model", ["grouped3x3", "depthwise", "conv1x1"])
def test_each_register_block_gives_its_padding_at_the_root_then_inlined(model, cpu_target, tmp_path):
    """A padded convolution's candidates come in pairs per register block: the padding in a pass of its own
    (a dense convolution reuses each input value over its output channels), then inlined (a depthwise one
    reads each value for one channel: the extra pass cost it 2-6x). No padding: one candidate per block.
    (Grouped: a dense first convolution reads the model's input with the padding in its reads.)"""
    path = {
        "grouped3x3": lambda: conv_onnx(tmp_path / "m.onnx", group=2),
        "depthwise": lambda: conv_onnx(tmp_path / "m.onnx", cin=32, cout=32, kernel=5, group=32),
        "conv1x1": lambda: conv_onnx(tmp_path / "m.onnx", kernel=1),
    }[model]()
    cands = candidates_for(heaviest_task(path, cpu_target), cpu_target)
    padded = ["pad_temp" in c.sch.mod.script() for c in cands]
    assert padded == ([False, False] if model == "conv1x1" else [True, False, True, False])


def test_the_inner_loop_is_register_blocked_fmas_for_each_isa(tmp_path):
    """AVX-512: FMAs on zmm registers; AVX2: on ymm registers. LLVM compiles both on any x86 machine."""
    from dynatune.search.builder import compile_scheduled

    path = conv_onnx(tmp_path / "m.onnx", cin=32, cout=64, size=14)
    for isa, register in (("avx512", "zmm"), ("avx2", "ymm")):
        target = x86_target(isa)
        cand = candidates_for(heaviest_task(path, target), target, limit=1)[0]
        asm = compile_scheduled(cand.sch.mod, target).inspect_source("asm")
        fmas = [line for line in asm.splitlines() if "vfmadd" in line and f"%{register}" in line]
        assert len(fmas) >= 8, f"{isa}: {len(fmas)} vector FMAs"


@pytest.mark.parametrize("isa", ["avx2", "avx512"])
def test_a_pool_gets_streaming_candidates_that_compute_what_it_does(isa, tmp_path):
    """A task that tiles no block (a max pool) gets the design space that splits no reduction, its padding
    inlined: the space a one-slot search had missed (BENCHMARKS.md, session 18)."""
    from helpers import make_maxpool_onnx

    from dynatune.model.extract import extract_tasks
    from dynatune.model.importer import load_model

    target = x86_target(isa)
    model = load_model(make_maxpool_onnx(str(tmp_path / "pool.onnx"), 32, size=16, ceil_mode=1))
    pool = next(t for t in extract_tasks(model, target) if "pool" in t.name)
    assert "pad_temp" in pool.mod.script()
    cands = candidates_for(pool, target)
    assert cands
    for c in cands:
        trace = str(c.sch.trace)
        assert "RFactor" not in trace and "pad_temp" not in c.sch.mod.script()  # the padding inlined
    if {"avx2": "avx2", "avx512": "avx512f"}[isa] not in ISA:
        pytest.skip(f"this CPU cannot run {isa} code (compiled only)")
    args = random_args(pool.mod)
    want = run(pool.mod, target, [a.copy() for a in args])
    for c in cands:
        np.testing.assert_array_equal(run(c.sch.mod, target, [a.copy() for a in args]), want)


def test_a_gpu_target_has_no_vector_unit():
    import tvm

    from dynatune.machine.vector import vector_unit

    assert vector_unit(tvm.target.Target({"kind": "cuda", "arch": "sm_80"})) is None


@pytest.mark.slow  # tunes (real builds and measurements)
@pytest.mark.parametrize("analytic_first", [True, False])
def test_the_first_batch_measures_the_analytic_candidates_first(analytic_first, cpu_target, tmp_path):
    from dynatune.model.extract import extract_tasks
    from dynatune.model.importer import load_model
    from dynatune.search.measure import MeasureConfig
    from dynatune.search.session import SearchConfig, TuningSession

    tasks = extract_tasks(load_model(conv_onnx(tmp_path / "m.onnx")), cpu_target)
    search = SearchConfig(trials_per_iter=4, population_size=16, analytic_first=analytic_first)
    session = TuningSession(tasks, cpu_target, str(tmp_path / "work"), search=search, measure=MeasureConfig())
    try:
        res = session.tune(0, trials=4, batch=4)
        assert res.trials == 4 and res.build_errors == res.run_errors == 0
        counts = session.analytic_counts.get(tasks[0].key, 0)
        assert (counts >= 1) if analytic_first else (counts == 0)
        assert session.best_latency(0) < float("inf")
        session.tune(0, trials=4, batch=4)  # the next batch: the search's own candidates only
        assert session.analytic_counts.get(tasks[0].key, 0) == counts
    finally:
        session.close()


def test_benchmarks_time_the_analytic_candidates_the_session_measures(cpu_target, tmp_path):
    """``task_analytic_candidates`` (what ``bench.kernels`` times) gives the
    head of the session's first batch, candidate for candidate, as the session builds them (the layout
    rewrite applied)."""
    from tvm_ffi import structural_hash

    from dynatune.search.layout_rewrite import finish_candidates
    from dynatune.search.session import ANALYTIC_HEAD, TuningSession

    task = heaviest_task(conv_onnx(tmp_path / "m.onnx"), cpu_target)
    session = TuningSession([task], cpu_target, str(tmp_path / "work"))
    try:
        ctx = session._context(0)
        head = finish_candidates(session.first_candidates[0](ctx, 8), session._deferred[0])
    finally:
        session.close()
    bench = candidates_for(task, cpu_target, limit=ANALYTIC_HEAD)
    assert bench and [structural_hash(c.sch.mod) for c in bench] == [structural_hash(c.sch.mod) for c in head]


def test_the_schedule_library_keeps_the_isas_apart():
    from dynatune.machine.target import machine_fingerprint

    assert machine_fingerprint(x86_target("avx2")) != machine_fingerprint(x86_target("avx512"))
