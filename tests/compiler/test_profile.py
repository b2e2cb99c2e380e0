"""Final measurement: the compiled model timed side by side with ONNX Runtime, and its per-kernel profile
(real TVM, real ONNX Runtime, the tiny conv net)."""

import dataclasses
import json
import os

import numpy as np
import pytest
from helpers import no_wait_policy

from dynatune.compiler.compile import build, compile_and_verify, export
from dynatune.compiler.dispatch import empty_kernels_executable
from dynatune.compiler.execution import onnxruntime_outputs, relax_vm
from dynatune.compiler.fresh_timing import time_in_fresh_process
from dynatune.compiler.profile import make_vm, write_profile
from dynatune.compiler.timing import SideBySide, alternate, best_ratio, pooled, time_side_by_side
from dynatune.errors import DynatuneError
from dynatune.machine.roofline import Roofline
from dynatune.search.session import TuningSession

NO_WAIT = no_wait_policy()


def test_alternate_swaps_the_order_every_round():
    order = []
    a, b = alternate(lambda: order.append("a") or 1.0, lambda: order.append("b") or 2.0, rounds=3)
    assert a == [1.0] * 3 and b == [2.0] * 3
    assert order == ["a", "b", "a", "b", "b", "a", "a", "b"]  # one warm-up each, then a-b, b-a, a-b


@pytest.mark.slow  # 5-7 s: the fast tier stays under 3 minutes on a Zen 4 core
def test_the_reported_ratio_is_the_fastest_blocks_and_not_flattered_by_a_busy_neighbour():
    # a neighbour slowed two of ONNX Runtime's blocks: the rounds' median says 0.7, the fastest blocks 1.0
    t = SideBySide([1.0, 1.05, 1.0], [1.0, 1.6, 1.5])
    assert t.ratio_median == pytest.approx(1.0 / 1.5) and t.ratio == pytest.approx(1.0)
    assert t.ratio_min <= t.ratio <= t.ratio_max and t.per_process_ratios == [t.ratio]
    assert best_ratio([3.0, 2.0], [1.0, 4.0]) == pytest.approx(2.0)


def test_pooled_processes_take_each_sides_fastest_block_and_keep_the_worst_load():
    quiet = {"other_cores": 0.01, "steal_cores": 0.0, "cores": 2, "seconds": 1.0, "busy_cores": 0.01}
    busy = dict(quiet, other_cores=0.9, busy_cores=0.9)
    a = SideBySide([1.1, 1.2, 1.1], [1.0, 1.0, 1.0], load=quiet)  # fastest blocks: 1.1
    b = SideBySide([2.0, 2.0], [1.0, 1.0], load=busy, under_load=True, attempts=2)  # 2.0
    c = SideBySide([0.9, 0.9], [1.0, 1.0], load=quiet)  # 0.9
    p = pooled([a, b, c])
    assert p.process_ratios == pytest.approx([1.1, 2.0, 0.9]) and p.ratio == pytest.approx(0.9)
    assert len(p.tvm_ms) == 7 and p.ratio_min == pytest.approx(0.9) and p.ratio_max == pytest.approx(2.0)
    assert p.under_load and p.attempts == 4 and p.load_cores == pytest.approx(0.9)
    assert SideBySide.from_dict(p.as_dict()).ratio == pytest.approx(0.9)  # through the child's JSON
    assert pooled([a]) is a and a.ratio == pytest.approx(1.1)


