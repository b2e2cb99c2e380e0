"""Knowing when to stop: the rule on hand-made beliefs, the tuner's stop and its resume on a session whose
tasks converge on known curves, and one real run that stops with its reason in the summary and MLflow."""

import copy
import json
import math
from types import SimpleNamespace as NS

import numpy as np
import pytest
from converging_session import SLOT, ConvergingSession

from dynatune.beliefs import HeadroomBeliefs
from dynatune.beliefs.base import OWN
from dynatune.files import WorkDir
from dynatune.run.stopping import BeliefStopping
from dynatune.run.tuner import Tuner
from dynatune.schedulers.base import RoundContext, TaskView
from dynatune.search.session_state import TaskState


# -- the rule, on hand-made contexts ----------------------------------------------------------------------
def task(i, best, bound, weight=1, slots=6, default=None):
    """A compute-bound task tuned flat at ``best`` for ``slots`` slots (after one jump), bound ``bound``."""
    hist = [(SLOT, 8, 2 * best)] + [(SLOT * k, 8 * k, best) for k in range(2, slots + 1)]
    return TaskView(
        i, f"fused_conv2d{i}_add", f"k{i}", weight, bound * 1e12, default or 10 * best, hist, False, bound
    )


def ctx(tasks, elapsed=100.0, budget=900.0):
    return RoundContext(tasks, 10, SLOT, elapsed, budget)


def test_the_rule_waits_for_every_first_batch_unless_those_left_could_not_matter():
    rule = BeliefStopping(min_gain_share=0.01, patience=1)
    tuned = task(0, 1e-3, 0.99e-3)  # at its roof: nothing to gain
    waiting = TaskView(1, "fused_conv2d1_add", "k1", 1, 1e9, 5e-4)  # never tuned, 33 % of the model
    check = rule.check(ctx([tuned, waiting]))
    assert (
        not check.stop and not check.eligible and check.reason == "1 task(s) still wait for their first batch"
    )
    tiny = TaskView(1, "transpose", "k1", 1, 1e3, 1e-6)  # never tuned, but all of it is below the threshold
    assert rule.check(ctx([tuned, tiny])).stop
    few = [TaskView(i, f"transpose{i}", f"k{i}", 1, 1e3, 3e-6) for i in range(1, 4)]  # 0.9 % together
    assert rule.check(ctx([tuned, *few])).stop
    many = [TaskView(i, f"transpose{i}", f"k{i}", 1, 1e3, 5e-6) for i in range(1, 5)]  # 2 % together
    assert not rule.check(ctx([tuned, *many])).eligible


def test_the_rule_stops_after_patience_checks_in_a_row_and_a_gain_starts_the_count_again():
    converged = [task(0, 1e-3, 0.99e-3), task(1, 4e-4, 0.385e-3)]  # both at their roofs
    rule = BeliefStopping(min_gain_share=0.01, patience=3)
    checks = [rule.check(ctx(converged)) for _ in range(2)]
    assert [c.streak for c in checks] == [1, 2] and not any(c.stop for c in checks)
    assert checks[1].reason.endswith("2 of 3 checks in a row")
    hopeful = [task(0, 1e-3, 0.99e-3), task(1, 4e-4, 0.05e-3)]  # a slot's result: task 1 is far from its roof
    check = rule.check(ctx(hopeful))
    assert not check.stop and check.streak == 0 and "above 1.00% of the model's" in check.reason
    assert check.gain_s > check.threshold_s and check.task == "fused_conv2d1_add"
    checks = [rule.check(ctx(converged)) for _ in range(3)]
    assert [c.stop for c in checks] == [False, False, True]
    assert checks[-1].reason.startswith("the rest of the budget (400.0 slots) could still buy at most 0 ms")
    assert checks[-1].reason.endswith("below 1.00% of the model's 1.4 ms (0.014 ms) at 3 checks in a row")
    state = rule.state_dict()
    again = BeliefStopping(patience=3)
    again.load_state_dict(json.loads(json.dumps(state)))
    assert again.streak == 3
    again.reset()
    assert again.streak == 0


