"""A stopping rule on a recorded run: the rounds of a run tuned with stopping off, rebuilt from its work dir,
stop where the same run with stopping on stopped (the rule chooses no task, so the rounds are the same)."""

import json
from dataclasses import asdict

import pytest
from converging_session import SLOT, ConvergingSession

from dynatune.bench.recorded_run import recorded_rounds, rule_on_run
from dynatune.files import WorkDir
from dynatune.machine.roofline import Roofline
from dynatune.run.stopping import BeliefStopping
from dynatune.run.tuner import Tuner

BUDGET = 300.0
ROOF = Roofline(peak_flops=1e12, bandwidth=1e12)  # a task's FLOPs / 1e12: the session's bounds


def tuned(work, stopping):
    work.mkdir(exist_ok=True)
    session = ConvergingSession(work)
    tuner = Tuner(session, "dynatune", budget_s=BUDGET, slot_s=SLOT, warmup_share=0.5, stopping=stopping)
    tuner.bounds = dict(enumerate(session.bounds))
    tuner.prepare()
    tuner.run_rounds()
    tuner.close()
    wd = WorkDir(str(work))
    with open(wd.session, "w") as f:  # (a real session writes these itself)
        json.dump({"tasks": {k: asdict(st) for k, st in session.states.items()}}, f)
    with open(wd.tasks, "w") as f:
        json.dump([{**vars(t), "mod": None, "bytes": 0.0} for t in session.tasks], f)
    with open(f"{work}/config.json", "w") as f:
        json.dump({"budget_s": BUDGET, "slot_s": SLOT}, f)
    return tuner


def rule():
    return BeliefStopping(min_gain_share=0.01, patience=2)


def test_a_rule_on_a_recorded_run_stops_where_the_run_with_it_stopped(tmp_path):
    stopped = tuned(tmp_path / "on", rule())
    assert stopped.stopped
    full = tuned(tmp_path / "off", None)
    assert not full.stopped and len(full.rounds) > len(stopped.rounds)
    recorded = recorded_rounds(str(tmp_path / "off"), ROOF)
    assert [r.line["round"] for r in recorded] == [r["round"] for r in full.rounds]
    last = recorded[-1].ctx
    assert [[list(h) for h in t.history] for t in last.tasks] == [
        st.history for st in full.session.states.values()
    ]
    assert [t.bound_s for t in last.tasks] == pytest.approx(full.session.bounds)
    replayed = rule_on_run(recorded, rule())
    assert replayed.stop_round == stopped.rounds[-1]["round"]
    assert replayed.stop_elapsed_s == pytest.approx(stopped.elapsed_s)
    assert replayed.used_share == pytest.approx(stopped.elapsed_s / BUDGET)
    assert replayed.loss >= 0.0 and replayed.checks[-1]["stop"]
    assert [c["gain_s"] for c in replayed.checks] == pytest.approx(
        [r["stop_check"]["gain_s"] for r in stopped.rounds]
    )


def test_a_warm_started_tasks_carried_history_comes_before_its_own_rounds(tmp_path):
    full = tuned(tmp_path, None)
    wd = WorkDir(str(tmp_path))
    doc = json.load(open(wd.session))
    first = next(iter(doc["tasks"].values()))
    first["history"].insert(0, [5.0, 40, first["default_s"] / 2])  # tuned before, in another run
    json.dump(doc, open(wd.session, "w"))
    recorded = recorded_rounds(str(tmp_path), ROOF, budget_s=600.0)
    assert recorded[0].ctx.tasks[0].history[0] == (5.0, 40, first["default_s"] / 2)
    assert recorded[0].ctx.budget_s == 600.0
    assert len(recorded[-1].ctx.tasks[0].history) == 1 + len(full.session.states["key0"].history)


def test_stop_savings_recorded_states_where_the_rule_stops_each_run(tmp_path):
    from bench.stop_savings import main

    tuned(tmp_path / "off", None)
    out = tmp_path / "recorded.json"
    argv = ["recorded", str(tmp_path / "off"), "--share", "0.01", "--patience", "2", "--out", str(out)]
    rows = main(argv)
    assert json.loads(out.read_text())["rows"] == rows
    (row,) = rows
    assert row["share"] == 0.01 and row["patience"] == 2 and row["budget_s"] == BUDGET
    assert row["stop_round"] is not None and 0 < row["used_share"] < 1 and row["loss"] >= 0
    assert len(row["checks"]) == row["stop_round"] + 1 and row["checks"][-1]["stop"]


def test_a_run_with_no_rounds_is_refused_in_one_line(tmp_path, capsys):
    """A retune that stopped before its first slot recorded no round: nothing for a rule to stop."""
    from bench.stop_savings import main
    from dynatune.errors import DynatuneError

    with pytest.raises(DynatuneError, match="no recorded rounds"):
        rule_on_run([], rule())
    full = tuned(tmp_path / "off", None)
    open(WorkDir(str(tmp_path / "off")).rounds, "w").close()  # (its rounds gone: as a run that tuned nothing)
    assert full.rounds
    with pytest.raises(SystemExit) as exit_:
        main(["recorded", str(tmp_path / "off"), "--out", str(tmp_path / "recorded.json")])
    assert exit_.value.code == 2
    message = capsys.readouterr().err.strip().splitlines()[-1]
    assert str(tmp_path / "off") in message and "no recorded rounds" in message
    assert not (tmp_path / "recorded.json").exists()