@pytest.mark.slow  # compiles the model, two fresh timing processes
def test_side_by_side_with_onnxruntime(tiny_model, cpu_target, tmp_path):
    import tvm

    model, d = tiny_model, tmp_path
    dev = tvm.cpu()
    vm = relax_vm(build(model, cpu_target, None), dev)
    inputs = model.random_inputs(0)
    sess, _ = onnxruntime_outputs(model, inputs, threads=2)
    sbs = time_side_by_side(vm, sess, inputs, dev, rounds=3, block_ms=30)
    assert len(sbs.tvm_ms) == len(sbs.ort_ms) == len(sbs.ratios) == 3
    assert all(0 < x < 100 for x in sbs.tvm_ms + sbs.ort_ms)
    assert sbs.ratios == pytest.approx([t / o for t, o in zip(sbs.tvm_ms, sbs.ort_ms)])
    assert sbs.ratio_min <= sbs.ratio_median <= sbs.ratio_max and sbs.ratio_min <= sbs.ratio <= sbs.ratio_max
    assert sbs.tvm_median_ms == pytest.approx(float(np.median(sbs.tvm_ms)))
    assert sbs.as_dict()["rounds"] == 3

    rep = compile_and_verify(
        model,
        cpu_target,
        None,
        str(d / "model.so"),
        threads=2,
        repeat=3,
        measure_untuned=False,
        quiet=NO_WAIT,
        timing_processes=2,
    )
    # two fresh processes of 3 rounds each; the ratio takes each side's fastest block among them
    assert rep.numerics_ok and rep.side_by_side_rounds == 6 and len(rep.ratio_vs_onnxruntime_per_process) == 2
    assert min(rep.ratio_vs_onnxruntime_per_process) * 0.5 < rep.ratio_vs_onnxruntime
    assert rep.ratio_vs_onnxruntime_min <= rep.ratio_vs_onnxruntime <= rep.ratio_vs_onnxruntime_max
    assert rep.latency_ms > 0 and rep.onnxruntime_latency_ms > 0


def test_fresh_process_timing_and_a_bad_artifact_is_a_one_line_error(tiny_model, cpu_target, tmp_path):
    model = tiny_model
    path = export(build(model, cpu_target, None), str(tmp_path / "model.so"))
    sbs = time_in_fresh_process(path, model, threads=1, rounds=2, block_ms=20, quiet=NO_WAIT)
    assert len(sbs.tvm_ms) == len(sbs.ort_ms) == 2 and all(x > 0 for x in sbs.tvm_ms + sbs.ort_ms)
    with pytest.raises(DynatuneError, match="missing.so against ONNX Runtime failed") as err:
        time_in_fresh_process(str(tmp_path / "missing.so"), model, rounds=1)
    assert "\n" not in str(err.value)


