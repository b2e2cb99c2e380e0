"""The planned memory's run-time objects made once: kernels take their storages flat
(``model.flat_storage``), views left are made once per place (``model.shared_views``), and the packed
weights' tuples are gone (``compile.weight_prepack_passes``). The model computes what ONNX Runtime does, and
runs in plain TVM."""

import re

import numpy as np
import pytest
from helpers import function_text, randomized_light_model, repeated_blocks_onnx, run_in_plain_tvm, vm_calls

from dynatune.compiler.compile import build, export, verify
from dynatune.compiler.execution import relax_vm
from dynatune.model.extract import Lowering
from dynatune.model.importer import load_model


@pytest.fixture(scope="module")
def repeated(tmp_path_factory, cpu_target):
    model = load_model(repeated_blocks_onnx(str(tmp_path_factory.mktemp("flat") / "repeated.onnx")))
    # the storages taken from the VM's pool, as without the resident storages (model.resident_storage)
    return model, build(model, cpu_target, lowering=Lowering(resident_storage=False))


def test_a_run_makes_one_tensor_per_storage(repeated):
    _model, executable = repeated
    calls = vm_calls(executable.as_text())
    # one tensor per storage: a flat one, or the model's output (a storage of its own, lowered from the
    # output's allocation)
    assert calls["vm.builtin.alloc_tensor"] == calls["vm.builtin.alloc_storage"] == 5
    repeated_kernel = [name for name, n in calls.items() if n == 4 and not name.startswith("vm.")]
    assert len(repeated_kernel) == 1, calls


def test_a_kernel_called_between_different_storages_reads_and_writes_each(repeated, cpu_target):
    """The repeated 1x1 kernel alternates between two storages: each call gets its own (a kernel that read
    its first call's storage at every call computed mnasnet0_5 41x wrong)."""
    import tvm

    model, executable = repeated
    text = function_text(executable.as_text())
    kernel = next(
        name for name, n in vm_calls(executable.as_text()).items() if n == 4 and not name.startswith("vm.")
    )
    sites = re.findall(rf"call  {kernel} in: (%\d+), c\[\d+\], c\[\d+\], (%\d+)", text)
    assert len(sites) == 4 and len(set(sites)) == 2, sites
    assert all(src != dst for src, dst in sites)
    check = verify(relax_vm(executable, tvm.cpu()), model, tvm.cpu(), threads=2)
    assert check.ok and check.max_rel_err < 1e-4, check


def test_a_kernel_takes_its_storage_flat_and_declares_its_tensor_inside(repeated, cpu_target):
    import tvm
    from tvm import relax

    from dynatune.compiler.compile import finalize_passes
    from dynatune.model.extract import Lowering, backend_passes, fuse_passes

    model, _ = repeated
    with cpu_target, tvm.transform.PassContext(opt_level=3):
        lowered = tvm.transform.Sequential(
            fuse_passes(cpu_target, Lowering()) + backend_passes(cpu_target, "dataflow_lower_passes")
        )(model.bound_module())
        planned = tvm.transform.Sequential(finalize_passes(cpu_target)[:4])(lowered)
    names = [p.info.name for p in finalize_passes(cpu_target)]
    assert names[:7] == [
        "StaticPlanBlockMemory",
        "LowerAllocTensor",
        "FlattenPlannedTensors",
        "ShareIdenticalViews",
        "KeepStoragesResident",
        "AddDestinationEntry",
        "KillAfterLastUse",
    ]

    def takes_flat(func) -> bool:  # a parameter of one symbolic dimension, its tensor declared inside
        flat = [p for p in func.params if len(p.shape) == 1 and not isinstance(p.shape[0], tvm.tirx.IntImm)]
        return bool(flat) and all(f"{p.name}_in_storage" in func.script() for p in flat)

    kernels = [f for f in planned.functions.values() if isinstance(f, tvm.tirx.PrimFunc)]
    assert sum(takes_flat(f) for f in kernels) >= 3  # the 3x3, the repeated 1x1, the pool
    main = planned["main"].script()
    assert main.count("R.memory.alloc_tensor") == main.count("R.memory.alloc_storage")
    assert isinstance(planned["main"], relax.Function)


def test_without_flat_storage_a_run_makes_a_view_per_tensor_and_the_tasks_are_the_same(repeated, cpu_target):
    """``Lowering(flat_storage=False)`` (``bench.lowering_ab --variant NAME:flat_storage=false`` compares it):
    TVM's finalize passes, a view per intermediate tensor; the same tasks, so the same records apply."""
    import tvm

    from dynatune.model.extract import Lowering

    model, flat = repeated
    views = build(model, cpu_target, lowering=Lowering(flat_storage=False, resident_storage=False))
    made = [vm_calls(e.as_text())["vm.builtin.alloc_tensor"] for e in (views, flat)]
    assert made[0] > made[1]
    assert Lowering(flat_storage=False).describe(cpu_target) == Lowering().describe(cpu_target)
    check = verify(relax_vm(views, tvm.cpu()), model, tvm.cpu(), threads=2)
    assert check.ok and check.max_rel_err < 1e-4