def test_a_shorter_rest_buys_less_and_the_rule_stops_sooner():
    tasks = [task(0, 1e-3, 0.5e-3, slots=12), task(1, 1e-3, 0.6e-3, slots=12)]
    rule = BeliefStopping(min_gain_share=0.01, patience=1, beliefs=HeadroomBeliefs())
    early, late = rule.check(ctx(tasks, elapsed=100)), rule.check(ctx(tasks, elapsed=896))
    assert late.gain_s < early.gain_s and late.slots_left == pytest.approx(2.0)
    assert not early.stop and late.stop


def test_the_end_of_the_budget_is_no_stop():
    """With less than a slot left, the rest buys nothing, and that says nothing of the model: the budget ends
    the run (a 300 s mnasnet0_5 run said it had stopped early at 302 s, with nothing saved)."""
    converged = [task(0, 1e-3, 0.99e-3), task(1, 4e-4, 0.385e-3)]
    rule = BeliefStopping(min_gain_share=0.01, patience=1)
    check = rule.check(ctx(converged, elapsed=899.0))
    assert not check.stop and check.reason == "less than a slot of the budget is left" and check.streak == 0
    assert rule.check(ctx(converged, elapsed=100.0)).stop


def test_many_small_tasks_together_keep_a_run_going():
    """Each task alone could gain less than the share, all of them together more: the rest is spent where it
    gains most, so the run goes on (a rule that looked at one task at a time would stop it)."""
    tasks = [task(i, 1e-4, 0.3e-4) for i in range(30)]
    rule = BeliefStopping(min_gain_share=0.01, patience=1)
    check = rule.check(ctx(tasks))
    assert check.task_gain_s < check.threshold_s < check.gain_s and not check.stop


# -- the tuner: a stop, its record, and a resume ---------------------------------------------------------
def tuner_on(session, budget, rule="on", warmup_share=0.5, share=0.01):
    stopping = BeliefStopping(min_gain_share=share, patience=2) if rule == "on" else None
    tuner = Tuner(
        session, "dynatune", budget_s=budget, slot_s=SLOT, warmup_share=warmup_share, stopping=stopping
    )
    tuner.bounds = dict(enumerate(session.bounds))  # (a real run reads them from the roofline)
    tuner.prepare()
    return tuner


def run_state(work):
    return json.load(open(WorkDir(str(work)).run_state))


def test_a_converged_run_stops_before_its_budget_and_says_why(tmp_path):
    session = ConvergingSession(tmp_path)
    tuner = tuner_on(session, budget=600)
    tuner.run_rounds()
    tuner.close()
    checks = [r["stop_check"] for r in tuner.rounds]
    assert all(not c["eligible"] for c in checks[:2]) and checks[2]["eligible"]  # the coverage pass first
    assert [c["streak"] for c in checks[-2:]] == [1, 2] and checks[-1]["stop"]  # two checks in a row
    assert tuner.stopped and tuner.done() and tuner.elapsed_s < 60
    end = tuner.ending()
    assert end.stopped_early and end.saved_s == pytest.approx(600 - tuner.elapsed_s)
    assert end.reason.startswith(
        f"stopped at {tuner.elapsed_s:.0f} s of the 600 s budget: the rest of the budget"
    )
    stop = run_state(tmp_path)["stop"]
    assert (
        stop["budget_s"] == 600
        and stop["round"] == tuner.rounds[-1]["round"]
        and stop["tasks"] == tuner.task_set
    )


def test_with_stopping_off_a_run_spends_its_budget(tmp_path):
    session = ConvergingSession(tmp_path)
    tuner = tuner_on(session, budget=40, rule=None)
    tuner.run_rounds()
    tuner.close()
    assert tuner.elapsed_s == pytest.approx(40) and not tuner.stopped
    assert all(r["stop_check"] is None for r in tuner.rounds)
    end = tuner.ending()
    assert (
        not end.stopped_early
        and end.saved_s == 0
        and end.reason == "tuned for the whole budget (40 s): stopping is off"
    )


