"""Constant folding in one LLVM build gives exactly what TVM's FoldConstant gives alone."""

import pytest
from helpers import save_float_model

from dynatune.model.constant_folding import calls_on_constants, fold_calls_on_constants_pass
from dynatune.model.extract import fuse_passes
from dynatune.model.importer import load_model


def _batch_norm_onnx(path: str) -> str:
    """conv -> batch norm -> relu -> grouped conv -> batch norm -> add (residual) -> mul by a constant ->
    global pool -> gemm, random weights: batch norms to fold into their convolutions, weights to transform."""
    import numpy as np
    from onnx import helper, numpy_helper

    rng = np.random.default_rng(0)

    def w(name, *shape, positive=False):
        a = rng.standard_normal(shape).astype(np.float32) * 0.2
        return numpy_helper.from_array(np.abs(a) + 0.5 if positive else a, name)

    def bn(i, x, y):
        return helper.make_node(
            "BatchNormalization", [x, f"s{i}", f"o{i}", f"m{i}", f"v{i}"], [y], epsilon=1e-3, name=f"bn{i}"
        )

    c = 8
    nodes = [
        helper.make_node("Conv", ["x", "w1"], ["c1"], pads=[1, 1, 1, 1], name="conv1"),
        bn(1, "c1", "n1"),
        helper.make_node("Relu", ["n1"], ["r1"], name="relu1"),
        helper.make_node("Conv", ["r1", "w2"], ["c2"], pads=[1, 1, 1, 1], group=2, name="conv2"),
        bn(2, "c2", "n2"),
        helper.make_node("Add", ["n2", "r1"], ["a"], name="add"),
        helper.make_node("Mul", ["a", "k"], ["m"], name="mul"),
        helper.make_node("GlobalAveragePool", ["m"], ["g"], name="gap"),
        helper.make_node("Flatten", ["g"], ["f"], name="flatten"),
        helper.make_node("Gemm", ["f", "fc_w", "fc_b"], ["y"], transB=1, name="fc"),
    ]
    inits = [w("w1", c, 3, 3, 3), w("w2", c, c // 2, 3, 3), w("k", c, 1, 1), w("fc_w", 10, c), w("fc_b", 10)]
    for i in (1, 2):
        inits += [w(f"s{i}", c), w(f"o{i}", c), w(f"m{i}", c), w(f"v{i}", c, positive=True)]
    return save_float_model(path, "batch_norm", nodes, inits, [1, 3, 16, 16], [1, 10])


@pytest.fixture(scope="module")
def lowered(tmp_path_factory, cpu_target):
    """The batch-norm model's bound module, and the fusion passes split around constant folding."""
    model = load_model(_batch_norm_onnx(str(tmp_path_factory.mktemp("fold") / "bn.onnx")))
    passes = fuse_passes(cpu_target)
    at = [p.info.name for p in passes].index("FoldCallsOnConstants")
    assert passes[at + 1].info.name == "FoldConstant"
    return model.bound_module(), passes[:at], passes[at:], passes[at + 1 :]


def _run(passes, mod, target):
    import tvm

    with target, tvm.transform.PassContext(opt_level=3):
        return tvm.transform.Sequential(passes)(mod)


def test_folding_in_one_build_gives_what_fold_constant_gives(lowered, cpu_target):
    import tvm_ffi

    bound, before, ours, theirs = lowered
    legalized = _run(before, bound, cpu_target)
    calls = calls_on_constants(legalized, legalized["main"])
    assert len(calls) >= 8  # the batch norms' arithmetic, the weights' layout transforms
    # after our pass, FoldConstant has no call on constants left to build
    folded = _run([fold_calls_on_constants_pass()], legalized, cpu_target)
    assert calls_on_constants(folded, folded["main"]) == []
    # and the fused model is FoldConstant's, constants' bytes included
    assert tvm_ffi.structural_equal(_run(ours, legalized, cpu_target), _run(theirs, legalized, cpu_target))


def test_a_module_without_calls_on_constants_is_left_as_it_is(lowered, cpu_target):
    bound, before, _, _ = lowered
    legalized = _run(before, bound, cpu_target)
    folded = _run([fold_calls_on_constants_pass()], legalized, cpu_target)
    assert _run([fold_calls_on_constants_pass()], folded, cpu_target).same_as(folded)
