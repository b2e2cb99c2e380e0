"""Winograd per task where it is faster (``compile.winograd``; :mod:`dynatune.compiler.winograd_choice`):
each Winograd task is paired with the direct convolution that computes the same thing, the two are timed
side by side before the compile (real TVM, real measurements), and the compiled model keeps Winograd only
where it won, the other convolutions lowered direct with their measured kernel, matching ONNX Runtime."""

import json
import math
import os

import numpy as np
import pytest
from helpers import few_trials_session, make_winograd_cnn

from dynatune.compiler.compile import build, verify
from dynatune.compiler.execution import relax_vm
from dynatune.compiler.winograd_choice import REPORT, choose_winograd, chosen_lowering, paired_calls
from dynatune.model.extract import Lowering, extract_tasks, fuse
from dynatune.model.winograd import task_signature

ON = Lowering(winograd=True)
OFF = Lowering(winograd=False)
A, C = "48x48x16->48x48x32", "24x24x32->24x24x16"  # the model's two eligible convolutions


def _winograd_tasks(tasks) -> dict:
    return {task_signature(t.mod["main"]): t for t in tasks if task_signature(t.mod["main"]) is not None}


def test_each_winograd_task_names_its_convolution_and_no_other_task_does(winograd_cnn, cpu_target):
    tasks = extract_tasks(winograd_cnn, cpu_target, ON)
    assert set(_winograd_tasks(tasks)) == {A, C}
    assert all("winograd" in t.name for t in _winograd_tasks(tasks).values())
    assert not _winograd_tasks(extract_tasks(winograd_cnn, cpu_target, OFF))


def test_a_finished_runs_lowering_is_read_back_with_the_convolutions_its_choice_kept_direct(tmp_path):
    assert chosen_lowering(ON, str(tmp_path)) == ON  # no choice was made
    (tmp_path / REPORT).write_text(json.dumps({"winograd_direct": [A], "duels": []}))
    assert chosen_lowering(ON, str(tmp_path)) == Lowering(winograd=True, winograd_direct=(A,))
    assert chosen_lowering(OFF, str(tmp_path)) == OFF


def test_a_convolution_kept_direct_is_its_direct_task_and_the_model_still_matches(winograd_cnn, cpu_target):
    import tvm

    mixed = Lowering(winograd=True, winograd_direct=(A,))
    tasks, direct = extract_tasks(winograd_cnn, cpu_target, mixed), extract_tasks(winograd_cnn, cpu_target)
    assert set(_winograd_tasks(tasks)) == {C}
    # the convolution kept direct is the very function (same key) the model lowered without Winograd has
    assert len({t.key for t in tasks} - {t.key for t in direct}) == 1  # only C's Winograd task is new
    assert mixed.describe(cpu_target) != ON.describe(cpu_target)
    dev = tvm.cpu()
    check = verify(relax_vm(build(winograd_cnn, cpu_target, None, mixed), dev), winograd_cnn, dev, threads=2)
    assert check.ok and check.max_rel_err < 1e-5, check


@pytest.mark.slow  # 5-7 s: the fast tier stays under 3 minutes on a Zen 4 core
def test_winograd_tasks_pair_with_their_direct_twins_by_position(winograd_cnn, cpu_target):
    all_direct = Lowering(winograd=True, winograd_direct=(A, C))
    bound = winograd_cnn.bound_module()
    pairs = paired_calls(fuse(bound, cpu_target, ON), fuse(bound, cpu_target, all_direct))
    winograd = {t.name: t for t in extract_tasks(winograd_cnn, cpu_target, ON)}
    direct = {t.name: t for t in extract_tasks(winograd_cnn, cpu_target, all_direct)}
    twins = {w: d for w, d in pairs.items() if "winograd" in w}
    assert len(twins) == 2
    for w, d in twins.items():
        assert "winograd" not in d and "conv2d" in d
        # the same convolution with the same epilogue: the same output, and the same arguments but the weight
        assert len(direct[d].mod["main"].params) == len(winograd[w].mod["main"].params)
        assert _shape(winograd[w].mod["main"].params[-1]) == _shape(direct[d].mod["main"].params[-1])


def _shape(param) -> list[int]:
    return [int(x) for x in param.ty.shape]