def test_a_resumed_stopped_run_goes_on_only_with_more_budget_or_other_settings(tmp_path):
    session = ConvergingSession(tmp_path)
    first = tuner_on(session, budget=600)
    first.run_rounds()
    first.close()
    rounds, stopped_at = len(first.rounds), first.elapsed_s
    same = tuner_on(session, budget=600)  # the same budget and tasks: the stop holds, nothing is tuned
    assert same.done() and same.stopped and not same.run_rounds() and len(same.rounds) == rounds
    assert same.ending().reason == first.ending().reason
    same.close()
    stricter = tuner_on(session, budget=600, share=0.001)  # another rule: it looks again, and stops again
    assert (
        not stricter.done() and stricter.run_state["reopened_stop"]["why"] == "the stopping settings changed"
    )
    stricter.run_rounds()
    stricter.close()
    assert stricter.stopped
    rounds = len(stricter.rounds)
    more = tuner_on(session, budget=900, share=0.001)  # more budget: a fresh look, at least one round, a stop
    assert not more.done() and more.run_state["reopened_stop"]["why"] == "the budget rose from 600 s to 900 s"
    more.run_rounds()
    more.close()
    assert len(more.rounds) >= rounds + 2 and more.stopped and more.elapsed_s > stopped_at
    state = run_state(tmp_path)
    assert [s["budget_s"] for s in state["earlier_stops"]] == [600, 600] and state["stop"]["budget_s"] == 900
    off = tuner_on(session, budget=900, rule=None)  # stopping off: the budget is spent
    off.run_rounds()
    off.close()
    assert off.elapsed_s == pytest.approx(900) and not off.stopped
    assert run_state(tmp_path)["earlier_stops"][-1]["reopened"] == "stopping is off"


def test_a_stop_recorded_only_with_its_round_holds_after_a_kill(tmp_path):
    """Killed after the round's line, before run.json: the round's own check holds the stop."""
    session = ConvergingSession(tmp_path)
    first = tuner_on(session, budget=600)
    first.run_rounds()
    first.close()
    state = run_state(tmp_path)
    state["stop"] = None
    json.dump(state, open(WorkDir(str(tmp_path)).run_state, "w"))
    again = tuner_on(session, budget=600)
    assert again.done() and again.ending().stopped_early
    again.close()


def test_new_tasks_reopen_a_stop(tmp_path):
    session = ConvergingSession(tmp_path)
    first = tuner_on(session, budget=600)
    first.run_rounds()
    first.close()
    session.tasks[2].key = "key2-changed"  # the model's tasks changed (another lowering, say)
    session.states["key2-changed"] = TaskState(default_s=1e-3)
    again = tuner_on(session, budget=600)
    assert not again.done() and again.run_state["reopened_stop"]["why"] == "the model's tasks changed"
    again.run_rounds()
    again.close()
    assert session.tuned[-3:].count(2) >= 1  # the new task got its first batch before the next stop
    assert again.stopped


class RetuneSession(ConvergingSession):
    """A retune of ``first``'s model in a fresh work dir, warm-started from it: every task starts from its
    history and best there, and that best is measured again here (``failing``: tasks whose best no longer
    runs)."""

    def __init__(self, work_dir, first, failing=()):
        super().__init__(work_dir)
        self.states = {k: copy.deepcopy(st) for k, st in first.states.items()}
        self.db = NS(best_latency=lambda key: self.best_latency(int(key.removeprefix("key"))))
        self.failing = set(failing)

    def measure_best(self, indices):
        return {i: math.inf if i in self.failing else self.best_latency(i) for i in indices}


def retune_after_stop(tmp_path):
    (tmp_path / "first").mkdir()
    (tmp_path / "retune").mkdir()
    first = ConvergingSession(tmp_path / "first")
    tuner = tuner_on(first, budget=600)
    tuner.run_rounds()
    tuner.close()
    assert tuner.stopped
    return first


