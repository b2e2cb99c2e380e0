"""What the estimate misses: the residual (model minus its tasks alone, timed in the same rounds), where
runs report it, and the task timers that a periodic measurement keeps between measurements."""

from types import SimpleNamespace

import pytest

from dynatune.compiler.periodic import ModelMeasurement, latest_residual_ms
from dynatune.compiler.residual import TaskTimers, measure_residual
from dynatune.run.pipeline import residual_fields
from dynatune.run.tuner import RoundRecord


def _blocks(values):
    it = iter(values)
    return lambda: next(it)


def test_residual_is_the_model_median_minus_weighted_task_medians():
    tasks = [SimpleNamespace(index=0, weight=2), SimpleNamespace(index=1, weight=1)]
    timers = {0: _blocks([1.0, 3.0, 2.0]), 1: _blocks([0.5, 0.5, 0.7])}
    r = measure_residual(_blocks([9.0, 7.0, 8.0]), timers, tasks, rounds=3)
    assert r.model_ms == 8.0 and r.kernels_alone_ms == pytest.approx(2 * 2.0 + 0.5)
    assert r.residual_ms == pytest.approx(8.0 - 4.5)
    assert r.as_dict() == {
        "same_time_model_ms": 8.0,
        "kernels_alone_ms": r.kernels_alone_ms,
        "residual_ms": r.residual_ms,
    }


def test_the_latest_residual_counts_in_rounds_measurements_and_the_summary():
    assert latest_residual_ms([]) is None
    points = [{"residual_ms": 1.5}, {"residual_ms": None}, {}]
    assert latest_residual_ms(points) == 1.5 and latest_residual_ms(points + [{"residual_ms": -0.2}]) == -0.2
    rec = RoundRecord(0, 0, "t", {}, {}, estimated_latency_s=0.010, elapsed_s=1, decision_s=0, wall_s=1)
    assert rec.estimated_model_latency_s is None and "residual_s" in rec.line()
    rec.residual_s = 0.002
    assert rec.estimated_model_latency_s == pytest.approx(0.012)
    m = ModelMeasurement(0, 60, 12.0, 4.0, 3.0, estimated_ms=10.0)
    assert m.estimated_model_ms is None
    m.residual_ms = 1.0
    assert m.estimated_model_ms == 11.0

    tuner = SimpleNamespace(residual_s=lambda: 0.003)
    assert residual_fields(10.0, tuner, {"gap_ms": 2.0}) == {
        "residual_ms": 2.0,
        "residual_source": "final profile",
        "estimated_model_latency_ms": 12.0,
    }
    assert residual_fields(10.0, tuner, None)["estimated_model_latency_ms"] == pytest.approx(13.0)
    # a profile taken in a slow spell (its model slower than the final timing's): the periodic residual
    slow = residual_fields(10.0, tuner, {"gap_ms": 5.0, "slow_spell": True})
    assert slow["residual_source"] == "periodic measurement" and slow["residual_ms"] == pytest.approx(3.0)
    assert residual_fields(10.0, SimpleNamespace(residual_s=lambda: None), None)["residual_ms"] is None


@pytest.mark.slow
def test_task_timers_compile_a_task_again_only_when_its_best_schedule_changes(tmp_path, cpu_target):
    import tvm
    from helpers import make_tiny_onnx

    from dynatune.model.extract import extract_tasks
    from dynatune.model.importer import load_model

    tasks = extract_tasks(load_model(make_tiny_onnx(str(tmp_path / "tiny.onnx"), batch=1)), cpu_target)
    timers = TaskTimers(cpu_target, tvm.cpu(), block_ms=2)
    first = timers.timers(tasks, None)
    assert set(first) == {t.index for t in tasks} and timers.compiled == len(tasks)
    assert all(f() > 0 for f in first.values())
    again = timers.timers(tasks, None)  # same (default) schedules: nothing compiled, the same timers
    assert timers.compiled == len(tasks) and all(again[i] is first[i] for i in first)
    cold = timers.timers(tasks, None, cold=True)  # the same kernels, timed cold: still nothing compiled
    assert timers.compiled == len(tasks) and all(f() > 0 for f in cold.values())