@pytest.mark.slow  # 8-10 s: the fast tier stays under 3 minutes on a Zen 4 core
def test_profile_accounts_for_every_task_and_all_the_time(tiny_model, tiny_tasks, cpu_target, tmp_path):
    """Held against a final timing's fastest block far below the model's real time (a slow spell made on
    purpose), the profile is taken again and flagged; against one far above it, taken once."""
    model, tasks = tiny_model, tiny_tasks
    path = export(build(model, cpu_target, None), str(tmp_path / "model.so"))
    session = TuningSession(tasks, cpu_target, str(tmp_path / "work"))
    twice = dataclasses.replace(NO_WAIT, attempts=2, wait_s=0.0)
    try:
        session.measure_defaults()
        prof = write_profile(
            path,
            model,
            session,
            str(tmp_path / "report"),
            rounds=2,
            block_ms=30,
            task_block_ms=5,
            roofline=Roofline(peak_flops=100e9, bandwidth=1e10),
            quiet=twice,
            fastest_model_ms=1e-6,
            dispatch=empty_kernels_executable(model, cpu_target),
        )
        fair = write_profile(
            path,
            model,
            session,
            str(tmp_path / "fair"),
            rounds=1,
            block_ms=10,
            task_block_ms=2,
            quiet=twice,
            fastest_model_ms=1e3,
        )
    finally:
        session.close()
    assert prof["attempts"] == 2 and prof["slow_spell"] and prof["fastest_model_ms"] == 1e-6
    assert "Taken in a slow spell: in each of 2 attempts" in (tmp_path / "report" / "profile.md").read_text()
    assert fair["attempts"] == 1 and not fair["slow_spell"]
    # the same calls with empty kernels, timed in the same rounds: what the calls cost, measured
    assert 0 < prof["dispatch_ms"] < prof["model_ms"] and fair["dispatch_ms"] is None
    assert "every kernel emptied" in (tmp_path / "report" / "profile.md").read_text()
    assert "slow spell" not in (tmp_path / "fair" / "profile.md").read_text()
    # each convolution and the classifier are timed beside ONNX Runtime's op for the same shapes
    anchored = [k for k in prof["kernels"] if k.get("onnxruntime_op_ms")]
    assert {k["name"] for k in anchored} == {t.name for t in tasks if "conv" in t.name or "matmul" in t.name}
    for k in anchored:
        assert k["alone_vs_onnxruntime_op"] == pytest.approx(k["alone_ms"] / k["onnxruntime_op_ms"])
        assert 0 < k["pct_of_peak_alone"] < 100
        # judged against the roof that bounds it: the peak for a compute-bound kernel, else the bandwidth
        assert k["bound_by"] in ("compute", "memory") and k["bytes"] > 0
        if k["bound_by"] == "compute":
            assert k["pct_of_roof_alone"] == pytest.approx(k["pct_of_peak_alone"])
        else:
            assert k["pct_of_roof_alone"] == pytest.approx(100 * k["bytes"] / 1e10 / (k["alone_ms"] * 1e-3))
    # every task is a kernel the model calls, or listed as never called (the reshape the VM does as a view)
    called = {k["task"] for k in prof["kernels"] if k["task"] is not None}
    never = {t["task"] for t in prof["tasks_not_called"]}
    assert called | never == {t.index for t in tasks} and not called & never
    for k in prof["kernels"]:
        if k["task"] is not None:
            assert k["name"] == tasks[k["task"]].name and k["calls"] == tasks[k["task"]].weight
            assert k["name"] in prof["kernels_timed_by_call"] and k["alone_ms"] > 0
    assert not any(k["name"].startswith("vm.builtin.") for k in prof["kernels"] if k["task"] is not None)
    # the runs a user's loader makes (main_into, on outputs made once): nothing allocated
    assert not [k["name"] for k in prof["kernels"] if k["name"].startswith("vm.builtin.alloc")]
    # the model time splits into kernels, other calls and time between calls; the gap to the estimate too
    m = prof["model_ms"]
    assert m > 0 and prof["kernel_ms"] > 0
    assert prof["kernel_ms"] + prof["calls_without_task_ms"] + prof["between_calls_ms"] == pytest.approx(m)
    # ... and a single run's median (uninstrumented) into the same calls and the time between them
    run = prof["model_run_ms"]
    assert run > 0 and "A single run's median" in (tmp_path / "report" / "profile.md").read_text()
    parts = prof["kernel_ms"] + prof["calls_without_task_ms"] + prof["between_calls_run_ms"]
    assert parts == pytest.approx(run)
    assert sum(prof["gap"].values()) == pytest.approx(m - prof["estimate_ms"])
    timed = [k for k in prof["kernels"] + prof["tasks_not_called"] if k["task"] is not None]
    alone, cold = ({k["task"]: k[key] for k in timed} for key in ("alone_ms", "cold_ms"))
    assert all(v > 0 for v in cold.values())
    # the estimate adds up the kernels timed cold, as the model runs them; warm, as tuning times them
    assert prof["estimate_ms"] == pytest.approx(sum(t.weight * cold[t.index] for t in tasks))
    assert prof["warm_estimate_ms"] == pytest.approx(sum(t.weight * alone[t.index] for t in tasks))
    assert prof["estimate_over_model"] == pytest.approx(prof["estimate_ms"] / m)
    with open(tmp_path / "report" / "profile.json") as f:
        assert json.load(f)["model_ms"] == m
    md = (tmp_path / "report" / "profile.md").read_text()
    assert all(k["name"] in md for k in prof["kernels"]) and "between calls" in md
    assert "alone / ONNX Runtime op" in md and "% of peak alone" in md and "% of roof alone" in md
    assert "in model / cold" in md and "cold ms x weight" in md