def retune_on(session, first_dir, share=0.01):
    tuner = Tuner(
        session,
        "dynatune",
        budget_s=600,
        slot_s=SLOT,
        warmup_share=0.5,
        stopping=BeliefStopping(min_gain_share=share, patience=2),
        warm_sources=[str(first_dir)],
    )
    tuner.bounds = dict(enumerate(session.bounds))
    tuner.prepare()
    return tuner


def test_a_retune_of_a_stopped_run_carries_its_stop_and_stops_before_its_first_slot(tmp_path):
    """Same tasks, same settings, every best measured again: the first run's checks count, and the rule looks
    once more before the first round, at the tasks as the confirmation left them and over the rest the first
    run had left when it stopped (not the retune's own whole budget): below the share, the retune tunes
    nothing. Its reason says whose checks it counted; a second look at the same work dir honours the stop."""
    first = retune_after_stop(tmp_path)
    left = run_state(tmp_path / "first")["stop"]["slots_left"]
    retune = retune_on(RetuneSession(tmp_path / "retune", first), tmp_path / "first")
    carried, check = retune.run_state["carried_stop"], retune.run_state["carried_check"]
    assert carried["source"] == str(tmp_path / "first") and carried["slots"] == pytest.approx(left)
    assert check["stop"] and check["streak"] == 3 and check["carried"] == 2 and check["round"] == -1
    assert check["slots_weighed"] == pytest.approx(left) and check["slots_left"] > left
    assert check["reason"].startswith(f"the {left:.1f} slots the run it was warm-started from had left")
    assert "2 of them the checks that stopped the run this one was warm-started from" in check["reason"]
    retune.run_rounds()
    retune.close()
    end = retune.ending()
    assert retune.rounds == [] and end.stopped_early and end.elapsed_s == 0 and end.round == -1
    assert end.reason == f"stopped at 0 s of the 600 s budget: {check['reason']}"
    again = retune_on(RetuneSession(tmp_path / "retune", first), tmp_path / "first")
    assert again.stopped and again.run_state["carried_check"] == check
    again.close()


def test_a_carried_stop_weighs_its_own_horizon_until_a_check_above_the_share_starts_the_count_again():
    """Two slots could not buy the share; the retune's 400 could. A retune that carries a stop made with two
    slots left weighs those two at its first check and stops; one whose first check is above the share even
    so counts afresh over its own whole rest from then on."""
    tasks = [task(0, 1e-3, 0.5e-3, slots=12), task(1, 1e-3, 0.6e-3, slots=12)]
    own = BeliefStopping(min_gain_share=0.01, patience=3, beliefs=HeadroomBeliefs())
    own.carry(3)  # no horizon recorded: its own rest
    assert not own.check(ctx(tasks)).stop
    rule = BeliefStopping(min_gain_share=0.01, patience=3, beliefs=HeadroomBeliefs())
    rule.carry(3, slots=2.0)
    check = rule.check(ctx(tasks))
    assert check.stop and check.slots_weighed == pytest.approx(2.0)
    assert check.slots_left == pytest.approx(400.0)
    hopeful = [task(0, 1e-3, 0.5e-3, slots=2), task(1, 1e-3, 0.05e-3, slots=2)]  # still jumping: above
    rule = BeliefStopping(min_gain_share=0.01, patience=3, beliefs=HeadroomBeliefs())
    rule.carry(3, slots=2.0)
    assert not rule.check(ctx(hopeful)).stop and rule.carried_slots is None
    after = rule.check(ctx(tasks))
    assert after.slots_weighed == after.slots_left == pytest.approx(400.0) and not after.stop  # above
    state = BeliefStopping()
    rule.carry(3, slots=2.0)
    state.load_state_dict(json.loads(json.dumps(rule.state_dict())))
    assert (state.streak, state.carried, state.carried_slots) == (3, 3, 2.0)


