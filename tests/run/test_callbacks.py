"""A callback that raises is logged by name and round, and the others still see every event."""

import logging

from dynatune.compiler.periodic import ModelMeasurement
from dynatune.run.callbacks import CallbackList, RunCallback
from dynatune.run.tuner import RoundRecord


class Recorder(RunCallback):
    def __init__(self):
        self.events = []

    def on_round(self, record):
        self.events.append(("round", record.round))

    def on_measurement(self, m):
        self.events.append(("measurement", m.round))

    def on_round_failed(self, error):
        self.events.append(("round_failed", error))


class BrokenObserver(RunCallback):
    def on_round(self, record):
        raise RuntimeError("dashboard unreachable")

    def on_measurement(self, m):
        raise ValueError("bad number")


def _record(n: int) -> RoundRecord:
    return RoundRecord(n, 0, "conv", {}, {}, estimated_latency_s=0.01, elapsed_s=n, decision_s=0, wall_s=1)


def test_raising_callback_is_logged_and_the_others_run(caplog):
    before, after = Recorder(), Recorder()
    cbs = CallbackList([before, BrokenObserver(), after])
    with caplog.at_level(logging.WARNING, logger="dynatune.run.callbacks"):
        cbs.on_round(_record(3))
        cbs.on_round(_record(4))
        m = ModelMeasurement(round=4, elapsed_s=4.0, latency_ms=1.0, onnxruntime_ms=2.0, ratio=0.5)
        cbs.on_measurement(m)
        cbs.on_round_failed("boom")
    expected = [("round", 3), ("round", 4), ("measurement", 4), ("round_failed", "boom")]
    assert before.events == expected and after.events == expected  # the run (and its other observers) went on
    warnings = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 3
    messages = [r.getMessage() for r in warnings]
    assert all("BrokenObserver" in m for m in messages)
    assert "on_round at round 3" in messages[0] and "dashboard unreachable" in messages[0]
    assert "on_round at round 4" in messages[1]
    assert "on_measurement at round 4" in messages[2] and "ValueError: bad number" in messages[2]
