"""Storages that stay (``model.resident_storage``): the storages only kernels read are constants of the
executable, so a run allocates only what it returns. Each storage its own tensor, the outputs still the
caller's, and two loads of one library run at once in two threads."""

import threading

import numpy as np
import pytest
from helpers import function_text, repeated_blocks_onnx, run_in_plain_tvm, vm_calls

from dynatune.compiler.compile import build, export, verify
from dynatune.compiler.execution import relax_vm
from dynatune.model.extract import Lowering
from dynatune.model.importer import load_model


@pytest.fixture(scope="module")
def repeated(tmp_path_factory, cpu_target):
    model = load_model(repeated_blocks_onnx(str(tmp_path_factory.mktemp("resident") / "repeated.onnx")))
    return model, build(model, cpu_target)


def test_a_run_allocates_only_its_output(repeated):
    _model, executable = repeated
    calls = vm_calls(executable.as_text())
    assert calls["vm.builtin.alloc_storage"] == calls["vm.builtin.alloc_tensor"] == 1  # the (1, 10) output


def test_each_storage_is_a_tensor_of_its_own(repeated):
    """The repeated 1x1 kernel alternates between two storages of one size: two constants, never one (the
    VM's code generator makes equal constants one)."""
    import re

    model, executable = repeated
    text = function_text(executable.as_text())
    kernel = next(
        name for name, n in vm_calls(executable.as_text()).items() if n == 4 and not name.startswith("vm.")
    )
    sites = re.findall(rf"call  {kernel} in: (c\[\d+\]), c\[\d+\], c\[\d+\], (c\[\d+\])", text)
    assert len(sites) == 4 and len({s for pair in sites for s in pair}) == 2, sites
    assert all(src != dst for src, dst in sites)


def test_the_model_computes_what_onnx_runtime_does_run_after_run(repeated):
    import tvm

    model, executable = repeated
    vm = relax_vm(executable, tvm.cpu())
    check = verify(vm, model, tvm.cpu(), threads=2, seeds=[0, 1, 2, 0])
    assert check.ok and check.max_rel_err < 1e-4, check


def test_an_output_held_is_not_written_by_the_next_run(repeated):
    import tvm

    model, executable = repeated
    vm = relax_vm(executable, tvm.cpu())
    name = model.inputs[0].name
    first = vm["main"](tvm.runtime.tensor(model.random_inputs(0)[name]))
    kept = first.numpy().copy()
    vm["main"](tvm.runtime.tensor(model.random_inputs(1)[name]))
    np.testing.assert_array_equal(first.numpy(), kept)