@pytest.mark.parametrize("why", ["a best that no longer runs", "other settings", "a resumed source"])
def test_a_retune_counts_afresh_unless_its_source_stopped_on_the_same_tasks_and_settings(tmp_path, why):
    first = retune_after_stop(tmp_path)
    share = 0.02 if why == "other settings" else 0.01
    if why == "a resumed source":  # resumed with more budget, the first run's stop was reopened
        tuner_on(first, budget=900).close()
    session = RetuneSession(tmp_path / "retune", first, failing={1} if why.startswith("a best") else ())
    retune = retune_on(session, tmp_path / "first", share=share)
    assert retune.run_state["carried_stop"] is None
    retune.run_rounds()
    retune.close()
    checks = [r["stop_check"] for r in retune.rounds]
    assert len(checks) >= 2 and all(c["carried"] == 0 for c in checks) and checks[-1]["stop"]


# -- one real run --------------------------------------------------------------------------------------
def converging_run_sets(patience: int) -> list[str]:
    """A tiny real run that converges by its settings: nothing left worth 99 % of the model once every task
    had its first batch, at ``patience`` checks in a row."""
    return [
        "slot_s=1",
        "search.trials_per_iter=4",
        "search.population_size=32",
        "measure.adaptive=false",
        "measure.repeat=3",
        "measure.min_repeat_ms=5",
        "stopping.min_gain_share=0.99",
        f"stopping.patience={patience}",
        "compile.verify=false",  # the compile is other tests' part
        "anchors=false",
    ]


@pytest.mark.slow
def test_a_tiny_run_that_converges_stops_with_its_reason_in_the_summary_report_and_mlflow(
    tiny_onnx, tmp_path, monkeypatch
):
    """Converged by its settings (nothing left worth 99 % of the model once every task had its first batch):
    the pipeline stops, says why everywhere, and a second run of the same config tunes nothing more."""
    import mlflow.tracking._tracking_service.utils as tracking_utils
    from mlflow import MlflowClient

    from dynatune.run.config import load_config
    from dynatune.run.pipeline import run
    from dynatune.tasks.tracking import MlflowCallback

    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)  # the work dir's own store
    monkeypatch.setattr(tracking_utils, "_tracking_uri", None)
    sets = converging_run_sets(patience=1)
    cfg = load_config(
        None, sets, model=tiny_onnx, shapes={"x": (1, 3, 16, 16)}, budget=30, work_dir=str(tmp_path)
    )
    s = run(cfg, callbacks=[MlflowCallback()])
    assert s.stopped_early and s.tuning_s_used == s.elapsed_s < 30
    assert s.tuning_s_saved == pytest.approx(30 - s.elapsed_s, abs=1e-3)
    assert s.stop_reason.startswith(
        f"stopped at {s.elapsed_s:.0f} s of the 30 s budget: the rest of the budget"
    )
    assert "below 99.00% of the model's" in s.stop_reason and s.stop_check["stop"]
    assert s.stop_check["streak"] == 1  # patience 1: at the first check below the share
    assert f"Why tuning ended: {s.stop_reason}." in open(WorkDir(str(tmp_path)).report_md).read()
    client = MlflowClient(cfg.tracking.uri)
    tracked = client.get_run(s.mlflow_run_id)
    assert tracked.data.tags["stop_reason"] == s.stop_reason and tracked.data.tags["stopped_early"] == "true"
    for key, value in (
        ("stopped_early", 1.0),
        ("tuning_s_saved", s.tuning_s_saved),
        ("tuning_s_used", s.elapsed_s),
    ):
        (metric,) = client.get_metric_history(s.mlflow_run_id, key)
        assert metric.step == s.rounds and metric.value == pytest.approx(value, abs=1e-3), key
    assert len(client.get_metric_history(s.mlflow_run_id, "stop_threshold_ms")) >= 1
    again = run(cfg)  # the same budget: the stop holds
    assert again.rounds == s.rounds and again.stopped_early and again.stop_reason == s.stop_reason


