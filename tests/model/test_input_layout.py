"""The first convolution reads the model's NCHW input itself (``compile.read_input``): no transpose kernel
before it, its task reads the input's shape, its analytic candidates compute what it does, and the model's
outputs match ONNX Runtime's and the build with the transpose, for strides, paddings and dilations."""

import numpy as np
import pytest
from helpers import save_onnx

from dynatune.compiler.compile import build, verify
from dynatune.compiler.execution import relax_vm
from dynatune.model.extract import Lowering, extract_tasks, fuse
from dynatune.model.importer import load_model

OFF = Lowering(read_input=False)


def first_layers(path, rng, strides=(2, 2), pads=(1, 1, 1, 1), dilations=(1, 1), group=1) -> str:
    """Conv 3x3 3->16 on the input (the given strides, pads, dilations and groups) + ReLU, then a 1x1 conv
    16->8 + ReLU."""
    from onnx import TensorProto, helper, numpy_helper

    cin = 3 if group == 1 else 4
    w0 = (rng.standard_normal((16, cin // group, 3, 3)) * 0.3).astype(np.float32)
    w1 = (rng.standard_normal((8, 16, 1, 1)) * 0.3).astype(np.float32)
    b0 = (rng.standard_normal(16) * 0.1).astype(np.float32)
    b1 = (rng.standard_normal(8) * 0.1).astype(np.float32)
    conv = dict(strides=list(strides), pads=list(pads), dilations=list(dilations), group=group)
    nodes = [
        helper.make_node("Conv", ["x", "w0", "b0"], ["c0"], **conv),
        helper.make_node("Relu", ["c0"], ["a0"]),
        helper.make_node("Conv", ["a0", "w1", "b1"], ["c1"]),
        helper.make_node("Relu", ["c1"], ["y"]),
    ]
    graph = helper.make_graph(
        nodes,
        "first_layers",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, cin, 17, 15])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
        [numpy_helper.from_array(a, n) for a, n in ((w0, "w0"), (b0, "b0"), (w1, "w1"), (b1, "b1"))],
    )
    return save_onnx(graph, path)


@pytest.fixture(scope="module")
def first_layers_model(tmp_path_factory):
    path = str(tmp_path_factory.mktemp("input") / "first_layers.onnx")
    return load_model(first_layers(path, np.random.default_rng(0)))


def _kernels(fused) -> list[tuple[str, bool]]:
    """(callee, whether it reads the model's input) for every kernel ``main`` calls, in order."""
    from tvm import relax

    x = fused["main"].params[0]
    return [
        (b.value.args[0].name_hint, any(a.same_as(x) for a in b.value.args[1].fields))
        for block in fused["main"].body.blocks
        for b in block.bindings
        if isinstance(b.value, relax.Call) and getattr(b.value.op, "name", "") == "relax.call_tir"
    ]


def test_the_first_convolution_reads_the_input_and_no_transpose_runs_before_it(
    first_layers_model, cpu_target
):
    kernels = _kernels(fuse(first_layers_model.bound_module(), cpu_target))
    # the two convolutions, then the output's transpose back to NCHW
    assert [reads for _, reads in kernels] == [True, False, False], kernels
    assert "conv2d" in kernels[0][0] and "conv2d" in kernels[1][0] and "transpose" in kernels[2][0], kernels
    first = extract_tasks(first_layers_model, cpu_target)[0]
    assert "conv2d" in first.name
    assert [int(d) for d in first.mod["main"].params[0].ty.shape] == [1, 3, 17, 15]  # NCHW, as it lies
    assert "read_input=True" in Lowering().describe(cpu_target)
    # without it: a transpose kernel reads the input, and is a task of its own
    without = _kernels(fuse(first_layers_model.bound_module(), cpu_target, OFF))
    assert [name for name, reads in without if reads] == [without[0][0]] and "transpose" in without[0][0]
    assert len([t for t in extract_tasks(first_layers_model, cpu_target, OFF) if "transpose" in t.name]) == 2


@pytest.mark.parametrize(
    "conv",
    [
        {"strides": (1, 1), "pads": (0, 0, 0, 0)},
        {"strides": (2, 1), "pads": (0, 1, 2, 1)},
        {"strides": (1, 2), "pads": (2, 2, 2, 2), "dilations": (2, 2)},
        {"group": 2},  # not rewritten: the transpose stays, and the outputs are right
    ],
)
def test_outputs_match_onnxruntime_and_the_build_with_the_transpose(conv, cpu_target, tmp_path):
    import tvm

    model = load_model(first_layers(str(tmp_path / "m.onnx"), np.random.default_rng(1), **conv))
    dev = tvm.cpu()
    reading = relax_vm(build(model, cpu_target, None), dev)
    check = verify(reading, model, dev, threads=2)
    assert check.ok and check.max_rel_err < 1e-5, check
    plain = relax_vm(build(model, cpu_target, None, OFF), dev)
    x = tvm.runtime.tensor(model.random_inputs(seed=2)["x"], dev)
    np.testing.assert_allclose(reading["main"](x).numpy(), plain["main"](x).numpy(), rtol=1e-5, atol=1e-6)
    on_input = [name for name, reads in _kernels(fuse(model.bound_module(), cpu_target)) if reads]
    assert len(on_input) == 1 and ("transpose" in on_input[0]) == bool(conv.get("group")), on_input


@pytest.mark.parametrize("isa", ["avx2", "avx512"])
def test_analytic_candidates_of_the_convolution_reading_the_input_compute_what_it_does(
    first_layers_model, isa
):
    from search.test_analytic import check_candidates_compute, x86_target

    target = x86_target(isa)
    check_candidates_compute(extract_tasks(first_layers_model, target)[0], target, isa)


def test_gpu_and_nchw_targets_keep_the_transpose_rule_off():
    import tvm

    assert not Lowering().reads_input(tvm.target.Target({"kind": "cuda", "arch": "sm_80"}))
    assert not Lowering(conv_layout="NCHW").reads_input(tvm.target.Target("llvm"))
    assert Lowering().reads_input(tvm.target.Target("llvm"))


def test_the_convolution_reading_the_input_keeps_its_onnx_runtime_anchor(
    first_layers_model, cpu_target, tmp_path
):
    from dynatune.compiler.anchors import run_anchors

    tasks = extract_tasks(first_layers_model, cpu_target)
    anchors = run_anchors(first_layers_model, tasks, str(tmp_path), threads=1)
    assert {t.index for t in tasks if "conv2d" in t.name} <= set(anchors)