@pytest.mark.slow
def test_the_compile_keeps_winograd_only_where_it_won(winograd_cnn, cpu_target, tmp_path):
    """Both Winograd tasks tuned for a few real trials, then timed against their direct twins and forced to
    keep Winograd for one convolution only (the default follows the times: the whole run's test below): the
    compiled model matches ONNX Runtime and the other convolution's kernel is the measured direct one."""
    import tvm

    tasks = extract_tasks(winograd_cnn, cpu_target, ON)
    session = few_trials_session(tasks, cpu_target, str(tmp_path / "work"))
    try:
        for t in _winograd_tasks(tasks).values():
            session.tune(t.index, trials=4)
        forced = choose_winograd(
            winograd_cnn, session, ON, session.compile_database(), keep=lambda duels: duels[0].signature == C
        )
    finally:
        session.close()
    assert {d.signature for d in forced.duels} == {A, C}
    for d in forced.duels:
        assert math.isfinite(d.winograd_s) and math.isfinite(d.direct_s) and d.weight == 1, d
    assert "Winograd kept for 1 of 2 convolutions" in forced.summary()

    assert forced.lowering.winograd_direct == (A,)
    direct_a = next(t for t in forced.tasks if t.key not in {x.key for x in tasks})
    assert forced.database.has_workload(
        direct_a.mod
    )  # its measured analytic kernel, which the compile applies
    assert direct_a.name in _scheduled_functions(winograd_cnn, cpu_target, forced)
    assert math.isfinite(forced.best_s[direct_a.key])
    report = json.load(open(forced.write(str(tmp_path / "report"))))
    assert report["winograd_direct"] == [A] and len(report["duels"]) == 2
    dev = tvm.cpu()
    with cpu_target:
        executable = build(winograd_cnn, cpu_target, forced.database, forced.lowering)
    check = verify(relax_vm(executable, dev), winograd_cnn, dev, threads=2)
    assert check.ok and check.max_rel_err < 1e-5, check
    assert os.path.exists(tmp_path / "report" / "winograd.json")


def _scheduled_functions(winograd_cnn, target, choice) -> set[str]:
    """The fused functions of the model lowered as ``choice`` says that its database gives a schedule."""
    import tvm
    from tvm.relax.transform import MetaScheduleApplyDatabase

    with target, choice.database, tvm.transform.PassContext(opt_level=3):
        mod = MetaScheduleApplyDatabase(enable_warning=False)(
            fuse(winograd_cnn.bound_module(), target, choice.lowering)
        )
    return {
        gv.name_hint
        for gv, f in mod.functions.items()
        if isinstance(f, tvm.tirx.PrimFunc)
        and f.attrs is not None
        and f.attrs.get("tirx.is_scheduled", False)
    }


@pytest.mark.slow
def test_a_run_with_winograd_reports_its_choice_and_compiles_what_it_chose(tmp_path):
    """The whole pipeline with ``compile.winograd`` (the default): the choice, timed cold, is written to the
    report, the compiled model is lowered as it says and matches ONNX Runtime, and the profile names the
    compiled model's kernels."""
    from dynatune.files import WorkDir
    from dynatune.run.config import load_config
    from dynatune.run.pipeline import run

    path = make_winograd_cnn(tmp_path, np.random.default_rng(1))
    overrides = ["slot_s=2", "warmup_trials=4", "search.trials_per_iter=4", "search.population_size=16"]
    overrides += ["measure.repeat=2", "measure.min_repeat_ms=2", "measure_every_s=0", "anchors=false"]
    overrides += ["compile.measure_untuned=false", "library.enabled=false"]
    overrides += ["compile.measure_onnxruntime=false"]  # the side-by-side timing is test_vs_onnxruntime's
    cfg = load_config(None, overrides, model=path, budget=6, work_dir=str(tmp_path / "work"))
    summary = run(cfg)
    wd = WorkDir(cfg.work_dir)
    report = json.load(open(os.path.join(wd.report_dir, "winograd.json")))
    assert {d["signature"] for d in report["duels"]} == {A, C} and report["timed_cold"]
    lost = sorted(d["signature"] for d in report["duels"] if not d["winograd_wins"])
    assert report["winograd_direct"] == lost
    assert summary.numerics_ok, summary
    profile = json.load(open(os.path.join(wd.report_dir, "profile.json")))
    convolutions = [k for k in profile["kernels"] if "conv2d" in k["name"]]
    assert convolutions and all(k["task"] is not None for k in convolutions), convolutions
    from bench.dispatch import measure

    # the model with its kernels emptied, lowered as the choice says, makes the artifact's calls (or exits)
    assert measure(cfg.work_dir, rounds=2, block_ms=10)["calls_a_run"] >= len(convolutions)
