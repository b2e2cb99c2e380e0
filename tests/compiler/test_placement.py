"""Concatenation by placement: a concatenation's producers write into their slices of it, its copy kernel
is gone from the compiled model and from the tasks, and the model still computes what ONNX Runtime does."""

import re

import numpy as np
import pytest

from dynatune.compiler.compile import build, verify
from dynatune.compiler.execution import relax_vm, run
from dynatune.model.extract import Lowering, extract_tasks, fuse
from dynatune.model.importer import load_model
from dynatune.model.placement import concat_axis, into_slice

OFF = Lowering(place_concat=False)


def _save(tmp_path, name, nodes, inits, channels, out_channels, hw=9):
    import onnx
    from onnx import TensorProto, helper

    graph = helper.make_graph(
        nodes,
        name,
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, channels, hw, hw])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, out_channels, hw, hw])],
        inits,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    path = str(tmp_path / f"{name}.onnx")
    onnx.save(model, path)
    return path


def _conv(rng, name, src, out, cin, cout, k=1):
    from onnx import helper, numpy_helper

    w = (rng.standard_normal((cout, cin, k, k)) * np.sqrt(2.0 / (cin * k * k))).astype(np.float32)
    b = (rng.standard_normal(cout) * 0.1).astype(np.float32)
    inits = [numpy_helper.from_array(w, f"{name}_w"), numpy_helper.from_array(b, f"{name}_b")]
    pad = [k // 2] * 4
    nodes = [
        helper.make_node("Conv", [src, f"{name}_w", f"{name}_b"], [f"{name}_c"], pads=pad),
        helper.make_node("Relu", [f"{name}_c"], [out]),
    ]
    return nodes, inits


def fire(tmp_path, rng):
    """SqueezeNet's fire module: squeeze 1x1 -> (expand 1x1, expand 3x3) -> concat -> 1x1."""
    from onnx import helper

    parts = [
        _conv(rng, "s", "x", "s", 8, 8),
        _conv(rng, "e1", "s", "e1", 8, 16),
        _conv(rng, "e3", "s", "e3", 8, 16, k=3),
        _conv(rng, "o", "cat", "y", 32, 8),
    ]
    nodes = [n for p in parts[:3] for n in p[0]] + [helper.make_node("Concat", ["e1", "e3"], ["cat"], axis=1)]
    nodes += parts[3][0]
    return _save(tmp_path, "fire", nodes, [i for p in parts for i in p[1]], 8, 8)


def three_way_and_shared(tmp_path, rng):
    """Two concatenations: one of three convolutions (placed), and one whose first input also feeds another
    convolution (used twice: left as a copy)."""
    from onnx import helper

    first = [_conv(rng, n, "x", n, 8, c, k) for n, c, k in (("a", 8, 1), ("b", 16, 3), ("c", 8, 1))]
    second = [_conv(rng, "d", "abc", "d", 32, 8), _conv(rng, "e", "x", "e", 8, 8)]
    last = [_conv(rng, "f", "de", "f", 16, 16), _conv(rng, "g", "d", "g", 8, 16)]
    nodes = [n for p in first for n in p[0]] + [helper.make_node("Concat", ["a", "b", "c"], ["abc"], axis=1)]
    nodes += [n for p in second for n in p[0]] + [helper.make_node("Concat", ["d", "e"], ["de"], axis=1)]
    nodes += [n for p in last for n in p[0]] + [helper.make_node("Add", ["f", "g"], ["y"])]
    inits = [i for p in first + second + last for i in p[1]]
    return _save(tmp_path, "three_way", nodes, inits, 8, 16)


def _calls(executable) -> set[str]:
    return set(re.findall(r"\b(\w*(?:concatenate|_placed)\w*)\b", executable.as_text()))


@pytest.mark.parametrize("make", [fire, three_way_and_shared])
def test_placed_model_computes_what_onnxruntime_does(make, cpu_target, tmp_path):
    import tvm

    model = load_model(make(tmp_path, np.random.default_rng(0)))
    dev = tvm.cpu()
    placed, copied = build(model, cpu_target, None), build(model, cpu_target, None, OFF)
    inputs = model.random_inputs(3)
    for a, b in zip(
        run(relax_vm(placed, dev), model, inputs, dev), run(relax_vm(copied, dev), model, inputs, dev)
    ):
        np.testing.assert_array_equal(a, b)  # the same kernels, writing elsewhere: bit for bit
    check = verify(relax_vm(placed, dev), model, dev, threads=2)
    assert check.ok and check.max_rel_err < 1e-5, check
    assert any(c.endswith("_placed") for c in _calls(placed))


def test_fire_has_no_concatenation_kernel_or_task(cpu_target, tmp_path):
    model = load_model(fire(tmp_path, np.random.default_rng(1)))
    assert not [c for c in _calls(build(model, cpu_target, None)) if c.startswith("concatenate")]
    assert [c for c in _calls(build(model, cpu_target, None, OFF)) if c.startswith("concatenate")]
    placed = [t.name for t in extract_tasks(model, cpu_target)]
    copied = [t.name for t in extract_tasks(model, cpu_target, OFF)]
    assert [n for n in copied if n.startswith("concatenate")] and not [
        n for n in placed if "concatenate" in n
    ]
    assert sorted(placed) == sorted(n for n in copied if not n.startswith("concatenate"))


def test_a_concatenation_with_a_shared_input_keeps_its_copy_and_its_task(cpu_target, tmp_path):
    """``d`` feeds ``concat(d, e)`` and another convolution: that concatenation is not placed, and the
    compiled model and the tasks keep it; ``concat(a, b, c)`` is placed."""
    model = load_model(three_way_and_shared(tmp_path, np.random.default_rng(2)))
    kept = [c for c in _calls(build(model, cpu_target, None)) if c.startswith("concatenate")]
    assert len(kept) == 1
    assert len([t for t in extract_tasks(model, cpu_target) if t.name.startswith("concatenate")]) == 1
    assert len([t for t in extract_tasks(model, cpu_target, OFF) if t.name.startswith("concatenate")]) == 2


def test_a_producer_writes_only_its_slice(cpu_target, tmp_path):
    import tvm

    model = load_model(fire(tmp_path, np.random.default_rng(4)))
    fused = fuse(model.bound_module(), cpu_target, OFF)
    name = next(gv.name_hint for gv in fused.functions if "conv2d2" in gv.name_hint)  # the 3x3 expand
    func = fused[name]
    shapes = [[int(d) for d in p.shape] for p in func.params]
    n, h, w, c = shapes[-1]
    rng = np.random.default_rng(5)
    args = [rng.standard_normal(s).astype(np.float32) for s in shapes[:-1]]
    alone = tvm.compile(tvm.IRModule({"main": func.with_attr("global_symbol", "main")}), target=cpu_target)
    want = tvm.runtime.tensor(np.zeros((n, h, w, c), np.float32))
    alone["main"](*[tvm.runtime.tensor(a) for a in args], want)
    slice_fn = into_slice(func, (n, h, w, c + 24), axis=3, offset=16)
    placed = tvm.compile(
        tvm.IRModule({"main": slice_fn.with_attr("global_symbol", "main")}), target=cpu_target
    )
    whole = np.full((n, h, w, c + 24), np.nan, np.float32)
    got = tvm.runtime.tensor(whole)
    placed["main"](*[tvm.runtime.tensor(a) for a in args], got)
    got = got.numpy()
    np.testing.assert_array_equal(got[..., 16 : 16 + c], want.numpy())
    assert np.isnan(got[..., :16]).all() and np.isnan(got[..., 16 + c :]).all()


def test_only_plain_concatenations_are_recognised(cpu_target, tmp_path):
    model = load_model(three_way_and_shared(tmp_path, np.random.default_rng(6)))
    fused = fuse(model.bound_module(), cpu_target, OFF)
    axes = {gv.name_hint: concat_axis(f) for gv, f in fused.functions.items() if hasattr(f, "params")}
    assert sorted(a for n, a in axes.items() if n.startswith("concatenate")) == [3, 3]  # NHWC channels
    assert all(a is None for n, a in axes.items() if not n.startswith("concatenate"))


@pytest.mark.slow
def test_tuned_prepacked_producers_are_placed(cpu_target, tmp_path):
    """A few real trials on the fire module's two expand convolutions: their tuned kernels, on prepacked
    weights, write into the concatenation, and the model matches ONNX Runtime."""
    import tvm
    from helpers import few_trials_session

    model = load_model(fire(tmp_path, np.random.default_rng(7)))
    tasks = extract_tasks(model, cpu_target)
    expand = [t.index for t in tasks if re.match(r"fused_conv2d[12]_", t.name)]
    assert len(expand) == 2
    session = few_trials_session(tasks, cpu_target, str(tmp_path / "work"))
    try:
        for i in expand:
            session.tune(i, trials=4)
        db = session.compile_database()
        executable = build(model, cpu_target, db)
    finally:
        session.close()
    calls = _calls(executable)
    tuned = {t.name for t in tasks if db.has_workload(t.mod) and t.index in expand}
    assert tuned and {f"{n}_prepacked_placed" for n in tuned} <= calls
    assert not [c for c in calls if c.startswith("concatenate")]
    dev = tvm.cpu()
    check = verify(relax_vm(executable, dev), model, dev, threads=2)
    assert check.ok and check.max_rel_err < 1e-5, check


def test_placement_is_part_of_the_lowering_on_cpu_targets_only(cpu_target):
    import tvm

    assert Lowering().places_concats(cpu_target) and not OFF.places_concats(cpu_target)
    assert not Lowering().places_concats(tvm.target.Target("cuda"))
    assert Lowering().describe(cpu_target) != OFF.describe(cpu_target)  # the task cache tells them apart
