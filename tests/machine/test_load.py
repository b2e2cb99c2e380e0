"""The load probe sees other work on this process's cores, and a final timing against ONNX Runtime taken
while a busy process holds one core is retried, then flagged as taken under load, with the load figure; one
whose ONNX Runtime runs slower than its reference (alone, before tuning) is retried, then flagged as taken
in a slow spell."""

import os
import subprocess
import sys
import textwrap

import pytest

from dynatune.machine.load import Load, QuietPolicy, probe

BUSY_LOOP = textwrap.dedent(
    """
    import os, sys, time
    os.sched_setaffinity(0, {int(sys.argv[1])})
    end = time.monotonic() + float(sys.argv[2])
    while time.monotonic() < end:
        pass
    """
)


def busy_core(seconds: float) -> subprocess.Popen:
    """A plain Python busy loop, pinned to the last core this process may use, for ``seconds``."""
    core = max(os.sched_getaffinity(0))
    return subprocess.Popen([sys.executable, "-c", BUSY_LOOP, str(core), str(seconds)])


def test_the_probe_counts_a_busy_process_on_our_cores():
    p = busy_core(3.0)
    try:
        load = probe(1.0)
    finally:
        p.kill()
        p.wait()
    assert load.cores == len(os.sched_getaffinity(0))
    assert load.other_cores >= 0.7  # the busy loop's core (whatever else runs on the machine comes on top)
    assert QuietPolicy().busy(load, threads=load.cores)
    assert "cores busy besides the timing" in load.describe()
    assert Load.from_dict(load.as_dict()) == load


def test_busy_means_the_timing_lacks_cores():
    policy = QuietPolicy(tolerance_cores=0.25)
    two = dict(steal_cores=0.0, cores=2, seconds=1.0)
    assert not policy.busy(Load(other_cores=0.1, **two), threads=2)
    assert policy.busy(Load(other_cores=1.0, **two), threads=2)
    assert policy.busy(Load(other_cores=0.1, steal_cores=0.3, cores=2, seconds=1.0), threads=2)  # stolen
    many = dict(steal_cores=0.0, cores=16, seconds=1.0)
    assert not policy.busy(Load(other_cores=6.0, **many), threads=4)  # others use cores it does not need
    assert policy.busy(Load(other_cores=12.5, **many), threads=4)
    assert not policy.busy(None, threads=2)


@pytest.mark.slow  # compiles a small model, times it twice in fresh processes (~15 s)
def test_a_final_timing_on_a_busy_core_is_retried_then_flagged(tmp_path, tiny_onnx, cpu_target):
    from dynatune.compiler.compile import compile_and_verify
    from dynatune.model.importer import load_model

    model = load_model(tiny_onnx, {"x": (1, 3, 16, 16)})
    quiet = QuietPolicy(probe_s=0.3, wait_s=0.2, attempts=2)
    busy = busy_core(120.0)
    try:
        report = compile_and_verify(
            model,
            cpu_target,
            None,
            str(tmp_path / "model.so"),
            threads=len(os.sched_getaffinity(0)),
            measure_untuned=False,
            repeat=3,
            quiet=quiet,
            timing_processes=1,
        )
    finally:
        busy.kill()
        busy.wait()
    assert report.numerics_ok and report.ratio_vs_onnxruntime > 0
    assert report.timing_under_load and report.timing_attempts == 2
    assert report.timing_load_cores >= 0.7


def test_slow_means_onnxruntime_over_its_reference():
    policy = QuietPolicy(slow_onnxruntime=1.15)
    assert not policy.slow(1.10, reference_ms=1.0) and policy.slow(1.20, reference_ms=1.0)
    assert not policy.slow(5.0, reference_ms=None)  # no reference: nothing to hold it against
    assert not QuietPolicy(slow_onnxruntime=0).slow(5.0, reference_ms=1.0)  # the check turned off


def test_a_slow_profile_means_its_model_over_the_final_timings_fastest_block():
    policy = QuietPolicy(slow_profile=1.15, slow_onnxruntime=0)  # each check has its own threshold
    assert not policy.profile_slow(1.10, fastest_ms=1.0) and policy.profile_slow(1.20, fastest_ms=1.0)
    assert not policy.profile_slow(5.0, fastest_ms=None)  # no final timing: nothing to hold it against
    assert not QuietPolicy(slow_profile=0).profile_slow(5.0, fastest_ms=1.0)  # the check turned off


@pytest.mark.slow  # a small model; ONNX Runtime alone, then three timings, in fresh processes (~12 s)
def test_a_final_timing_slower_than_its_reference_is_retried_then_flagged(tmp_path, tiny_onnx, cpu_target):
    """A slow spell is made here by holding the timing against a reference a third of ONNX Runtime's real
    time alone: every process reads slow, and one more is timed. Against a reference far above it, the one
    process asked for is kept."""
    from dynatune.compiler.compile import compile_and_verify
    from dynatune.compiler.fresh_timing import onnxruntime_reference_ms
    from dynatune.model.importer import load_model
    from dynatune.run.report import unfair_timing_note
    from dynatune.run.summary import RunSummary
    from dynatune.runtime import read_metadata

    model = load_model(tiny_onnx, {"x": (1, 3, 16, 16)})
    calm = dict(tolerance_cores=float(os.cpu_count() or 1), probe_s=0.2, wait_s=0.2)  # any load is quiet
    threads = len(os.sched_getaffinity(0))
    alone = onnxruntime_reference_ms(model, threads=threads, rounds=3, quiet=QuietPolicy(**calm), processes=2)
    assert 0 < alone < 50  # ms: a 16x16 conv net
    reports = {}
    for name, reference in (("slow", alone / 3), ("fair", alone * 100)):
        reports[name] = compile_and_verify(
            model,
            cpu_target,
            None,
            str(tmp_path / f"{name}.so"),
            threads=threads,
            measure_untuned=False,
            repeat=3,
            quiet=QuietPolicy(attempts=2, **calm),
            timing_processes=1,
            onnxruntime_reference_ms=reference,
        )
    slow, fair = reports["slow"], reports["fair"]
    assert slow.timing_onnxruntime_slow and slow.timing_attempts == 2 and not slow.timing_under_load
    assert len(slow.ratio_vs_onnxruntime_per_process) == 2  # the process asked for, and one more
    assert slow.onnxruntime_reference_ms == pytest.approx(alone / 3)
    assert not fair.timing_onnxruntime_slow and fair.timing_attempts == 1
    assert len(fair.ratio_vs_onnxruntime_per_process) == 1
    measured = read_metadata(slow.artifact)["measured"]
    assert measured["onnxruntime_slow"] and measured["onnxruntime_reference_ms"] == pytest.approx(alone / 3)
    summary = RunSummary(
        model="tiny", timing_onnxruntime_slow=True, onnxruntime_reference_ms=alone / 3, timing_attempts=2
    )
    note = unfair_timing_note(summary)
    assert "slow spell" in note and "not a fair ratio, no parity" in note and ", 2 tries" in note
    assert unfair_timing_note(RunSummary(model="tiny", timing_attempts=1)) == ""