def test_profile_vm_from_executable_in_memory(tiny_model, cpu_target):
    import tvm

    model = tiny_model
    vm = make_vm(build(model, cpu_target, None), tvm.cpu())
    x = tvm.runtime.tensor(model.random_inputs(0)[model.inputs[0].name], tvm.cpu())
    assert vm["main"](x).numpy().shape == (1, 10)


def test_run_anchors_time_onnx_runtimes_op_for_each_conv_and_matmul_once_per_work_dir(
    tiny_model, tiny_tasks, tmp_path, monkeypatch
):
    """What the headroom beliefs take as reachable floors: ONNX Runtime's kernel for each task with a weight,
    read back (not measured again) when the run resumes; a model ONNX Runtime cannot run has none. No
    profile's temporary directory is left behind, read or not."""
    import tempfile

    from dynatune.compiler.anchors import run_anchors
    from dynatune.files import WorkDir

    (tmp_path / "tmp").mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path / "tmp"))
    model, tasks = tiny_model, tiny_tasks
    anchors = run_anchors(model, tasks, str(tmp_path), threads=1)
    weighted = {t.index for t in tasks if "conv" in t.name or "matmul" in t.name}
    assert set(anchors) == weighted and all(0 < s < 0.1 for s in anchors.values())
    with open(WorkDir(str(tmp_path)).anchors) as f:
        saved = json.load(f)
    saved[str(min(weighted))] = 1.0
    with open(WorkDir(str(tmp_path)).anchors, "w") as f:
        json.dump(saved, f)
    assert run_anchors(None, tasks, str(tmp_path), threads=1)[min(weighted)] == 1.0  # read back
    with open(WorkDir(str(tmp_path)).anchors, "w") as f:
        f.write('{"0": 1')  # damaged: measured again
    assert set(run_anchors(model, tasks, str(tmp_path), threads=1)) == weighted
    (tmp_path / "other").mkdir()
    with pytest.warns(UserWarning, match="per-operator times are not available"):
        assert run_anchors(None, tasks, str(tmp_path / "other"), threads=1) == {}
    import gc

    gc.collect()  # the profile that failed to start is garbage now
    assert os.listdir(tmp_path / "tmp") == []


def test_a_warm_started_run_reads_its_sources_anchors_for_the_same_tasks_and_target(tiny_tasks, tmp_path):
    """The floors a stopped run's beliefs stood on are its retune's too: measured again, ONNX Runtime's times
    moved by 10-50 % between runs. Only a source with the same tasks, built for the same target, lends them;
    the newest such source first."""
    from dynatune.compiler.anchors import run_anchors, source_anchors
    from dynatune.files import WorkDir

    def source(name, keys, target, anchors):
        wd = WorkDir(str(tmp_path / name))
        os.makedirs(wd.path)
        with open(wd.tasks, "w") as f:
            json.dump([{"index": i, "name": f"t{i}", "key": k} for i, k in enumerate(keys)], f)
        with open(os.path.join(wd.path, "model.json"), "w") as f:
            json.dump({"target": target}, f)
        with open(wd.anchors, "w") as f:
            json.dump({"0": anchors}, f)
        return wd.path

    keys = [t.key for t in tiny_tasks]
    old = source("old", keys, "llvm -mcpu=a", 1e-4)
    new = source("new", keys, "llvm -mcpu=a", 2e-4)
    other_cpu = source("other-cpu", keys, "llvm -mcpu=b", 3e-4)
    other_tasks = source("other-tasks", keys[::-1], "llvm -mcpu=a", 4e-4)
    assert source_anchors(tiny_tasks, [old, new, other_cpu, other_tasks], "llvm -mcpu=a") == {0: 2e-4}
    assert source_anchors(tiny_tasks, [other_cpu, other_tasks], "llvm -mcpu=a") is None
    work = str(tmp_path / "retune")
    os.makedirs(work)
    assert run_anchors(None, tiny_tasks, work, threads=1, sources=[old], target="llvm -mcpu=a") == {0: 1e-4}
    assert run_anchors(None, tiny_tasks, work, threads=1) == {0: 1e-4}  # its own file from now on
