"""Replay of recorded traces: mechanics, determinism, time-to-quality, and the benchmark summary."""

import json
import math

import pytest
from synthetic_traces import synthetic_traces

from dynatune.errors import DynatuneError
from dynatune.replay import (default_slot, load_traces, objective_at, replay, run_replay_benchmark,
                             time_to_quality, total_trace_seconds)
from dynatune.schedulers import SCHEDULERS, make_scheduler
from dynatune.schedulers.base import RoundContext, Scheduler


def hand_made(seconds_per_task=None):
    doc = {"model": "hand", "tasks": [
        {"index": 0, "name": "a", "key": "ka", "weight": 2, "flops": 1, "default_s": 10.0,
         "trace": [[0, 0, 10.0], [2.0, 8, 6.0], [4.5, 16, 5.0], [6.0, 24, 4.0]]},
        {"index": 1, "name": "b", "key": "kb", "weight": 1, "flops": 1, "default_s": 4.0,
         "trace": [[0, 0, 4.0], [3.0, 8, 3.0]]},
    ]}
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
    ttq = {name: time_to_quality(replay(doc, make_scheduler(name), 3 * budget, slot).curve, target)
           for name in ("dynatune", "round_robin")}
    assert ttq["dynatune"] <= ttq["round_robin"]
    assert math.isfinite(ttq["dynatune"])


def test_benchmark_summary_is_json_and_complete():
    docs = [synthetic_traces(n_tasks=10, n_heavy=2, seed=s, model=f"syn{s}") for s in range(2)]
    out = run_replay_benchmark(docs, budgets=(0.5, 1.0))
    json.dumps(out, allow_nan=False)
    assert [m["model"] for m in out["models"]] == ["syn0", "syn1"]
    row = out["models"][0]["budgets"][1]
    assert row["fraction"] == 1.0 and row["ttq_s"]["gradient"] <= row["budget_s"] + 1e-9
    assert set(row["ttq_s"]) == set(SCHEDULERS)
    assert out["ttq_vs_gradient"] == out["per_budget"]["1.0"]["ttq_vs_gradient"]
    assert out["ttq_vs_round_robin"] is not None and out["ttq_vs_round_robin"] > 0
    again = run_replay_benchmark(docs, budgets=(0.5, 1.0))
    assert _without_timings(out) == _without_timings(again)  # deterministic, wall-clock timings aside


def _without_timings(out):
    out = json.loads(json.dumps(out))
    for m in out["models"]:
        for b in m["budgets"]:
            b.pop("decision_s_per_round")
    return out


def test_load_traces_errors(tmp_path):
    with pytest.raises(DynatuneError, match="no traces"):
        load_traces("no-such-model")
    p = tmp_path / "m.json"
    p.write_text(json.dumps(hand_made()))
    assert load_traces(str(p))["model"] == "hand"
    p.write_text(json.dumps({"model": "x", "tasks": []}))
    with pytest.raises(DynatuneError, match="no tasks"):
        load_traces(str(p))
