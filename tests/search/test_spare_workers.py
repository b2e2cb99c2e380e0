"""A closed session's workers, kept for the next session of the same process (dynatune.search.spare_workers).

The test suite turns spares on for its own processes (tests/conftest.py); a tuning run does not."""

import subprocess
import sys

import pytest

from dynatune.search import spare_workers


@pytest.fixture
def spares(monkeypatch):
    """The module's state for this test alone: no spares kept, on unless the test turns it off."""
    monkeypatch.setattr(spare_workers, "_spares", {})
    monkeypatch.setattr(spare_workers, "_enabled", True)
    return spare_workers


def test_one_spare_per_kind_taken_once_and_only_in_the_same_worker_environment(spares, monkeypatch):
    stopped, here = [], spares.environment()
    assert spares.keep("runner worker", "w1", stopped.append, here)
    assert not spares.keep("runner worker", "w2", stopped.append, here)  # one of its kind is kept: w2 stops
    assert spares.take("builder pool") is None
    with monkeypatch.context() as env:
        env.setenv("TVM_NUM_THREADS", "7")  # a worker started before this would not have it
        assert spares.take("runner worker") is None
        # a worker started here, kept after the setting is gone, is for a session that sets it again
        assert spares.keep("runner worker", "w7", stopped.append, spares.environment())
    assert spares.take("runner worker") == "w1" and spares.take("runner worker") is None
    with monkeypatch.context() as env:
        env.setenv("TVM_NUM_THREADS", "7")
        assert spares.take("runner worker") == "w7"
    assert spares.keep("builder pool", "p1", stopped.append, here)
    spares.stop_spares()  # at exit
    assert stopped == ["p1"] and spares.take("builder pool") is None


def test_off_unless_a_process_turns_it_on(spares, monkeypatch):
    monkeypatch.setattr(spare_workers, "_enabled", False)
    assert not spares.keep("runner worker", "w", print, spares.environment())
    assert spares.take("runner worker") is None
    out = subprocess.run(
        [sys.executable, "-c", "from dynatune.search import spare_workers as s; print(s._enabled)"],
        capture_output=True,
        text=True,
        check=True,
    )
    assert out.stdout.strip() == "False"  # a run's process (the CLI never turns it on)


@pytest.mark.slow  # starts a runner worker (a subprocess)
def test_the_next_runner_takes_the_closed_ones_worker(spares, cpu_target):
    from dynatune.search.measure import MeasureConfig, make_runner

    cfg = MeasureConfig(adaptive=False, repeat=2, min_repeat_ms=1)
    first = make_runner(cfg, cpu_target)
    first.warm_up()
    pid = first.inner.worker._proc.pid
    first.close()
    second = make_runner(cfg, cpu_target)
    try:
        assert second.inner.worker._proc.pid == pid and second.inner.worker.is_alive()
    finally:
        spares.stop_spares()
        second.close()  # kept again, then stopped below
        spares.stop_spares()
    assert not second.inner.worker.is_alive()