def test_two_loads_of_the_library_run_at_once_in_two_threads(tmp_path, cpu_target):
    """What the README tells a plain-TVM user: one loaded module per thread that runs the model at once.
    (Two VMs of one loaded module share the storages: on this model and loop, such a pair computed wrong
    within 2000 runs.)"""
    import tvm
    from tvm import relax

    from dynatune.compiler.execution import onnxruntime_outputs

    model = load_model(repeated_blocks_onnx(str(tmp_path / "wide.onnx"), channels=64))
    path = export(build(model, cpu_target), str(tmp_path / "model.so"))
    name = model.inputs[0].name
    inputs = [model.random_inputs(seed)[name] for seed in (0, 1)]
    expected = [onnxruntime_outputs(model, {name: x}, 1)[1][0] for x in inputs]
    errors = []

    def run(x, want):
        vm = relax.VirtualMachine(tvm.runtime.load_module(path), tvm.cpu())
        for _ in range(2000):
            got = vm["main"](tvm.runtime.tensor(x)).numpy()
            if not np.allclose(got, want, rtol=1e-4, atol=1e-5):
                errors.append(float(np.max(np.abs(got - want))))
                return

    threads = [threading.Thread(target=run, args=pair) for pair in zip(inputs, expected)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors


def test_the_artifact_runs_in_plain_tvm(repeated, tmp_path):
    model, executable = repeated
    check = run_in_plain_tvm(model, export(executable, str(tmp_path / "model.so")), tmp_path)
    assert check.ok and check.max_rel_err < 1e-4


def test_without_it_each_storage_comes_from_the_pool(repeated, cpu_target):
    model, _ = repeated
    pooled = build(model, cpu_target, lowering=Lowering(resident_storage=False))
    calls = vm_calls(pooled.as_text())
    assert calls["vm.builtin.alloc_storage"] == calls["vm.builtin.alloc_tensor"] == 5
    assert Lowering(resident_storage=False).describe(cpu_target) == Lowering().describe(cpu_target)


def _planned_main(weight=None, returns_view=False, dtype="float32"):
    """A hand-planned ``main``: a kernel writes a storage's flat tensor, another reads it and writes the
    output; ``weight``: a constant the second kernel also reads; ``returns_view``: the flat tensor is
    returned too."""
    from tvm import relax, te

    a = te.placeholder((4,), dtype, "a")
    copy = te.create_prim_func([a, te.compute((4,), lambda i: a[i], "b")])
    size = np.dtype(dtype).itemsize
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType([4], dtype))
    kernel = bb.add_func(copy, "copy")
    with bb.function("main", [x], pure=False):
        storage = bb.emit(relax.op.memory.alloc_storage(relax.ShapeExpr([4 * size]), 0, "global", dtype))
        flat = bb.emit(relax.op.memory.alloc_tensor(storage, 0, relax.ShapeExpr([4]), dtype))
        out_storage = bb.emit(relax.op.memory.alloc_storage(relax.ShapeExpr([4 * size]), 0, "global", dtype))
        out = bb.emit(relax.op.memory.alloc_tensor(out_storage, 0, relax.ShapeExpr([4]), dtype))
        bb.emit(relax.Call(kernel, [x, flat]))
        bb.emit(relax.Call(kernel, [flat, out]))
        if weight is not None:
            bb.emit(relax.Call(kernel, [relax.const(weight), out]))
        bb.emit_func_output(relax.Tuple([out, flat]) if returns_view else out)
    return bb.get()


def _resident_count(mod) -> int:
    from dynatune.model.resident_storage import keep_storages_resident_pass

    return 2 - keep_storages_resident_pass()(mod)["main"].script().count("R.memory.alloc_storage")


def test_only_storages_nothing_but_kernels_read_stay():
    from dynatune.model.resident_storage import _numbered

    assert _resident_count(_planned_main()) == 1  # the output's storage is returned: pooled
    assert _resident_count(_planned_main(returns_view=True)) == 0  # the caller would hold it
    # a weight with the bytes the storage's constant would have: the two would be made one
    assert _resident_count(_planned_main(weight=_numbered(4, "float32", 0))) == 0
    assert _resident_count(_planned_main(weight=np.ones(4, "float32"))) == 1


def _storage_given_twice(overlapping: bool):
    """A storage the plan gives to one tensor (``a``), then to another (``b``); ``overlapping``: ``b``'s view
    made while ``a`` is still read (two views of one memory live at once)."""
    from tvm import relax, te

    t = te.placeholder((4,), "float32", "t")
    copy = te.create_prim_func([t, te.compute((4,), lambda i: t[i], "u")])
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType([4], "float32"))
    kernel = bb.add_func(copy, "copy")

    def storage():
        return bb.emit(relax.op.memory.alloc_storage(relax.ShapeExpr([16]), 0, "global", "float32"))

    def view(of):
        return bb.emit(relax.op.memory.alloc_tensor(of, 0, relax.ShapeExpr([4]), "float32"))

    with bb.function("main", [x], pure=False):
        shared, other, out_storage = storage(), storage(), storage()
        a = view(shared)
        bb.emit(relax.Call(kernel, [x, a]))
        b = view(shared) if overlapping else None
        middle = view(other)
        bb.emit(relax.Call(kernel, [a, middle]))
        b = b if overlapping else view(shared)
        bb.emit(relax.Call(kernel, [middle, b]))
        out = view(out_storage)
        bb.emit(relax.Call(kernel, [b, out]))
        bb.emit_func_output(out)
    return bb.get()


def test_a_storage_given_to_one_tensor_after_another_gives_each_a_constant():
    """transformer_tiny's: a storage whose tensors' lives are apart stays (each its own constant); where two
    views of it live at once (their memory must be one) it stays pooled."""
    from dynatune.model.resident_storage import _tensor_constants_in, keep_storages_resident_pass

    apart = keep_storages_resident_pass()(_storage_given_twice(overlapping=False))["main"]
    assert apart.script().count("R.memory.alloc_storage") == 1  # the output's
    assert len({t.numpy().tobytes() for t in _tensor_constants_in(apart)}) == 3  # a, b and the middle
    together = keep_storages_resident_pass()(_storage_given_twice(overlapping=True))["main"]
    assert together.script().count("R.memory.alloc_storage") == 2  # the output's, and the shared one


