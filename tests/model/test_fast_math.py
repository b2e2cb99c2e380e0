"""Fast math: the lowering rewrites exp/erf/tanh/sigmoid/softmax/GELU as vectorizable polynomials, so no
lowered function calls a scalar libm transcendental, and the model still matches ONNX Runtime to 1e-5."""

import math
import re

import numpy as np
import pytest

from dynatune.model.extract import Lowering, extract_tasks, fuse, task_key
from dynatune.model.importer import load_model

SCALAR = ("exp", "erf", "tanh", "sigmoid")  # TIR intrinsics LLVM turns into libm calls (sigmoid: exp)


def _save(tmp_path, name, nodes, inputs, outputs, inits=(), opset=17):
    import onnx
    from onnx import helper

    graph = helper.make_graph(nodes, name, inputs, outputs, list(inits))
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    model.ir_version = 8 if opset < 19 else 9
    path = str(tmp_path / f"{name}.onnx")
    onnx.save(model, path)
    return path


def _io(name, shape):
    from onnx import TensorProto, helper

    return helper.make_tensor_value_info(name, TensorProto.FLOAT, shape)


def _weight(rng, name, *shape, scale=1.0):
    from onnx import numpy_helper

    return numpy_helper.from_array((rng.standard_normal(shape) * scale).astype(np.float32), name)


def silu(tmp_path, rng):
    """EfficientNet's activation: Conv -> Sigmoid -> Mul."""
    from onnx import helper

    nodes = [
        helper.make_node("Conv", ["x", "w", "b"], ["c"], pads=[1, 1, 1, 1]),
        helper.make_node("Sigmoid", ["c"], ["s"]),
        helper.make_node("Mul", ["c", "s"], ["y"]),
    ]
    inits = [_weight(rng, "w", 16, 3, 3, 3, scale=1.5), _weight(rng, "b", 16)]
    return _save(tmp_path, "silu", nodes, [_io("x", [1, 3, 12, 12])], [_io("y", [1, 16, 12, 12])], inits)


def gelu_erf(tmp_path, rng):
    """BERT's GELU as exported: MatMul -> x * 0.5 * (1 + erf(x / sqrt(2)))."""
    from onnx import helper, numpy_helper

    nodes = [
        helper.make_node("MatMul", ["x", "w"], ["m"]),
        helper.make_node("Div", ["m", "sqrt2"], ["d"]),
        helper.make_node("Erf", ["d"], ["e"]),
        helper.make_node("Add", ["e", "one"], ["a"]),
        helper.make_node("Mul", ["m", "a"], ["p"]),
        helper.make_node("Mul", ["p", "half"], ["y"]),
    ]
    consts = {"sqrt2": math.sqrt(2.0), "one": 1.0, "half": 0.5}
    inits = [_weight(rng, "w", 32, 48, scale=0.6)]
    inits += [numpy_helper.from_array(np.array(v, np.float32), k) for k, v in consts.items()]
    return _save(tmp_path, "gelu_erf", nodes, [_io("x", [1, 16, 32])], [_io("y", [1, 16, 48])], inits)


def softmax(tmp_path, rng):
    """Attention's softmax over the last axis."""
    from onnx import helper

    nodes = [helper.make_node("Softmax", ["x"], ["y"], axis=-1)]
    return _save(tmp_path, "softmax", nodes, [_io("x", [2, 4, 16, 37])], [_io("y", [2, 4, 16, 37])])


def tanh(tmp_path, rng):
    from onnx import helper

    nodes = [helper.make_node("Tanh", ["x"], ["y"])]
    return _save(tmp_path, "tanh", nodes, [_io("x", [4, 300])], [_io("y", [4, 300])])


def gelu_op(tmp_path, rng):
    """The opset-20 Gelu operator (legalized by TVM straight to TIR, with erf inside)."""
    from onnx import helper

    nodes = [helper.make_node("Gelu", ["x"], ["y"])]
    return _save(tmp_path, "gelu_op", nodes, [_io("x", [4, 300])], [_io("y", [4, 300])], opset=20)


def log_softmax(tmp_path, rng):
    from onnx import helper

    nodes = [helper.make_node("LogSoftmax", ["x"], ["y"], axis=-1)]
    return _save(tmp_path, "log_softmax", nodes, [_io("x", [8, 100])], [_io("y", [8, 100])])


MODELS = {f.__name__: f for f in (silu, gelu_erf, softmax, tanh, gelu_op, log_softmax)}
INPUT_SCALE = {"silu": 3.0, "gelu_erf": 2.0, "softmax": 6.0, "tanh": 4.0, "gelu_op": 3.0, "log_softmax": 6.0}