def test_gpu_targets_keep_tvms_finalize_passes():
    import tvm

    from dynatune.compiler.compile import finalize_passes
    from dynatune.model.extract import backend_passes

    gpu = tvm.target.Target("cuda")
    assert [p.info.name for p in finalize_passes(gpu)] == [
        p.info.name for p in backend_passes(gpu, "finalize_passes")
    ]


def test_the_artifact_runs_in_plain_tvm(repeated, tmp_path):
    model, executable = repeated
    check = run_in_plain_tvm(model, export(executable, str(tmp_path / "model.so")), tmp_path)
    assert check.ok and check.max_rel_err < 1e-4


def test_identical_views_are_made_once():
    """Two views at the same place (storage, offset, shape, type) are one; a view of another shape stays."""
    from tvm import relax

    from dynatune.model.shared_views import share_identical_views_pass

    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType([4], "float32"))
    with bb.function("main", [x], pure=False):
        storage = bb.emit(relax.op.memory.alloc_storage(relax.ShapeExpr([64]), 0, "global", "float32"))
        views = [
            bb.emit(relax.op.memory.alloc_tensor(storage, 0, relax.ShapeExpr(shape), "float32"))
            for shape in ([4], [4], [2, 2])
        ]
        bb.emit_func_output(relax.Tuple(views))
    mod = bb.get()
    shared = share_identical_views_pass()(mod)
    alloc_tensors = shared["main"].script().count("R.memory.alloc_tensor")
    assert alloc_tensors == 2 and mod["main"].script().count("R.memory.alloc_tensor") == 3


def test_packed_weights_leave_no_tuple_to_take_apart(cpu_target):
    """Weights packed in pairs (a kernel's weight and bias): folding leaves ``t = (c0, c1); w = t[0]; b =
    t[1]``, four VM instructions a call; the kernel now reads the constants themselves."""
    import tvm
    from tvm import relax, te

    from dynatune.compiler.compile import weight_prepack_passes

    rng = np.random.default_rng(0)
    w, b = (rng.standard_normal(4).astype(np.float32) for _ in range(2))
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType([4], "float32"))
    with bb.function("main", [x]):
        with bb.dataflow():
            pair = bb.emit_te(
                lambda w, b: (te.compute((4,), lambda i: w[i] * 2.0), te.compute((4,), lambda i: b[i] + 1.0)),
                relax.const(w),
                relax.const(b),
            )
            y = bb.emit_output(
                bb.emit_te(
                    lambda x, w, b: te.compute((4,), lambda i: x[i] * w[i] + b[i]),
                    x,
                    bb.emit(relax.TupleGetItem(pair, 0)),
                    bb.emit(relax.TupleGetItem(pair, 1)),
                )
            )
        bb.emit_func_output(y)
    with cpu_target, tvm.transform.PassContext(opt_level=3):
        packed = tvm.transform.Sequential(weight_prepack_passes())(bb.get())
        executable = relax.build(packed, target=cpu_target)
    text = executable.as_text()
    assert "make_tuple" not in text and "tuple_getitem" not in text
    xs = rng.standard_normal(4).astype(np.float32)
    out = relax.VirtualMachine(executable, tvm.cpu())["main"](tvm.runtime.tensor(xs)).numpy()
    np.testing.assert_allclose(out, xs * (w * 2.0) + (b + 1.0), rtol=1e-6)


@pytest.mark.slow
@pytest.mark.parametrize("name", ["shufflenet", "inception_v1"])
def test_light_models_with_reshapes_and_placed_concatenations_compute_what_onnxruntime_does(
    name, tmp_path, cpu_target
):
    """ShuffleNet's channel shuffles (reshape views the kernels do not read) and Inception's concatenations
    (producers writing their slices in place): flat storages beside both, one tensor per storage but the views
    a reshape reads."""
    import tvm

    model = load_model(randomized_light_model(name, str(tmp_path / f"{name}.onnx")))
    executable = build(model, cpu_target)
    calls = vm_calls(executable.as_text())
    assert calls["vm.builtin.alloc_tensor"] <= calls["vm.builtin.alloc_storage"] + calls["vm.builtin.reshape"]
    check = verify(relax_vm(executable, tvm.cpu()), model, tvm.cpu(), threads=2)
    assert check.ok and check.max_rel_err < 1e-4, check
