"""Output channels padded to whole register blocks (``compile.pad_channels``) before a global pooling, or
sliced back inside the convolution's own kernel: the padded convolution is the task, its size follows the
target's vector unit, a convolution with whole vectors or too short a reduction keeps its channels, the
model's outputs do not change, and ONNX Runtime's op stays its anchor."""

import numpy as np
import pytest
from helpers import save_onnx

from dynatune.compiler.compile import build, verify
from dynatune.compiler.execution import relax_vm
from dynatune.machine.vector import VectorUnit
from dynatune.model.channel_padding import padded_channels
from dynatune.model.extract import Lowering, extract_tasks
from dynatune.model.importer import load_model

OFF = Lowering(pad_channels=False)


def classifier(path, rng) -> str:
    """Conv 3x3 8->16 + ReLU, then three heads on it: a 1x1 conv 16->20 + bias + ReLU + global average pool +
    flatten (padded, the slice after the pool); a 1x1 conv 16->20 + bias whose 4-D output a residual add
    reads (padded, the slice inside its kernel); and 1x1 convs 16->8 + ReLU (whole AVX2 vectors; under one
    AVX-512 vector) and 8->20 + bias, a 4-D output (a reduction of 8: padded for AVX2 only)."""
    from onnx import TensorProto, helper, numpy_helper

    def weights(name, cout, cin, k):
        w = (rng.standard_normal((cout, cin, k, k)) * np.sqrt(2.0 / (cin * k * k))).astype(np.float32)
        b = (rng.standard_normal(cout) * 0.1).astype(np.float32)
        return [numpy_helper.from_array(w, f"{name}_w"), numpy_helper.from_array(b, f"{name}_b")]

    nodes = [
        helper.make_node("Conv", ["x", "a_w", "a_b"], ["a_c"], pads=[1] * 4),
        helper.make_node("Relu", ["a_c"], ["a"]),
        helper.make_node("Conv", ["a", "head_w", "head_b"], ["head_c"]),
        helper.make_node("Relu", ["head_c"], ["head"]),
        helper.make_node("GlobalAveragePool", ["head"], ["pooled"]),
        helper.make_node("Flatten", ["pooled"], ["logits"]),
        helper.make_node("Conv", ["a", "side_w", "side_b"], ["side_c"]),
        helper.make_node("Add", ["side_c", "side_c_skip"], ["side"]),
        helper.make_node("Conv", ["a", "thin_w", "thin_b"], ["thin_c"]),
        helper.make_node("Relu", ["thin_c"], ["thin"]),
        helper.make_node("Conv", ["thin", "short_w", "short_b"], ["short"]),
    ]
    skip = (rng.standard_normal((1, 20, 12, 12)) * 0.1).astype(np.float32)
    graph = helper.make_graph(
        nodes,
        "classifier",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 8, 12, 12])],
        [
            helper.make_tensor_value_info("logits", TensorProto.FLOAT, [1, 20]),
            helper.make_tensor_value_info("side", TensorProto.FLOAT, [1, 20, 12, 12]),
            helper.make_tensor_value_info("short", TensorProto.FLOAT, [1, 20, 12, 12]),
        ],
        weights("a", 16, 8, 3)
        + weights("head", 20, 16, 1)
        + weights("side", 20, 16, 1)
        + weights("thin", 8, 16, 1)
        + weights("short", 20, 8, 1)
        + [numpy_helper.from_array(skip, "side_c_skip")],
    )
    return save_onnx(graph, path)


@pytest.fixture(scope="module")
def classifier_model(tmp_path_factory):
    path = str(tmp_path_factory.mktemp("padding") / "classifier.onnx")
    return load_model(classifier(path, np.random.default_rng(0)))


def x86(mcpu: str):
    import tvm

    return tvm.target.Target({"kind": "llvm", "mcpu": mcpu, "num-cores": 2})


def conv_channels(tasks) -> list[tuple[int, int]]:
    """Each 1x1 convolution task's (weight's output channels, output's channels), sorted; a task whose weight
    has more channels than its output slices them back inside its kernel."""
    found = []
    for task in tasks:
        if "conv2d" in task.name and task.flops < 200_000:  # not the 3x3 one (331k FLOPs)
            func = task.mod["main"]
            weight = func.params[int(func.attrs["layout_free_buffers"][0])]
            pair = (int(weight.ty.shape[0]), int(func.params[-1].ty.shape[-1]))
            assert (pair[0] != pair[1]) == ("strided_slice" in task.name) or "mean" in task.name, task.name
            found.append(pair)
    return sorted(found)


