"""Replay of recorded traces: mechanics, determinism, time-to-quality, and the benchmark summary."""

import json
import math

import pytest
from synthetic_traces import multi_seed, synthetic_traces

from dynatune.bench.replay import default_slot, objective_at, replay, time_to_quality, total_trace_seconds
from dynatune.bench.replay_bench import run_replay_benchmark, spread, summary_lines
from dynatune.bench.traces import draw, load_traces, traces_per_task
from dynatune.errors import DynatuneError
from dynatune.schedulers import SCHEDULERS, make_scheduler
from dynatune.schedulers.base import RoundContext, Scheduler


def hand_made(seconds_per_task=None):
    doc = {
        "model": "hand",
        "tasks": [
            {
                "index": 0,
                "name": "a",
                "key": "ka",
                "weight": 2,
                "flops": 1,
                "default_s": 10.0,
                "trace": [[0, 0, 10.0], [2.0, 8, 6.0], [4.5, 16, 5.0], [6.0, 24, 4.0]],
            },
            {
                "index": 1,
                "name": "b",
                "key": "kb",
                "weight": 1,
                "flops": 1,
                "default_s": 4.0,
                "trace": [[0, 0, 4.0], [3.0, 8, 3.0]],
            },
        ],
    }
    if seconds_per_task is not None:
        doc["seconds_per_task"] = seconds_per_task
    return doc


class Fixed(Scheduler):
    """Plays a fixed list of choices (then stops)."""

    def __init__(self, picks):
        super().__init__()
        self.picks = list(picks)

    def choose(self, ctx: RoundContext):
        return self.picks.pop(0) if self.picks else None


def test_replay_advances_along_the_trace():
    r = replay(hand_made(), Fixed([0, 0, 0, 1]), budget_s=100, slot_s=2.0)
    # a slot runs whole batches until slot_s has passed, as live: task 0's 2nd slot (from 2 s) lasts until
    # its next batch ends at 4.5 s -> 5.0; the 3rd runs past the trace's end (flat, exactly 2 s) -> 4.0;
    # task 1's first slot lasts its whole 3 s first batch -> 3.0. The clock counts those real seconds.
    assert r.curve == [(0.0, 24.0), (2.0, 16.0), (4.5, 14.0), (6.5, 12.0), (9.5, 11.0)]
    assert r.choices == [0, 0, 0, 1]
    assert r.final == 11.0 and r.decision_s_per_round >= 0


def test_budget_limits_rounds_and_history_is_recorded():
    seen = []

    class Spy(Scheduler):
        def choose(self, ctx):
            seen.append((ctx.round, ctx.elapsed_s, [t.visits for t in ctx.tasks], ctx.tasks[0].best_s))
            return 0

    r = replay(hand_made(), Spy(), budget_s=5.0, slot_s=2.0)
    assert len(r.choices) == 3  # rounds start at 0, 2, 4.5 < 5
    assert seen[-1] == (2, 4.5, [2, 0], 5.0)


def test_end_of_trace_flat_or_exhausted():
    # recorded with a 6 s budget per task: task 1 stopped at 3 s (search space exhausted), task 0 did not
    doc = hand_made(seconds_per_task=6.0)
    r = replay(doc, make_scheduler("round_robin"), budget_s=20.0, slot_s=3.0)
    assert r.choices[:3] == [0, 1, 0]
    assert 1 not in r.choices[2:]  # exhausted after its trace was used up
    assert r.final == 2 * 4.0 + 3.0
    flat = replay(hand_made(), make_scheduler("round_robin"), budget_s=20.0, slot_s=3.0)
    assert flat.choices.count(1) > 1  # no recording budget known: flat tail, never exhausted
    every = replay(hand_made(), make_scheduler("round_robin"), budget_s=20.0, slot_s=3.0, exhaust_at_end=True)
    assert every.choices == [0, 1, 0] and every.final == 11.0  # all used up: scheduler returns None


def test_time_to_quality_on_hand_made_curve():
    curve = [(0.0, 10.0), (1.0, 8.0), (2.0, 5.0), (3.0, 5.0), (4.0, 4.5)]
    assert time_to_quality(curve, 5.0) == 2.0
    assert time_to_quality(curve, 10.0) == 0.0
    assert time_to_quality(curve, 4.6) == 4.0
    assert time_to_quality(curve, 4.0) == math.inf
    assert objective_at(curve, 2.5) == 5.0 and objective_at(curve, 100) == 4.5


@pytest.mark.parametrize("name", sorted(SCHEDULERS))
def test_replay_is_deterministic(name):
    doc = synthetic_traces(n_tasks=12, n_heavy=2, seed=4)
    slot = default_slot(doc)
    a = replay(doc, make_scheduler(name, seed=1), 0.5 * total_trace_seconds(doc), slot)
    b = replay(doc, make_scheduler(name, seed=1), 0.5 * total_trace_seconds(doc), slot)
    assert a.curve == b.curve and a.choices == b.choices
    assert all(y1 >= y2 for (_, y1), (_, y2) in zip(a.curve, a.curve[1:]))  # the objective never rises


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_dynatune_reaches_gradient_quality_no_later_than_round_robin(seed):
    doc = synthetic_traces(n_tasks=20, n_heavy=3, seed=seed)
    slot, total = default_slot(doc), total_trace_seconds(doc)
    budget = 0.5 * total
    target = replay(doc, make_scheduler("gradient"), budget, slot).final
    ttq = {
        name: time_to_quality(replay(doc, make_scheduler(name), 3 * budget, slot).curve, target)
        for name in ("dynatune", "round_robin")
    }
    assert ttq["dynatune"] <= ttq["round_robin"]
    assert math.isfinite(ttq["dynatune"])


