"""The check against ONNX Runtime: several seeded random inputs, and it fails on a wrong model (real TVM,
real ONNX Runtime, the tiny conv net)."""

import numpy as np
import onnx
import pytest
from helpers import make_tiny_onnx
from onnx import numpy_helper

from dynatune.compiler.compile import VERIFY_INPUTS, build, compile_and_verify, verify
from dynatune.compiler.execution import relax_vm, run
from dynatune.model.importer import load_model


@pytest.fixture(scope="module")
def compiled(tmp_path_factory, cpu_target):
    import tvm

    d = tmp_path_factory.mktemp("verify")
    model = load_model(make_tiny_onnx(str(d / "tiny.onnx"), batch=1))
    dev = tvm.cpu()
    return model, relax_vm(build(model, cpu_target, None), dev), dev, d


def _perturbed(model, path, rel: float):
    """``model``'s ONNX with the second convolution's weights scaled by (1 + rel): a slightly wrong model."""
    m = onnx.ModelProto()
    m.CopyFrom(model.onnx_model)
    for init in m.graph.initializer:
        if init.name == "w2":
            init.CopyFrom(numpy_helper.from_array(numpy_helper.to_array(init) * np.float32(1 + rel), "w2"))
    onnx.save(m, path)
    return onnx.load(path)


def test_verify_checks_several_different_inputs(compiled):
    model, vm, dev, _ = compiled
    check = verify(vm, model, dev, threads=2)
    assert check.ok and check.seeds == list(range(VERIFY_INPUTS)) and VERIFY_INPUTS >= 3
    assert len(check.per_input_rel_err) == VERIFY_INPUTS and max(check.per_input_rel_err) < 1e-5
    assert check.max_rel_err == max(check.per_input_rel_err)
    outs = [run(vm, model, model.random_inputs(s), dev)[0] for s in check.seeds]
    for a in range(len(outs)):  # the inputs are different, and so are the outputs
        for b in range(a):
            assert np.max(np.abs(outs[a] - outs[b])) > 0.01 * np.max(np.abs(outs[a]))


def test_verify_fails_on_a_slightly_wrong_model(compiled):
    model, vm, dev, d = compiled
    wrong = _perturbed(model, str(d / "wrong.onnx"), rel=1e-3)  # weights off by 0.1 %
    check = verify(vm, model, dev, threads=2, reference=wrong, rel_tol=1e-4)
    assert not check.ok
    assert len(check.per_input_rel_err) == VERIFY_INPUTS
    assert all(1e-4 < e < 1e-2 for e in check.per_input_rel_err), check.per_input_rel_err
    assert check.max_rel_err == max(check.per_input_rel_err)
    assert len(set(check.per_input_rel_err)) == VERIFY_INPUTS  # each input measured on its own


def test_compile_report_carries_each_input_error(compiled, cpu_target):
    model, _, _, d = compiled
    rep = compile_and_verify(
        model,
        cpu_target,
        None,
        str(d / "model.so"),
        threads=2,
        seed=5,
        measure_untuned=False,
        measure_onnxruntime=False,
        repeat=2,
    )
    assert rep.numerics_ok and rep.verify_seeds == [5, 6, 7] and len(rep.max_rel_err_per_input) == 3
    assert rep.max_rel_err == max(rep.max_rel_err_per_input)
    assert rep.as_dict()["max_rel_err_per_input"] == rep.max_rel_err_per_input
