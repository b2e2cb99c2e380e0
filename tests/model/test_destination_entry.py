"""The model run into its caller's outputs (``model.destination_entry``): ``main_into`` beside ``main``, and
the runs of the loader's call (``runtime.VMCall``) that allocate nothing."""

import numpy as np
import pytest
from helpers import repeated_blocks_onnx, save_onnx, vm_calls

from dynatune.compiler.compile import build, export, verify
from dynatune.compiler.execution import onnxruntime_outputs, relax_vm
from dynatune.model.importer import load_model
from dynatune.runtime import INTO_ENTRY, VMCall, entry_arguments, has_entry


@pytest.fixture(scope="module")
def repeated(tmp_path_factory, cpu_target):
    model = load_model(repeated_blocks_onnx(str(tmp_path_factory.mktemp("into") / "repeated.onnx")))
    return model, build(model, cpu_target)


def two_outputs_onnx(path: str) -> str:
    """A convolution whose result is an output, and goes on through a second one to another output."""
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(1)
    inits = [
        numpy_helper.from_array((rng.standard_normal(s) * 0.3).astype(np.float32), n)
        for n, s in (("w0", (8, 3, 3, 3)), ("w1", (4, 8, 1, 1)))
    ]
    nodes = [
        helper.make_node("Conv", ["x", "w0"], ["c"], pads=[1, 1, 1, 1]),
        helper.make_node("Relu", ["c"], ["a"]),
        helper.make_node("Conv", ["a", "w1"], ["b"]),
    ]
    value = helper.make_tensor_value_info
    graph = helper.make_graph(
        nodes,
        "two_outputs",
        [value("x", TensorProto.FLOAT, [1, 3, 8, 8])],
        [value("a", TensorProto.FLOAT, [1, 8, 8, 8]), value("b", TensorProto.FLOAT, [1, 4, 8, 8])],
        inits,
    )
    return save_onnx(graph, path)


def test_a_run_of_main_into_allocates_nothing(repeated):
    _model, executable = repeated
    text = executable.as_text()
    into = vm_calls(text, INTO_ENTRY)
    assert not [name for name in into if name.startswith("vm.builtin.alloc")], into
    assert vm_calls(text)["vm.builtin.alloc_tensor"] == 1  # main returns a tensor of its own, as before
    kernels = {name: n for name, n in vm_calls(text).items() if not name.startswith("vm.")}
    assert {name: n for name, n in into.items() if not name.startswith("vm.")} == kernels


def test_main_into_writes_the_tensors_it_is_given_run_after_run(repeated):
    import tvm

    model, executable = repeated
    vm, name = relax_vm(executable, tvm.cpu()), model.inputs[0].name
    x = tvm.runtime.tensor(model.random_inputs(0)[name])
    entry, args = entry_arguments(vm, [x])
    assert entry == INTO_ENTRY and len(args) == 2
    out = args[1]
    for seed in (1, 2, 0):
        x.copyfrom(model.random_inputs(seed)[name])
        returned = vm[INTO_ENTRY](*args)
        assert returned.same_as(out)
        _, (want,) = onnxruntime_outputs(model, {name: x.numpy()}, 2)
        np.testing.assert_allclose(out.numpy(), want, rtol=1e-4, atol=1e-5)
        np.testing.assert_array_equal(vm["main"](x).numpy(), out.numpy())


def test_the_loaders_runs_after_the_first_call_no_allocation(repeated):
    """What a user of ``dynatune.runtime.load`` runs: the first call ``main``, then ``main_into`` on the first
    call's outputs; each call's arrays are the caller's (a later call does not write them)."""
    import tvm

    from dynatune.compiler.profile import CallRecorder

    model, executable = repeated
    vm, name = relax_vm(executable, tvm.cpu()), model.inputs[0].name
    recorder = CallRecorder(tvm.cpu())
    vm.set_instrument(recorder)
    call = VMCall(vm, tvm.cpu(), [(model.inputs[0].shape, model.inputs[0].dtype)])
    xs = [model.random_inputs(seed)[name] for seed in (0, 1, 2)]
    results = []
    for i, x in enumerate(xs):
        recorder.calls.clear()
        results.append(call([x]))
        allocations = [s for s, _ in recorder.calls if s.startswith("vm.builtin.alloc")]
        assert allocations == ([] if i else ["vm.builtin.alloc_storage", "vm.builtin.alloc_tensor"])
    for x, (got,) in zip(xs, results):
        _, (want,) = onnxruntime_outputs(model, {name: x}, 2)
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)