def _model(name, tmp_path):
    return load_model(MODELS[name](tmp_path, np.random.default_rng(0)))


def _inputs(name, model, seed=0):
    rng = np.random.default_rng(seed)
    return {
        i.name: (rng.standard_normal(i.shape) * INPUT_SCALE[name]).astype(np.float32) for i in model.inputs
    }


def tir_calls(mod) -> set[str]:
    """The ``T.<name>(...)`` calls of every PrimFunc of ``mod`` (read from its TVMScript: TVM 0.27 has no
    Python TIR visitor)."""
    import tvm

    calls = set()
    for _, func in mod.functions_items():
        if isinstance(func, tvm.tirx.PrimFunc):
            calls |= set(re.findall(r"\bT\.(\w+)\(", func.script()))
    return calls


@pytest.mark.parametrize("name", sorted(MODELS))
def test_no_lowered_function_calls_a_scalar_transcendental(name, cpu_target, tmp_path):
    model = _model(name, tmp_path)
    slow = tir_calls(fuse(model.bound_module(), cpu_target, Lowering(fast_math=False)))
    assert slow & set(SCALAR), slow  # the model does exercise one of them
    fast = tir_calls(fuse(model.bound_module(), cpu_target))
    assert not fast & set(SCALAR), fast & set(SCALAR)


def test_the_fast_sigmoid_stays_fused_in_the_convolution_epilogue(cpu_target, tmp_path):
    import tvm

    fused = fuse(_model("silu", tmp_path).bound_module(), cpu_target)
    names = [gv.name_hint for gv, f in fused.functions_items() if isinstance(f, tvm.tirx.PrimFunc)]
    assert any("conv2d" in n and "fast_sigmoid" in n and "multiply" in n for n in names), names


def test_fast_math_is_part_of_the_lowering_and_of_the_keys(cpu_target, tmp_path):
    import tvm
    from tvm.s_tir.meta_schedule.tune_context import _normalize_mod

    assert Lowering().fast_math and Lowering().fast_maths(cpu_target)
    assert not Lowering(fast_math=False).fast_maths(cpu_target)
    assert not Lowering().fast_maths(tvm.target.Target("cuda"))  # GPUs have their own fast exp
    assert Lowering().describe(cpu_target) != Lowering(fast_math=False).describe(cpu_target)
    model = _model("silu", tmp_path)
    fast = extract_tasks(model, cpu_target)
    plain = extract_tasks(model, cpu_target, Lowering(fast_math=False))
    epilogue = {t.key for t in fast if "sigmoid" in t.name}
    assert epilogue and epilogue.isdisjoint(t.key for t in plain)
    fused = fuse(model.bound_module(), cpu_target)  # the compiler finds every task it was tuned with
    compiled = {
        task_key(_normalize_mod(f)) for f in fused.functions.values() if isinstance(f, tvm.tirx.PrimFunc)
    }
    assert {t.key for t in fast} <= compiled


def test_other_dtypes_are_left_alone(cpu_target):
    from tvm import relax
    from tvm_ffi import structural_equal

    from dynatune.model.fast_math import fast_math_pass

    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((4, 8), "float64"))
    with bb.function("main", [x]):
        with bb.dataflow():
            out = bb.emit_output(relax.op.exp(x))
        bb.emit_func_output(out)
    mod = bb.get()
    with cpu_target:
        assert structural_equal(fast_math_pass()(mod), mod)


def _libm_calls(executable) -> set[str]:
    """The libm transcendental functions the compiled CPU code calls (from its assembly)."""
    asm = "".join(m.inspect_source("s") for m in executable.mod.imports if m.kind == "llvm")
    return set(re.findall(r"call\w*\s+(expf|erff|tanhf|exp|erf|tanh)\b", asm))


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(MODELS))
def test_the_compiled_model_matches_onnxruntime_to_1e_5(name, cpu_target, tmp_path):
    """Untuned (default schedules), compiled with the fast functions: no libm call is left in the kernels
    and the outputs match ONNX Runtime's to 1e-5 (max |tvm - ort| / max |ort|, as the compiler checks)."""
    import tvm

    from dynatune.compiler.compile import build, compare
    from dynatune.compiler.execution import onnxruntime_outputs, relax_vm, run

    model = _model(name, tmp_path)
    executable = build(model, cpu_target)
    assert not _libm_calls(executable)
    vm = relax_vm(executable, tvm.cpu())
    for seed in (0, 1):
        inputs = _inputs(name, model, seed)
        outs = run(vm, model, inputs, tvm.cpu())
        _, ref = onnxruntime_outputs(model, inputs, 2)
        check = compare(outs, ref, rel_tol=1e-5)
        assert check.ok, (name, check)
