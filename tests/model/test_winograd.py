"""Winograd F(4x4, 3x3) in the lowering (``compile.winograd``): eligible 3x3 stride-1 convolutions become a
Winograd task with its bias and ReLU fused, the weight transform is folded at compile time, the others
stay direct, and the model matches ONNX Runtime to well under 1e-4."""

import re

import pytest

from dynatune.compiler.compile import build, verify
from dynatune.compiler.execution import relax_vm
from dynatune.model.extract import Lowering, extract_tasks
from dynatune.model.winograd import RULES

ON = Lowering(winograd=True)
OFF = Lowering(winograd=False)


def test_eligible_convolutions_become_winograd_tasks_with_their_epilogue(winograd_cnn, cpu_target):
    direct = extract_tasks(winograd_cnn, cpu_target, OFF)
    tasks = extract_tasks(winograd_cnn, cpu_target, ON)
    winograd = sorted(t.name for t in tasks if "winograd" in t.name)
    assert len(winograd) == 2 and all(re.search(r"winograd.*add.*relu", n) for n in winograd), winograd
    assert len([t for t in tasks if "winograd" not in t.name and "conv2d" in t.name]) == 4  # b, d, e, f
    assert not [t for t in direct if "winograd" in t.name]
    assert {t.key for t in tasks} != {t.key for t in direct}  # other functions, other keys


def test_winograd_model_matches_onnxruntime_with_its_weights_transformed_at_compile_time(
    winograd_cnn, cpu_target
):
    import tvm

    executable = build(winograd_cnn, cpu_target, None, ON)
    text = executable.as_text()
    assert "conv2d_winograd" in text and "winograd_weight_transform" not in text
    dev = tvm.cpu()
    check = verify(relax_vm(executable, dev), winograd_cnn, dev, threads=2)
    assert check.ok and check.max_rel_err < 1e-5, check


def test_winograd_is_part_of_the_lowering_on_nhwc_cpu_targets_only(cpu_target):
    import tvm

    assert ON.winograds(cpu_target) and not OFF.winograds(cpu_target)
    assert Lowering().winograds(cpu_target)  # on by default: the compile keeps it only where it won
    assert not Lowering(winograd=True, conv_layout="NCHW").winograds(cpu_target)
    assert not ON.winograds(tvm.target.Target("cuda"))
    assert ON.describe(cpu_target) != OFF.describe(cpu_target)


@pytest.mark.slow
def test_tuned_winograd_task_uses_the_winograd_rules_and_matches_onnxruntime(
    winograd_cnn, cpu_target, tmp_path
):
    """A few real trials of the heaviest Winograd task: MetaSchedule's CPU Winograd rules schedule its
    data-pack and inverse blocks, the tuned kernel reads a prepacked ``kernel_pack``, and the model
    matches."""
    import tvm
    from helpers import few_trials_session

    calls, originals = [], {f"s_tir.meta_schedule.cpu.{r}": None for r in RULES}
    for name in originals:
        originals[name] = original = tvm.get_global_func(name)

        def counted(sch, block, original=original, name=name):
            calls.append(name)
            return original(sch, block)

        tvm.register_global_func(name, counted, override=True)
    try:
        tasks = extract_tasks(winograd_cnn, cpu_target, ON)
        task = next(
            t
            for t in tasks
            if "winograd" in t.name and t.flops == max(x.flops for x in tasks if "winograd" in x.name)
        )
        session = few_trials_session(tasks, cpu_target, str(tmp_path / "work"))
        try:
            result = session.tune(task.index, trials=4)
            assert result.trials >= 4 and result.build_errors + result.run_errors < result.trials, (
                result.errors
            )
            db = session.compile_database()
            executable = build(winograd_cnn, cpu_target, db, ON)
        finally:
            session.close()
    finally:
        for name, original in originals.items():
            tvm.register_global_func(name, original, override=True)
    assert set(calls) == set(originals)
    dev = tvm.cpu()
    check = verify(relax_vm(executable, dev), winograd_cnn, dev, threads=2)
    assert check.ok and check.max_rel_err < 1e-5, check