@pytest.mark.slow
def test_a_real_retune_of_a_stopped_run_stops_before_its_first_slot(tiny_onnx, tmp_path, monkeypatch):
    """The nightly retune of an unchanged model (warm-started from the stopped run, its schedules measured
    again): the stop's two checks carry over, and the retune's check before its first slot stops it; its
    model is compiled and timed from the schedules it started from."""
    from dynatune.run.config import load_config
    from dynatune.run.pipeline import retune_config, run

    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    sets = converging_run_sets(patience=2) + ["compile.profile=false", "library.enabled=false"]
    cfg = load_config(
        None, sets, model=tiny_onnx, shapes={"x": (1, 3, 16, 16)}, budget=60, work_dir=str(tmp_path)
    )
    first = run(cfg)
    assert first.stopped_early and first.stop_check["streak"] == 2
    retune = run(retune_config(cfg))
    assert retune.rounds == 0 and retune.stopped_early and retune.stop_check["carried"] == 2
    assert retune.tuning_s_used == 0  # its model: the schedules it started from
    assert retune.estimated_latency_ms == pytest.approx(first.estimated_latency_ms)
    assert retune.confirmed["tasks"] >= 1 and not retune.confirmed["failed"]
    assert "2 of them the checks that stopped the run this one was warm-started from" in retune.stop_reason


def test_a_run_whose_tasks_keep_gaining_spends_its_budget_and_says_what_was_left(tmp_path):
    session = ConvergingSession(tmp_path, bounds=(1e-6, 2.5e-7, 1.2e-7))  # far below: every slot gains 4x
    tuner = tuner_on(session, budget=20)
    tuner.run_rounds()
    tuner.close()
    end = tuner.ending()
    assert not tuner.stopped and tuner.elapsed_s == pytest.approx(20) and not end.stopped_early
    assert end.reason.startswith(
        "tuned for the whole budget (20 s); at the last check with a slot left, the rest"
    )
    assert "above 1.00% of the model's" in end.reason


class FlatBeliefs:
    """Beliefs for the rule's arithmetic: every task gains ``mean`` in its next slot and nothing after, with
    ``sd`` of it, from one source (:data:`OWN`, or one the tasks share)."""

    def __init__(self, mean, sd, source):
        self.mean, self.sd, self.source = mean, sd, source

    def observe(self, tasks, slot_s):
        pass

    def limit(self, task):
        return ""

    def rest_spread(self, task, slot_s, slots, best_s=None):
        once = np.ones(math.ceil(slots))
        return once * self.mean, {self.source: once * self.sd}


def test_the_rest_adds_the_tasks_own_uncertainties_in_squares_and_a_shared_one_in_full():
    """The upper bound of what the rest buys is the bound of a sum: 16 tasks' own uncertainties are
    independent (4 = sqrt(16) standard deviations), a source they share moves them together (16)."""
    tasks = [task(i, 1e-3, 1e-4) for i in range(16)]
    mean, sd = 1e-6, 1e-6  # per slot and task
    for source, sds in ((OWN, 4.0), ("headroom of conv2d", 16.0)):
        rule = BeliefStopping(min_gain_share=0.01, patience=1, beliefs=FlatBeliefs(mean, sd, source))
        check = rule.check(ctx(tasks, elapsed=900.0 - 16 * SLOT))  # 16 slots left: one for each task
        assert check.slots_left == pytest.approx(16.0)
        assert check.gain_s == pytest.approx(16 * mean + sds * sd)
        assert check.task_gain_s == pytest.approx(mean + sd)  # the most one task could buy alone


def test_no_task_adds_more_uncertainty_to_the_rest_than_all_of_it():
    """Beliefs unsure of three 1 ms tasks (a spread of 10 ms each, after one lucky slot on a tiny model): each
    task's upper bound is held to its own latency, its spread scaled to the room above its mean, so the rest's
    bound is the sum's (sqrt(3) of those spreads) and not the whole model, which read above any share."""
    tasks = [task(i, 1e-3, 1e-5) for i in range(3)]
    mean, sd = 1e-4, 1e-2
    rule = BeliefStopping(min_gain_share=0.99, patience=1, beliefs=FlatBeliefs(mean, sd, OWN))
    check = rule.check(ctx(tasks, elapsed=900.0 - 3 * SLOT))  # one slot for each task
    assert check.gain_s == pytest.approx(3 * mean + math.sqrt(3) * (1e-3 - mean))
    assert check.task_gain_s == pytest.approx(1e-3) and check.gain_s < check.threshold_s and check.stop