def test_two_outputs_are_passed_in_order(tmp_path, cpu_target):
    import tvm

    model = load_model(two_outputs_onnx(str(tmp_path / "two.onnx")))
    executable = build(model, cpu_target)
    assert not [c for c in vm_calls(executable.as_text(), INTO_ENTRY) if c.startswith("vm.builtin.alloc")]
    vm = relax_vm(executable, tvm.cpu())
    check = verify(
        vm, model, tvm.cpu(), threads=2, seeds=[0, 1, 2]
    )  # the loader's call: main, then main_into
    assert check.ok and check.max_rel_err < 1e-4, check
    _, args = entry_arguments(vm, [tvm.runtime.tensor(model.random_inputs(0)["x"])])
    assert [tuple(a.shape) for a in args[1:]] == [(1, 8, 8, 8), (1, 4, 8, 8)]


def test_a_model_that_returns_its_input_keeps_main_alone(tmp_path, cpu_target):
    """No tensor of its own to pass: the caller calls ``main``."""
    import tvm
    from onnx import TensorProto, helper

    value = helper.make_tensor_value_info
    graph = helper.make_graph(
        [helper.make_node("Identity", ["x"], ["y"])],
        "identity",
        [value("x", TensorProto.FLOAT, [1, 4])],
        [value("y", TensorProto.FLOAT, [1, 4])],
    )
    model = load_model(save_onnx(graph, str(tmp_path / "identity.onnx")))
    vm = relax_vm(build(model, cpu_target), tvm.cpu())
    assert not has_entry(vm, INTO_ENTRY)
    x = model.random_inputs(0)["x"]
    call = VMCall(vm, tvm.cpu(), [((1, 4), "float32")])
    for _ in range(2):
        np.testing.assert_array_equal(call([x])[0], x)


def test_a_wrong_output_tensor_is_refused(repeated):
    import tvm

    model, executable = repeated
    vm = relax_vm(executable, tvm.cpu())
    x = tvm.runtime.tensor(model.random_inputs(0)[model.inputs[0].name])
    with pytest.raises(Exception, match="shape|dim"):
        vm[INTO_ENTRY](x, tvm.runtime.empty((1, 11), "float32", tvm.cpu()))


def test_the_exported_library_has_main_into_in_plain_tvm(repeated, tmp_path):
    """A plain-TVM user who passes outputs: ``main_into`` in the exported library, equal to ``main``."""
    import subprocess
    import sys

    model, executable = repeated
    artifact = export(executable, str(tmp_path / "model.so"))
    np.save(tmp_path / "x.npy", model.random_inputs(0)[model.inputs[0].name])
    code = (
        "import sys, numpy as np, tvm; from tvm import relax;"
        "vm = relax.VirtualMachine(tvm.runtime.load_module(sys.argv[1]), tvm.cpu());"
        "x = tvm.runtime.tensor(np.load(sys.argv[2]));"
        "out = tvm.runtime.empty((1, 10), 'float32', tvm.cpu());"
        "vm['main_into'](x, out); assert np.array_equal(out.numpy(), vm['main'](x).numpy());"
        "assert 'dynatune' not in sys.modules"
    )
    subprocess.run([sys.executable, "-c", code, artifact, str(tmp_path / "x.npy")], check=True, cwd=tmp_path)


def test_main_into_has_variables_of_its_own(repeated, cpu_target):
    """TVM's well-formedness: a variable belongs to one function (``main_into`` is built from ``main``)."""
    import tvm
    from tvm import relax

    from dynatune.compiler.compile import finalize_passes
    from dynatune.model.extract import Lowering, backend_passes, fuse_passes

    model, _ = repeated
    passes = finalize_passes(cpu_target)
    upto = [p.info.name for p in passes].index("AddDestinationEntry") + 1
    with cpu_target, tvm.transform.PassContext(opt_level=3):
        lowered = tvm.transform.Sequential(
            fuse_passes(cpu_target, Lowering()) + backend_passes(cpu_target, "dataflow_lower_passes")
        )(model.bound_module())
        mod = tvm.transform.Sequential(passes[:upto])(lowered)
    assert INTO_ENTRY in [gv.name_hint for gv in mod.functions]
    relax.analysis.well_formed(mod, False)  # (raises on a variable of two functions; types not checked:
    # the kernels' flat parameters differ from their arguments' types by design)