def test_draws_pick_one_trace_per_task_and_differ_between_replay_seeds():
    import random

    doc = multi_seed([0, 1, 2])
    assert traces_per_task(doc) == 3
    picks = {tuple(r["seed"] for r in draw(doc, random.Random(d))["tasks"]) for d in range(10)}
    assert len(picks) > 1 and all(set(p) <= {0, 1, 2} for p in picks)
    first = draw(doc, None)
    assert all(r["seed"] == 0 and "trace" in r and "traces" not in r for r in first["tasks"])
    assert (
        replay(doc, make_scheduler("round_robin"), 50, 3.0).curve
        == replay(first, make_scheduler("round_robin"), 50, 3.0).curve
    )


def test_benchmark_summary_over_draws_is_json_and_complete():
    docs = [multi_seed([0, 1, 2], "syn0"), multi_seed([3, 4], "syn1")]
    out = run_replay_benchmark(docs, budgets=(0.5, 1.0), draws=6, rtols=(0.0, 0.02))
    json.dumps(out, allow_nan=False)
    assert out["traces_per_task"] == 2 and out["draws"] == 6
    assert [m["model"] for m in out["models"]] == ["syn0", "syn1"]
    assert len(out["models"][0]["draws"]) == 6
    row = out["models"][0]["draws"][0][1]
    assert row["fraction"] == 1.0 and set(row["ttq_s"]) == {"0.0", "0.02"}
    assert set(row["ttq_s"]["0.0"]) == set(SCHEDULERS)
    assert row["ttq_s"]["0.0"]["gradient"] <= row["budget_s"] + 1e-9
    for sch in SCHEDULERS:  # a looser target is reached no later
        assert row["ttq_s"]["0.02"][sch] <= row["ttq_s"]["0.0"][sch]
    cell = out["summary"]["0.02"]["1.0"]["ttq_vs_gradient"]
    assert cell["n"] == 12 and cell["q1"] <= cell["median"] <= cell["q3"] and len(cell["model_medians"]) == 2
    assert out["ttq_vs_gradient"] == cell["median"]
    assert out["ttq_vs_round_robin"] is not None and out["ttq_vs_round_robin"] > 0
    assert any("traces_per_task 2" in line for line in summary_lines(out))
    again = run_replay_benchmark(docs, budgets=(0.5, 1.0), draws=6, rtols=(0.0, 0.02))
    assert out == again  # deterministic: the same draws and the same choices


def test_spread_is_median_and_quartiles():
    assert spread([None, 3.0, 1.0, 2.0, 4.0, 5.0]) == {"median": 3.0, "q1": 2.0, "q3": 4.0, "n": 5}
    assert spread([None])["median"] is None


def test_load_traces_errors(tmp_path):
    with pytest.raises(DynatuneError, match="no traces"):
        load_traces("no-such-model")
    p = tmp_path / "m.json"
    p.write_text(json.dumps(hand_made()))
    assert load_traces(str(p))["model"] == "hand"
    p.write_text(json.dumps({"model": "x", "tasks": []}))
    with pytest.raises(DynatuneError, match="no tasks"):
        load_traces(str(p))


def test_cli_replay_json_reports_traces_per_task_and_takes_rtol(tmp_path, capsys):
    from dynatune.cli import main

    path = tmp_path / "syn.json"
    path.write_text(json.dumps(multi_seed([0, 1, 2])))
    assert (
        main(
            [
                "bench",
                "replay",
                "--json",
                "--models",
                str(path),
                "--draws",
                "3",
                "--rtol",
                "0.02",
                "--budgets",
                "0.5",
            ]
        )
        == 0
    )
    out = json.loads(capsys.readouterr().out)
    assert out["traces_per_task"] == 3 and out["rtols"] == [0.02] and out["draws"] == 3
    assert out["summary"]["0.02"]["0.5"]["ttq_vs_gradient"]["n"] == 3
    assert main(["bench", "replay", "--models", str(path), "--draws", "2", "--budgets", "0.5"]) == 0
    text = capsys.readouterr().out
    assert text.startswith("traces_per_task 3, draws 2") and "rtol 0.02 budget 0.5" in text
    assert main(["bench", "replay", "--models", str(path), "--draws", "0"]) == 2
    assert capsys.readouterr().err.startswith("error: the replay needs at least one draw")


def test_a_replay_stops_where_the_stopping_rule_says_as_a_live_run_would():
    """The rule checked after every round: past the end of the traces (flat curves) nothing is left to buy,
    and the replay ends there, not at its budget."""
    from dynatune.run.stopping import BeliefStopping

    doc = synthetic_traces(n_tasks=6, n_heavy=1, seed=2)
    slot, total = default_slot(doc), total_trace_seconds(doc)
    full = replay(doc, make_scheduler("dynatune"), 4 * total, slot)
    stopped = replay(doc, make_scheduler("dynatune"), 4 * total, slot, stopping=BeliefStopping(0.02, 2))
    assert full.stop is None and full.curve[-1][0] >= 4 * total - slot
    assert stopped.stop["stop"] and stopped.stop["streak"] == 2 and stopped.curve[-1][0] < 4 * total
    assert stopped.curve == full.curve[: len(stopped.curve)]  # the same replay, cut short
    assert stopped.final <= 1.02 * full.final
