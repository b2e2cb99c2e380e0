"""No layout glue between two layers of a CNN: on CPU targets the activations, residual adds, pooling,
concat and squeeze-excite after an NHWC convolution stay in NHWC, so the element-wise ones fuse into the
convolution's epilogue and no transpose is left but on the model's inputs and outputs.

TVM 0.27's ConvertLayout has no layout rule for ``relax.clip`` (HardSwish, HardSigmoid),
``relax.nn.leakyrelu``, ``relax.nn.pad``, ``relax.where`` and binary operators between tensors of
different ranks, fails on ``sum(stack(...))`` (ONNX Sum), and cannot see into the ``call_tir`` the ONNX
importer emits for ``Clip`` and ``Pad``: the lowering rewrites them first (``dynatune.model.layout``).
"""

import numpy as np
import pytest

from dynatune.model.extract import Lowering, extract_tasks, fuse, task_key
from dynatune.model.importer import load_model

C = 8  # channels after the first convolution
X = [1, 4, 10, 10]


def _save(tmp_path, name, body, out_shape=None, opset=17, seed=0):
    """An ONNX model ``x`` [1, 4, 10, 10] -> ``body`` -> ``y``; ``body(conv, const)`` returns the nodes,
    ``conv(input, output, cin, cout, k, **attrs)`` adds a convolution with random weights and ``const(name,
    value)`` a constant."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(seed)
    inits = []

    def const(name, value, dtype=np.float32):
        inits.append(numpy_helper.from_array(np.asarray(value, dtype), name))
        return name

    def conv(x, y, cin=C, cout=C, k=3, **attrs):
        w = const(f"{y}_w", rng.standard_normal((cout, cin // attrs.get("group", 1), k, k)) * 0.4)
        b = const(f"{y}_b", rng.standard_normal(cout) * 0.5)
        attrs.setdefault("pads", [k // 2] * 4)
        return helper.make_node("Conv", [x, w, b], [y], **attrs)

    nodes = body(conv, const)
    graph = helper.make_graph(
        nodes,
        name,
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, X)],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, out_shape or [1, C, 10, 10])],
        inits,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    model.ir_version = 8
    onnx.checker.check_model(model)
    path = str(tmp_path / f"{name}.onnx")
    onnx.save(model, path)
    return path


def _node(op, inputs, outputs, **attrs):
    from onnx import helper

    return helper.make_node(op, inputs, outputs, **attrs)


def _first(conv):
    return conv("x", "c1", cin=X[1])


# name -> (body, what the first convolution's fused function is named with, opset, output shape)
MODELS = {
    "clip": (  # ReLU6 as exported since opset 11: Clip with min and max inputs
        lambda conv, const: [
            _first(conv),
            _node("Clip", ["c1", const("lo", 0.0), const("hi", 6.0)], ["r"]),
            conv("r", "y"),
        ],
        "maximum_minimum",
        17,
    ),
    "clip_opset6": (  # MobileNet-V2 from the model zoo (opset 7): min and max attributes
        lambda conv, const: [_first(conv), _node("Clip", ["c1"], ["r"], min=0.0, max=6.0), conv("r", "y")],
        "maximum_minimum",
        6,
    ),
    "hardswish": (
        lambda conv, const: [_first(conv), _node("HardSwish", ["c1"], ["r"]), conv("r", "y")],
        "minimum_maximum_divide_multiply",
        14,
    ),
    "hardswish_decomposed": (  # x * clip(x + 3, 0, 6) / 6
        lambda conv, const: [
            _first(conv),
            _node("Add", ["c1", const("three", 3.0)], ["a"]),
            _node("Clip", ["a", const("lo", 0.0), const("hi", 6.0)], ["cl"]),
            _node("Mul", ["c1", "cl"], ["m"]),
            _node("Div", ["m", const("six", 6.0)], ["r"]),
            conv("r", "y"),
        ],
        "maximum_minimum_multiply_divide",
        17,
    ),
    "hardsigmoid": (
        lambda conv, const: [_first(conv), _node("HardSigmoid", ["c1"], ["r"]), conv("r", "y")],
        "minimum_maximum",
        17,
    ),
    "silu": (
        lambda conv, const: [
            _first(conv),
            _node("Sigmoid", ["c1"], ["s"]),
            _node("Mul", ["c1", "s"], ["r"]),
            conv("r", "y"),
        ],
        "sigmoid_multiply",
        17,
    ),
    "leakyrelu": (
        lambda conv, const: [_first(conv), _node("LeakyRelu", ["c1"], ["r"], alpha=0.1), conv("r", "y")],
        "multiply_maximum",
        17,
    ),
    "batchnorm_clip": (  # a batch norm not folded into the convolution, then ReLU6
        lambda conv, const: [
            _first(conv),
            _node(
                "BatchNormalization",
                ["c1", const("g", np.linspace(0.5, 2, C)), const("be", np.linspace(-1, 1, C))]
                + [const("mu", np.linspace(-0.3, 0.3, C)), const("var", np.linspace(0.5, 1.5, C))],
                ["bn"],
            ),
            _node("Clip", ["bn", const("lo", 0.0), const("hi", 6.0)], ["r"]),
            conv("r", "y"),
        ],
        "multiply_add_maximum_minimum",
        17,
    ),
    "residual": (
        lambda conv, const: [
            _first(conv),
            _node("Relu", ["c1"], ["r"]),
            conv("r", "c2"),
            _node("Add", ["c2", "r"], ["a"]),
            _node("Relu", ["a"], ["y"]),
        ],
        "relu",
        17,
    ),
    "pad_depthwise": (  # as TensorFlow exports a stride-2 depthwise convolution: an explicit Pad first
        lambda conv, const: [
            _first(conv),
            _node("Clip", ["c1", const("lo", 0.0), const("hi", 6.0)], ["r"]),
            _node("Pad", ["r", const("pads", [0, 0, 0, 0, 0, 0, 1, 1], np.int64)], ["p"]),
            conv("p", "d", k=3, group=C, strides=[2, 2], pads=[0, 0, 0, 0]),
            _node("Clip", ["d", "lo", "hi"], ["y"]),
        ],
        "maximum_minimum",
        17,
        [1, C, 5, 5],
    ),
    "sum_residual": (  # a residual add as older exporters write it: Sum, imported as sum(stack(...))
        lambda conv, const: [
            _first(conv),
            _node("Relu", ["c1"], ["r"]),
            conv("r", "c2"),
            _node("Sum", ["c2", "r"], ["a"]),
            _node("Relu", ["a"], ["y"]),
        ],
        "add_add1_relu",
        9,
    ),
    "unsqueezed_scale": (  # Caffe2's BN scale: Mul and Add by [C] vectors unsqueezed to [C, 1, 1]
        lambda conv, const: [
            _first(conv),
            _node("Unsqueeze", [const("scale", np.linspace(0.5, 2, C))], ["su"], axes=[1, 2]),
            _node("Mul", ["c1", "su"], ["m"]),
            _node("Unsqueeze", [const("shift", np.linspace(-1, 1, C))], ["bu"], axes=[1, 2]),
            _node("Add", ["m", "bu"], ["a"]),
            _node("Relu", ["a"], ["r"]),
            conv("r", "y"),
        ],
        "multiply_add_relu",
        9,
    ),
    "dropout": (  # SqueezeNet's: dropped at inference, it leaves an alias ConvertLayout must not see
        lambda conv, const: [
            _first(conv),
            _node("Relu", ["c1"], ["r"]),
            _node("Dropout", ["r"], ["d"], ratio=0.5),
            conv("d", "y"),
        ],
        "relu",
        9,
    ),
    "inverted_residual": (  # MobileNet-V2's block: expand 1x1, ReLU6, depthwise 3x3, ReLU6, project 1x1, add
        lambda conv, const: [
            _first(conv),
            conv("c1", "e", cout=4 * C, k=1),
            _node("Clip", ["e", const("lo", 0.0), const("hi", 6.0)], ["er"]),
            conv("er", "d", cin=4 * C, cout=4 * C, k=3, group=4 * C),
            _node("Clip", ["d", "lo", "hi"], ["dr"]),
            conv("dr", "p", cin=4 * C, k=1),
            _node("Add", ["p", "c1"], ["y"]),
        ],
        "maximum_minimum",
        17,
    ),
    "residual_from_the_input": (  # MobileNet-V2 as torchvision exports it: x + block(x), from the input
        lambda conv, const: [
            conv("x", "e", cin=4, cout=4 * C, k=1),
            _node("Clip", ["e", const("lo", 0.0), const("hi", 6.0)], ["er"]),
            conv("er", "p", cin=4 * C, cout=4, k=1),
            _node("Add", ["x", "p"], ["a"]),
            conv("a", "e2", cin=4, cout=4 * C, k=1),
            _node("Clip", ["e2", "lo", "hi"], ["er2"]),
            conv("er2", "p2", cin=4 * C, cout=4, k=1),
            _node("Add", ["a", "p2"], ["y"]),
        ],
        "add",
        17,
        X,
    ),
    "maxpool": (
        lambda conv, const: [
            _first(conv),
            _node("Relu", ["c1"], ["r"]),
            _node("MaxPool", ["r"], ["p"], kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1]),
            conv("p", "y"),
        ],
        "relu",
        17,
        [1, C, 5, 5],
    ),
    "avgpool": (
        lambda conv, const: [
            _first(conv),
            _node("Relu", ["c1"], ["r"]),
            _node("AveragePool", ["r"], ["p"], kernel_shape=[2, 2], strides=[2, 2]),
            conv("p", "y"),
        ],
        "relu",
        17,
        [1, C, 5, 5],
    ),
    "concat": (  # an Inception-style branch join
        lambda conv, const: [
            _first(conv),
            _node("Relu", ["c1"], ["r"]),
            conv("r", "b1", k=1),
            conv("r", "b2", k=3),
            _node("Concat", ["b1", "b2"], ["cc"], axis=1),
            conv("cc", "y", cin=2 * C, k=1),
        ],
        "relu",
        17,
    ),
    "squeeze_excite": (  # GlobalAveragePool -> Conv -> ReLU -> Conv -> Sigmoid -> Mul with the feature map
        lambda conv, const: [
            _first(conv),
            _node("Clip", ["c1", const("lo", 0.0), const("hi", 6.0)], ["r"]),
            _node("GlobalAveragePool", ["r"], ["g"]),
            conv("g", "s1", cout=C // 2, k=1),
            _node("Relu", ["s1"], ["s2"]),
            conv("s2", "s3", cin=C // 2, k=1),
            _node("Sigmoid", ["s3"], ["s4"]),
            _node("Mul", ["r", "s4"], ["m"]),
            conv("m", "y"),
        ],
        "maximum_minimum",
        17,
    ),
}
# kernels that are neither a convolution nor glue
OTHER_KERNELS = {"maxpool": "max_pool2d", "avgpool": "avg_pool2d", "squeeze_excite": "mean"}


def _model(name, tmp_path):
    body, _, opset, *shape = MODELS[name]
    return load_model(_save(tmp_path, name, body, shape[0] if shape else None, opset))


def _calls(fused):
    """(callee name, whether it is on the model's input or output) for every call_tir in ``main``."""
    from tvm import relax

    main = fused["main"]
    params = list(main.params)
    calls = []
    for block in main.body.blocks:
        for binding in block.bindings:
            value = binding.value
            if not (isinstance(value, relax.Call) and getattr(value.op, "name", "") == "relax.call_tir"):
                continue
            args = list(value.args[1].fields)
            edge = any(a.same_as(p) for a in args for p in params) or not isinstance(
                binding.var, relax.DataflowVar
            )
            calls.append((value.args[0].name_hint, edge))
    return calls


def _glue(fused):
    """The layout-changing kernels called in ``main`` that are neither on its inputs nor on its outputs."""
    return [
        name
        for name, edge in _calls(fused)
        if not edge and ("transpose" in name or "layout_transform" in name)
    ]


@pytest.mark.parametrize("name", sorted(MODELS))
def test_no_transpose_between_layers_and_the_activation_fuses_into_the_convolution(
    name, cpu_target, tmp_path
):
    fused = fuse(_model(name, tmp_path).bound_module(), cpu_target)
    assert "conv2d_nhwc" in fused.script()
    assert _glue(fused) == []
    kernels = [callee for callee, edge in _calls(fused) if not edge]
    # every kernel between the model's input and output is a convolution with its epilogue fused in (or a
    # pool, concat or mean): no activation, batch norm or pad runs as a kernel of its own
    others = [k for k in kernels if "conv2d" not in k and "concatenate" not in k]
    assert all(OTHER_KERNELS.get(name, "-") in k for k in others), kernels
    convs = [callee for callee, _ in _calls(fused) if "conv2d" in callee]
    assert any(MODELS[name][1] in c for c in convs), convs


def test_an_input_read_by_two_layers_is_converted_once(cpu_target, tmp_path):
    """``x + block(x)``: the convolution and the residual add both read the input in NHWC; ConvertLayout
    writes one transpose per reader, and the lowering keeps one. With ``read_input`` (the default) the
    convolution reads the input itself, and the add reads the one transpose."""
    from tvm import relax

    bound = _model("residual_from_the_input", tmp_path).bound_module()

    def on_input(fused) -> list[str]:
        x = fused["main"].params[0]
        return sorted(
            b.value.args[0].name_hint
            for block in fused["main"].body.blocks
            for b in block.bindings
            if isinstance(b.value, relax.Call)
            and getattr(b.value.op, "name", "") == "relax.call_tir"
            and any(a.same_as(x) for a in b.value.args[1].fields)
        )

    without = on_input(fuse(bound, cpu_target, Lowering(read_input=False)))
    assert len(without) == 1 and "transpose" in without[0], without
    reading = on_input(fuse(bound, cpu_target))
    assert len(reading) == 2 and "conv2d" in reading[0] and "transpose" in reading[1], reading


WITHOUT_THE_REWRITE = ["clip", "clip_opset6", "hardswish", "leakyrelu", "pad_depthwise", "unsqueezed_scale"]
WITHOUT_THE_REWRITE += ["residual_from_the_input"]


@pytest.mark.parametrize("name", WITHOUT_THE_REWRITE + ["sum_residual"])
def test_without_the_rewrite_the_same_models_have_glue(name, cpu_target, tmp_path, monkeypatch):
    """What the rewrite fixes (so the test above does test it): TVM's ConvertLayout alone leaves these ops
    in NCHW, between two transposes, or (a Sum) fails, and the whole model stays NCHW."""
    import tvm

    from dynatune.model import layout

    monkeypatch.setattr(
        layout, "_layout_carrying_ops", lambda: tvm.transform.module_pass(lambda m, _c: m, opt_level=0)
    )
    fused = fuse(_model(name, tmp_path).bound_module(), cpu_target)
    assert _glue(fused) or "conv2d_nhwc" not in fused.script()


def test_a_pad_that_is_not_zero_or_feeds_no_convolution_is_left_alone(cpu_target, tmp_path):
    """A Pad with a value, or before a pool, cannot become a convolution's padding: it keeps its kernel (and
    its transposes: ConvertLayout has no rule for pad)."""

    def body(conv, const):
        return [
            _first(conv),
            _node("Pad", ["c1", const("pads", [0, 0, 0, 0, 0, 0, 1, 1], np.int64), const("v", 1.5)], ["p"]),
            conv("p", "d", pads=[0, 0, 0, 0], strides=[2, 2]),
            _node("Pad", ["d", const("pads2", [0, 0, 1, 1, 0, 0, 1, 1], np.int64)], ["q"]),
            _node("MaxPool", ["q"], ["y"], kernel_shape=[2, 2], strides=[2, 2]),
        ]

    model = load_model(_save(tmp_path, "pads", body, [1, C, 3, 3]))
    fused = fuse(model.bound_module(), cpu_target)
    assert sum("pad" in callee for callee, _ in _calls(fused)) == 2


def _elementwise(tmp_path, name, op, inputs=(), opset=17, **attrs):
    """x -> ``op`` -> y, on a [2, 3, 4, 9] input."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    inits = [numpy_helper.from_array(np.asarray(v, np.float32), k) for k, v in inputs]
    nodes = [helper.make_node(op, ["x"] + [k for k, _ in inputs], ["y"], **attrs)]
    shape = [2, 3, 4, 9]
    graph = helper.make_graph(
        nodes,
        name,
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, shape)],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, shape)],
        inits,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    model.ir_version = 8
    path = str(tmp_path / f"{name}.onnx")
    onnx.save(model, path)
    return load_model(path)


ELEMENTWISE = {
    "clip": ("Clip", [("lo", 0.0), ("hi", 6.0)], 17, {}),
    "clip_min_only": ("Clip", [("lo", -1.0)], 17, {}),
    "clip_opset6": ("Clip", [], 6, {"min": -0.5, "max": 2.0}),
    "hardswish": ("HardSwish", [], 14, {}),
    "hardsigmoid": ("HardSigmoid", [], 17, {"alpha": 0.3, "beta": 0.4}),
    "leakyrelu": ("LeakyRelu", [], 17, {"alpha": 0.1}),
    "leakyrelu_steep": ("LeakyRelu", [], 17, {"alpha": 3.0}),
    "sum": ("Sum", [("a", np.linspace(-2, 2, 9)), ("b", np.linspace(3, -3, 36).reshape(4, 9))], 9, {}),
    "channel_scale": ("Mul", [("s", np.array([0.5, -2.0, 3.0]).reshape(3, 1, 1))], 17, {}),
}


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(ELEMENTWISE))
def test_the_rewritten_ops_compute_the_same_floats(name, tmp_path):
    """The rewrite alone (no layout change), compiled with TVM's default pipeline: bit for bit the original's
    outputs, on values around the bounds, signed zeros, infinities and NaN."""
    import tvm
    from tvm import relax
    from tvm_ffi import structural_equal

    from dynatune.model.layout import _layout_carrying_ops

    op, inputs, opset, attrs = ELEMENTWISE[name]
    model = _elementwise(tmp_path, name, op, inputs, opset, **attrs)
    mod = model.bound_module()
    rewritten = relax.transform.DeadCodeElimination()(_layout_carrying_ops()(mod))
    assert not structural_equal(rewritten, mod)
    assert not any(op in rewritten["main"].script() for op in ("call_tir", "R.clip", "leakyrelu", "R.stack"))
    special = [0.0, -0.0, 6.0, -3.0, 3.0, -1.0, 2.0, np.inf, -np.inf, np.nan, 1e-30, -1e-30]
    rng = np.random.default_rng(0)
    x = np.concatenate([special, rng.standard_normal(2 * 3 * 4 * 9 - len(special)) * 5]).astype(np.float32)
    x = x.reshape(2, 3, 4, 9)
    outs = []
    for m in (mod, rewritten):
        vm = relax.VirtualMachine(relax.build(m, target="llvm"), tvm.cpu())
        outs.append(vm["main"](tvm.runtime.tensor(x)).numpy())
    np.testing.assert_array_equal(outs[0].view(np.uint32), outs[1].view(np.uint32))


COMPILED = ["clip", "clip_opset6", "hardswish", "hardswish_decomposed", "leakyrelu", "batchnorm_clip"]
COMPILED += ["pad_depthwise", "squeeze_excite", "sum_residual", "unsqueezed_scale", "dropout"]
COMPILED += ["inverted_residual", "residual_from_the_input"]


@pytest.mark.slow
@pytest.mark.parametrize("name", COMPILED)
def test_the_compiled_model_matches_onnxruntime(name, cpu_target, tmp_path):
    """Untuned (default schedules), NHWC with the rewrites: ONNX Runtime's outputs to 1e-5, with inputs
    that drive the activations through both bounds."""
    import tvm

    from dynatune.compiler.compile import build, compare
    from dynatune.compiler.execution import onnxruntime_outputs, relax_vm, run

    model = _model(name, tmp_path)
    vm = relax_vm(build(model, cpu_target), tvm.cpu())
    for seed in (0, 1):
        x = np.random.default_rng(seed).standard_normal(X).astype(np.float32) * 3
        outs = run(vm, model, {"x": x}, tvm.cpu())
        _, ref = onnxruntime_outputs(model, {"x": x}, 2)
        check = compare(outs, ref, rel_tol=1e-5)
        assert check.ok, (name, check)


def test_extraction_keys_match_the_compiled_functions(cpu_target, tmp_path):
    """The rewrite is part of the shared lowering: the extracted tasks are the compiled functions."""
    import tvm
    from tvm.s_tir.meta_schedule.tune_context import _normalize_mod

    model = _model("squeeze_excite", tmp_path)
    fused = fuse(model.bound_module(), cpu_target)
    compiled = {
        task_key(_normalize_mod(f)) for f in fused.functions.values() if isinstance(f, tvm.tirx.PrimFunc)
    }
    tasks = extract_tasks(model, cpu_target)
    assert {t.key for t in tasks} <= compiled
    assert any("maximum_minimum" in t.name and "conv2d" in t.name for t in tasks)


@pytest.mark.slow
@pytest.mark.parametrize("name", ["resnet50", "squeezenet"])
def test_real_topologies_have_no_glue_but_before_the_classifier(name, cpu_target, tmp_path):
    """ResNet-50 (its residual adds are ONNX Sums, which made TVM's ConvertLayout fail: the whole model
    stayed NCHW) and SqueezeNet (its Dropout): the only transpose left between the input and the output is
    the one before the classifier's Flatten, which needs NCHW's order. (Inception-v2's batch norm scales, Mul
    and Add by unsqueezed vectors, are the small ``unsqueezed_scale`` model: importing Inception-v2 takes 30
    s.)"""
    from helpers import randomized_light_model

    model = load_model(randomized_light_model(name, str(tmp_path / f"{name}.onnx")))
    fused = fuse(model.bound_module(), cpu_target)
    assert "conv2d_nhwc" in fused.script()
    glue = _glue(fused)
    assert len(glue) == 1 and "reshape" in glue[0], glue