AVX512, AVX2 = VectorUnit("avx512", 16, 32), VectorUnit("avx2", 8, 16)


@pytest.mark.parametrize(
    "mcpu,lanes,padded",
    [
        # head (pooled), side (sliced in its kernel), short (reduction 8 < 16 lanes), thin (under a vector)
        ("skylake-avx512", 16, [(8, 8), (20, 20), (32, 20), (32, 32)]),
        ("haswell", 8, [(8, 8), (24, 20), (24, 20), (24, 24)]),
    ],
)
def test_convolutions_are_padded_for_the_targets_vectors_where_it_pays(classifier_model, mcpu, lanes, padded):
    target = x86(mcpu)
    assert Lowering().pads_channels(target).lanes == lanes
    assert f"pad_channels={lanes}x" in Lowering().describe(target)
    assert conv_channels(extract_tasks(classifier_model, target)) == padded
    assert conv_channels(extract_tasks(classifier_model, target, OFF)) == [
        (8, 8),
        (20, 20),
        (20, 20),
        (20, 20),
    ]
    assert OFF.pads_channels(target) is None


def test_padding_follows_the_register_blocks_the_target_allows():
    # 1008 channels on 13 x 13 are 63 AVX-512 vectors: only 13 rows x 1 vector (14 loads per 13 FMAs); 1024
    # allow 13 rows x 2 vectors. On AVX2, 1000 are 125 vectors, and 1008 allow two-vector blocks.
    assert padded_channels(1000, [1, 13, 13], AVX512) == 1024
    assert padded_channels(1008, [1, 13, 13], AVX512) == 1024
    assert padded_channels(1000, [1, 13, 13], AVX2) == 1008
    # whole blocks already: nothing to gain
    assert padded_channels(1280, [1, 7, 7], AVX512) == 1280
    assert padded_channels(1024, [1, 13, 13], AVX512) == 1024
    assert padded_channels(64, [1, 12, 12], AVX2) == 64
    # never more than one vector past the whole vectors
    for channels in range(16, 300, 7):
        for unit in (AVX512, AVX2):
            whole = -(-channels // unit.lanes) * unit.lanes
            assert padded_channels(channels, [1, 13, 13], unit) in (whole, whole + unit.lanes)


def test_gpu_and_nchw_targets_pad_nothing():
    import tvm

    assert Lowering().pads_channels(tvm.target.Target({"kind": "cuda", "arch": "sm_80"})) is None
    assert Lowering(conv_layout="NCHW").pads_channels(x86("skylake-avx512")) is None


def test_padded_model_matches_the_unpadded_one_and_onnxruntime(classifier_model, cpu_target):
    import tvm

    dev = tvm.cpu()
    padded = relax_vm(build(classifier_model, cpu_target, None), dev)
    plain = relax_vm(build(classifier_model, cpu_target, None, OFF), dev)
    check = verify(padded, classifier_model, dev, threads=2)
    assert check.ok and check.max_rel_err < 1e-5, check
    x = tvm.runtime.tensor(classifier_model.random_inputs(seed=1)["x"], dev)
    outputs = list(zip(padded["main"](x), plain["main"](x)))
    assert len(outputs) == 3
    for got, want in outputs:
        np.testing.assert_allclose(got.numpy(), want.numpy(), rtol=1e-6, atol=1e-7)


def test_the_padded_convolution_keeps_its_onnx_runtime_anchor(classifier_model, cpu_target, tmp_path):
    from dynatune.compiler.anchors import run_anchors

    tasks = extract_tasks(classifier_model, cpu_target)
    anchors = run_anchors(classifier_model, tasks, str(tmp_path), threads=1)
    assert {t.index for t in tasks if "conv2d" in t.name} <= set(anchors)


def test_onnx_runtimes_op_matches_a_task_padded_a_vector_past_its_whole_vectors():
    from dynatune.compiler.anchors import _padded_match, shape_key

    ort = shape_key((1000, 512, 1, 1), (1, 1000, 13, 13))  # ONNX Runtime's Conv, NCHW
    for padded in (1008, 1024):  # whole vectors, and one vector more
        task = shape_key((padded, 1, 1, 512), (1, 13, 13, padded))  # the padded task, OHWI and NHWC
        assert _padded_match(task[0], ort[0]) == padded - 1000
        assert _padded_match(task[1], ort[1]) == padded - 1000
    assert _padded_match(shape_key((1064, 512), ())[0], ort[0]) is None  # a different convolution