def _attention_block_onnx(path: str, tokens: int = 16, dim: int = 32, heads: int = 4) -> str:
    """Self-attention (one projection for queries, keys and values), a residual add, a layer norm, a ReLU
    feed-forward, and the same layer norm again: its kernel writes an intermediate tensor and the output, so
    the intermediate stays a view of its storage, which the plan also gives to another tensor."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(0)

    def w(name, *shape):
        return numpy_helper.from_array((rng.standard_normal(shape) * 0.2).astype(np.float32), name)

    def node(op, ins, out, **attrs):
        return helper.make_node(op, ins, [out], **attrs)

    nodes = [
        node("MatMul", ["x", "wq"], "q"),
        node("Reshape", ["q", "s4"], "q4"),
        node("Transpose", ["q4"], "qt", perm=[0, 2, 1, 3]),
        node("Transpose", ["q4"], "kt", perm=[0, 2, 3, 1]),
        node("MatMul", ["qt", "kt"], "a"),
        node("Softmax", ["a"], "p", axis=-1),
        node("MatMul", ["p", "qt"], "o"),
        node("Transpose", ["o"], "ot", perm=[0, 2, 1, 3]),
        node("Reshape", ["ot", "s3"], "o3"),
        node("MatMul", ["o3", "wo"], "h"),
        node("Add", ["h", "x"], "r"),
        node("LayerNormalization", ["r", "g", "b"], "n1", axis=-1),
        node("MatMul", ["n1", "wf"], "f"),
        node("Relu", ["f"], "fr"),
        node("Add", ["fr", "n1"], "r2"),
        node("LayerNormalization", ["r2", "g", "b"], "y", axis=-1),
    ]
    inits = [
        w("wq", dim, dim),
        w("wo", dim, dim),
        w("wf", dim, dim),
        numpy_helper.from_array(np.array([1, tokens, heads, dim // heads], np.int64), "s4"),
        numpy_helper.from_array(np.array([1, tokens, dim], np.int64), "s3"),
        numpy_helper.from_array(np.ones(dim, np.float32), "g"),
        numpy_helper.from_array(np.zeros(dim, np.float32), "b"),
    ]
    graph = helper.make_graph(
        nodes,
        "attention",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, tokens, dim])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, tokens, dim])],
        inits,
    )
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), path)
    return path


def test_an_attention_block_with_a_storage_given_twice_computes_what_onnx_runtime_does(
    tmp_path, cpu_target, monkeypatch
):
    import tvm

    import dynatune.model.resident_storage as resident

    model = load_model(_attention_block_onnx(str(tmp_path / "attention.onnx")))
    seen = []
    original = resident._resident_views

    def spy(main, calls):
        kept, views = original(main, calls)
        seen.append((len(kept), len(views)))
        return kept, views

    monkeypatch.setattr(resident, "_resident_views", spy)
    executable = build(model, cpu_target)
    assert seen and seen[0][1] > seen[0][0]  # a storage that stays holds two tensors, each a constant
    pooled = build(model, cpu_target, lowering=Lowering(resident_storage=False))
    made = [vm_calls(e.as_text())["vm.builtin.alloc_storage"] for e in (executable, pooled)]
    assert made[0] < made[1], made
    check = verify(relax_vm(executable, tvm.cpu()), model, tvm.cpu(), threads=2)
    assert check.ok and check.max_rel_err < 1e-4, check


def test_an_int64_storage_stays_int64():
    """``relax.const`` narrows an int64 array to int32 unless told: the kernels would refuse the tensor
    (an embedding's indices)."""
    from dynatune.model.resident_storage import _tensor_constants_in, keep_storages_resident_pass

    main = keep_storages_resident_pass()(_planned_main(dtype="int64"))["main"]
    assert main.script().count("R.memory.alloc_storage") == 1
    assert {str(t.dtype) for t in _tensor_constants_in(main)} == {"int64"}
