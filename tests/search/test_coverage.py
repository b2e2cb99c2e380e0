"""The coverage pass: every never-tuned task gets one first batch, heaviest first, within its share of the
budget; the scheduler decides after it; tasks a small budget cannot cover are named."""

import pytest

from dynatune.run.tuner import Tuner
from dynatune.search.measure import MeasureConfig
from dynatune.search.session import SearchConfig, TuningSession

pytestmark = pytest.mark.slow  # real tuning

SMALL = SearchConfig(trials_per_iter=4, population_size=32, init_min_unmeasured=16, genetic_num_iters=1)
FAST = MeasureConfig(repeat=3, min_repeat_ms=5)


def _tuner(tasks, target, work, share, budget=600.0, scheduler="dynatune", slot_s=2.0):
    session = TuningSession(tasks, target, str(work), search=SMALL, measure=FAST)
    tuner = Tuner(session, scheduler, budget_s=budget, slot_s=slot_s, warmup_share=share)
    tuner.prepare()
    return tuner


def test_every_task_gets_one_first_batch_heaviest_first_then_the_scheduler(tiny_tasks, cpu_target, tmp_path):
    tuner = _tuner(tiny_tasks, cpu_target, tmp_path, share=1.0)
    try:
        weighted = {t.index: t.weight * tuner.session.state(t.index).default_s for t in tiny_tasks}
        recs = [tuner.step() for _ in range(len(tiny_tasks) + 1)]
        first = recs[: len(tiny_tasks)]
        assert [r.phase for r in first] == ["warmup"] * len(tiny_tasks)
        assert sorted(r.task for r in first) == sorted(weighted)  # each task once
        order = [weighted[r.task] for r in first]
        assert order == sorted(order, reverse=True)  # heaviest untuned weighted latency first
        # a first batch, not a slot: trials_per_iter trials (a task whose search space yields fewer per batch
        # gets a few more small batches to make them up, or is exhausted)
        assert all(r.result["trials"] >= SMALL.trials_per_iter or r.result["exhausted"] for r in first)
        assert all(r.result["trials"] < 4 * SMALL.trials_per_iter for r in first), [r.result for r in first]
        assert recs[-1].phase == "scheduler"
        assert tuner.never_tuned() == []
        assert [r["phase"] for r in tuner.rounds] == [r.phase for r in recs]  # recorded for resume
    finally:
        tuner.close()


def test_a_small_share_stops_the_pass_and_names_the_tasks_never_tuned(tiny_tasks, cpu_target, tmp_path):
    tuner = _tuner(tiny_tasks, cpu_target, tmp_path, share=1e-6)
    try:
        assert tuner.step().phase == "warmup"  # the pass starts (nothing spent yet) ...
        assert tuner.warmup_choice() is None  # ... and its share is spent after one batch
        assert len(tuner.never_tuned()) == len(tiny_tasks) - 1
    finally:
        tuner.close()


def test_a_task_with_an_earlier_runs_schedule_is_not_named_never_tuned(tiny_tasks, cpu_target, tmp_path):
    first = _tuner(tiny_tasks, cpu_target, tmp_path / "first", share=1e-6)
    try:
        tuned = tiny_tasks[first.step().task]  # one task's first batch, then the pass's share is spent
        db = first.session.db
    finally:
        first.close()
    again = _tuner(tiny_tasks, cpu_target, tmp_path / "again", share=1e-6)
    try:
        assert again.session.import_records(db, {tuned.key}) > 0  # as the library or a warm start seeds it
        assert len(again.never_tuned()) == len(tiny_tasks) - 1 and tuned.name not in again.never_tuned()
    finally:
        again.close()


def test_share_zero_is_the_scheduler_alone(tiny_tasks, cpu_target, tmp_path):
    tuner = _tuner(tiny_tasks, cpu_target, tmp_path, share=0.0)
    try:
        assert tuner.warmup_choice() is None
    finally:
        tuner.close()


def test_a_task_the_pass_did_not_reach_gets_a_first_batch_when_the_scheduler_picks_it(
    tiny_tasks, cpu_target, tmp_path
):
    """The pass's share runs out after one task; then each never-tuned task the scheduler picks gets one
    first batch, and a task picked again gets a whole slot; the scheduler's state moves on every round."""
    tuner = _tuner(tiny_tasks, cpu_target, tmp_path, share=1e-4, scheduler="round_robin", slot_s=3.0)
    try:
        assert tuner.step().phase == "warmup"
        batches = {}
        for _ in range(len(tiny_tasks) + 1):
            state = dict(tuner.scheduler.state_dict())
            tuned_before = bool(tuner.session.state(tuner.scheduler.choose(tuner.context())).history)
            rec = tuner.step()
            assert rec.phase == "scheduler" and tuner.scheduler.state_dict() != state
            batches.setdefault(tuned_before, []).append((rec.result["trials"], rec.result["wall_s"]))
        assert batches[False] and all(
            n <= SMALL.trials_per_iter for n, _ in batches[False]
        )  # one first batch
        # whole slots: batches until the slot is spent (one batch only when it took more than 2/3 of the slot:
        # the next would overrun it by more than half a batch; a busy core makes batches that slow)
        assert batches[True] and all(
            n > SMALL.trials_per_iter or 1.5 * wall > 3.0 for n, wall in batches[True]
        )
    finally:
        tuner.close()
