"""Conv layout: on CPU targets convolutions are tuned and compiled in NHWC; extraction and compile agree."""

import logging

import pytest
from helpers import randomized_light_model

from dynatune.model.extract import Lowering, extract_tasks, fuse, task_key
from dynatune.model.importer import load_model
from dynatune.model.layout import _convert_or_keep, conv_layout_passes, resolve_conv_layout


def conv_texts(tasks):
    return [t.mod["main"].script() for t in tasks if "conv2d" in t.name]


def test_auto_is_nhwc_on_cpu_and_the_model_layout_on_gpu(cpu_target):
    import tvm

    assert resolve_conv_layout(cpu_target) == "NHWC"
    assert resolve_conv_layout(tvm.target.Target("cuda")) is None
    assert resolve_conv_layout(cpu_target, "NCHW") is None
    assert resolve_conv_layout(tvm.target.Target("cuda"), "NHWC") == "NHWC"
    with pytest.raises(ValueError, match="conv_layout"):
        resolve_conv_layout(cpu_target, "NCHWc")
    assert conv_layout_passes(None) == []


def test_cpu_tasks_are_nhwc_and_nchw_keeps_the_model_layout(tiny_model, cpu_target):
    nhwc = extract_tasks(tiny_model, cpu_target)
    nchw = extract_tasks(tiny_model, cpu_target, Lowering(conv_layout="NCHW"))
    assert conv_texts(nhwc) and all("conv2d_nhwc" in s for s in conv_texts(nhwc))
    assert conv_texts(nchw) and all("conv2d_nchw" in s for s in conv_texts(nchw))
    convs = lambda tasks: {t.key for t in tasks if "conv2d" in t.name}  # noqa: E731
    assert convs(nhwc).isdisjoint(convs(nchw))  # the layout is part of the key
    assert Lowering().describe(cpu_target) != Lowering(conv_layout="NCHW").describe(cpu_target)


def test_extraction_keys_match_the_compiled_functions_in_both_layouts(tiny_model, cpu_target):
    import tvm
    from tvm.s_tir.meta_schedule.tune_context import _normalize_mod

    for lowering in (Lowering(), Lowering(conv_layout="NCHW")):
        fused = fuse(tiny_model.bound_module(), cpu_target, lowering)
        compiled = {
            task_key(_normalize_mod(f)) for f in fused.functions.values() if isinstance(f, tvm.tirx.PrimFunc)
        }
        assert {t.key for t in extract_tasks(tiny_model, cpu_target, lowering)} <= compiled


@pytest.mark.slow
def test_a_model_with_dropout_converts_and_matches_onnxruntime(cpu_target, tmp_path):
    """light_squeezenet has a Dropout, whose (output, mask) tuple stops TVM's ConvertLayout unless it is
    dropped first; the NHWC model must still give ONNX Runtime's outputs."""
    import tvm

    from dynatune.compiler.compile import build, compare
    from dynatune.compiler.execution import onnxruntime_outputs, relax_vm, run

    model = load_model(randomized_light_model("squeezenet", str(tmp_path / "sq.onnx")))
    fused = fuse(model.bound_module(), cpu_target)
    assert "conv2d_nhwc" in fused.script() and "nn.dropout" not in fused.script()
    inputs = model.random_inputs(0)
    outs = run(relax_vm(build(model, cpu_target), tvm.cpu()), model, inputs, tvm.cpu())
    _, ref = onnxruntime_outputs(model, inputs, 2)
    assert compare(outs, ref, 1e-4).ok


def test_a_model_convertlayout_cannot_rewrite_keeps_its_layout(cpu_target, tmp_path, caplog):
    """Without the dropout pass, TVM 0.27's ConvertLayout fails on squeezenet: the module is kept as it is
    (the same at extraction and compile, so keys still match), and a warning says so."""
    from tvm_ffi import structural_equal

    model = load_model(randomized_light_model("squeezenet", str(tmp_path / "sq.onnx")))
    mod = model.bound_module()
    with caplog.at_level(logging.WARNING, logger="dynatune.model.layout"):
        out = _convert_or_keep("NHWC", "OHWI")(mod)
    assert structural_equal(out, mod)
    assert "keeps its own layout" in caplog.text
