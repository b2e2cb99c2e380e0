"""A round counts once its line is in rounds.jsonl: a round killed, or failed, after its task's state was
saved but before its line was written leaves the belief model no history point of a round that never was."""

import json

import pytest

from dynatune.files import WorkDir
from dynatune.run.tuner import Tuner
from dynatune.search.measure import MeasureConfig
from dynatune.search.session import SearchConfig, TuningSession

pytestmark = pytest.mark.slow  # real tuning

SMALL = SearchConfig(trials_per_iter=4, population_size=32, init_min_unmeasured=16, genetic_num_iters=1)
FAST = MeasureConfig(repeat=3, min_repeat_ms=5)


class Killed(BaseException):
    """Stands for the kill: raised where the round's line would be written."""


def _tuner(tasks, target, work) -> Tuner:
    session = TuningSession(tasks, target, str(work), search=SMALL, measure=FAST)
    tuner = Tuner(session, "dynatune", budget_s=600.0, slot_s=1.0, warmup_share=1.0)
    tuner.prepare()
    return tuner


def _progress(work) -> dict:
    """session.json's progress per task: [history points, seconds, trials]."""
    tasks = json.load(open(WorkDir(str(work)).session))["tasks"]
    return {key: [len(st["history"]), st["seconds"], st["trials"]] for key, st in tasks.items()}


def _lose_the_round_line(tuner, monkeypatch, undo: bool):
    def append(line):
        raise Killed() if not undo else OSError("No space left on device")

    monkeypatch.setattr(tuner._writer, "append", append)
    if not undo:  # a kill runs no handler: only what is on disk is left
        monkeypatch.setattr(tuner, "_undo_round", lambda flight: None)


def test_a_round_killed_before_its_line_is_run_again_from_the_same_state(
    tiny_tasks, cpu_target, tmp_path, monkeypatch
):
    tuner = _tuner(tiny_tasks, cpu_target, tmp_path)
    tuner.step()
    before = _progress(tmp_path)
    _lose_the_round_line(tuner, monkeypatch, undo=False)
    with pytest.raises(Killed):
        tuner.step()
    torn = _progress(tmp_path)
    assert sum(n for n, _, _ in torn.values()) == sum(n for n, _, _ in before.values()) + 1  # the torn state
    tuner.session.close()

    resumed = _tuner(tiny_tasks, cpu_target, tmp_path)
    try:
        assert resumed.rounds_done == 1
        assert _progress(tmp_path) == before  # the unrecorded round's point, seconds and trials are gone
        resumed.step()
        rounds = resumed.rounds
        assert [r["round"] for r in rounds] == [0, 1]
        for t in tiny_tasks:  # one history point per recorded round of the task
            assert len(resumed.session.state(t.index).history) == sum(r["task"] == t.index for r in rounds)
        assert "in_flight" not in json.load(open(WorkDir(str(tmp_path)).run_state))
    finally:
        resumed.close()


def test_a_round_that_fails_before_its_line_leaves_the_run_as_before_it(
    tiny_tasks, cpu_target, tmp_path, monkeypatch
):
    tuner = _tuner(tiny_tasks, cpu_target, tmp_path)
    try:
        tuner.step()
        before = (_progress(tmp_path), tuner.rounds_done, tuner.elapsed_s, tuner.scheduler.state_dict())
        with monkeypatch.context() as m:
            _lose_the_round_line(tuner, m, undo=True)
            with pytest.raises(OSError, match="No space"):
                tuner.step()
        after = (_progress(tmp_path), tuner.rounds_done, tuner.elapsed_s, tuner.scheduler.state_dict())
        assert after == before
        rec = tuner.step()  # the same round, again
        assert rec.round == 1 and [r["round"] for r in tuner.rounds] == [0, 1]
        assert len(tuner.session.state(rec.task).history) == sum(r["task"] == rec.task for r in tuner.rounds)
    finally:
        tuner.close()
