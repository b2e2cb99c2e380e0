"""A finished run's rounds as its tuner saw them: the :class:`~dynatune.schedulers.RoundContext` after each
recorded round, rebuilt from its work dir.

A stopping rule does not choose tasks, so the rounds of a run tuned with stopping off (or resumed to its whole
budget) are the rounds the same run takes with any stopping rule, up to the stop. Looking at a rule's checks
along them (:func:`rule_on_run`) says, exactly, where that rule would have stopped the run, and what the run
still gained after that round: the beliefs' trace against what really came.

What is read: ``tasks.json`` (each task's weight, FLOPs and compulsory bytes), ``session.json`` (each task's
untuned latency and its history, one point per slot), ``rounds.jsonl`` (which task each round tuned, and the
tuning seconds after it), ``anchors.json`` (ONNX Runtime's time for a task's operator) and ``config.json``
(the budget and the slot). A warm-started task's history begins with the points it carried over (the rounds
of the run it came from), before its own rounds. Each task's roofline bound is its FLOPs and bytes at the
``roofline`` given (:class:`~dynatune.machine.roofline.Roofline`, the run's machine's).
"""

from __future__ import annotations

import math
import os
from collections import Counter
from dataclasses import dataclass, replace

from dynatune.compiler.anchors import read_anchors
from dynatune.errors import DynatuneError
from dynatune.files import WorkDir
from dynatune.run.workdir_state import read_rounds, read_tasks_file
from dynatune.schedulers import RoundContext, TaskView
from dynatune.search.session_state import read_session_state
from dynatune.search.state_files import read_json_file


@dataclass
class RecordedRound:
    """One recorded round: its line in ``rounds.jsonl`` and the tasks as they stood after it."""

    line: dict
    ctx: RoundContext

    @property
    def estimate_s(self) -> float:
        return float(self.line["estimated_latency_s"])


def recorded_rounds(work_dir: str, roofline=None, budget_s: float | None = None) -> list[RecordedRound]:
    """Every recorded round of ``work_dir`` with the context after it (``budget_s``: the run's own, from its
    config, when None)."""
    wd = WorkDir(work_dir)
    config = read_json_file(os.path.join(work_dir, "config.json"), dict) or {}
    budget = float(budget_s if budget_s is not None else config.get("budget_s", math.inf))
    slot = float(config.get("slot_s", 15.0))
    tasks = read_tasks_file(wd.tasks) or []
    states = read_session_state(wd.session)
    anchors = read_anchors(wd.anchors) or {}
    rounds = read_rounds(wd.rounds)
    own = Counter(r["task"] for r in rounds)  # each task's rounds in this run
    views, taken = [], {}
    for t in tasks:
        st = states.get(t["key"])
        default = st.default_s if st is not None and st.default_s is not None else math.nan
        history = [(h[0], h[1], h[2] if h[2] is not None else default) for h in (st.history if st else [])]
        carried = max(len(history) - own[t["index"]], 0)  # from the run it was warm-started from
        bound = roofline.bound_s(t.get("flops", 0.0), t.get("bytes", 0.0)) if roofline is not None else 0.0
        views.append(
            TaskView(
                t["index"],
                t["name"],
                t["key"],
                t["weight"],
                t.get("flops", 0.0),
                default,
                history[:carried],
                bool(st is not None and st.exhausted and carried == len(history)),
                bound,
                anchors.get(t["index"], 0.0),
            )
        )
        taken[t["index"]] = (history, carried)
    out = []
    for r in rounds:
        history, at = taken[r["task"]]
        if at < len(history):
            views[r["task"]].history.append(history[at])
            taken[r["task"]] = (history, at + 1)
        now = [replace(v, history=list(v.history)) for v in views]
        ctx = RoundContext(now, r["round"] + 1, slot, float(r["elapsed_s"]), budget)
        out.append(RecordedRound(r, ctx))
    return out


@dataclass
class RuleOnRun:
    """Where a rule would have stopped a recorded run, and what the run gained after that."""

    stop_round: int | None  # None: it would not have stopped
    stop_elapsed_s: float
    budget_s: float
    estimate_at_stop_s: float
    final_estimate_s: float
    checks: list  # every check's figures, with the gain the run still made after its round

    @property
    def used_share(self) -> float:
        return min(self.stop_elapsed_s / self.budget_s, 1.0) if self.budget_s > 0 else 1.0

    @property
    def loss(self) -> float:
        """How much slower the estimate at the stop is than the run's last (0: nothing lost)."""
        return self.estimate_at_stop_s / self.final_estimate_s - 1.0


def rule_on_run(recorded: list[RecordedRound], rule) -> RuleOnRun:
    """``rule`` (a fresh :class:`~dynatune.run.stopping.StoppingRule`) checked after every recorded round, as
    the tuner checks it, until it says stop."""
    if not recorded:
        raise DynatuneError(
            "no recorded rounds: a run that tuned nothing (such as a retune that stopped before its first "
            "slot) has nothing for a rule to stop"
        )
    rule.attach()
    final = recorded[-1].estimate_s
    checks, stop = [], None
    for rec in recorded:
        c = rule.check(rec.ctx)
        checks.append(
            {
                "round": rec.line["round"],
                "elapsed_s": rec.ctx.elapsed_s,
                "gain_s": c.gain_s,
                "threshold_s": c.threshold_s,
                "still_gained_s": rec.estimate_s - final,
                "stop": c.stop,
            }
        )
        if c.stop:
            stop = rec
            break
    end = stop or recorded[-1]
    return RuleOnRun(
        stop.line["round"] if stop else None,
        end.ctx.elapsed_s,
        end.ctx.budget_s,
        end.estimate_s,
        final,
        checks,
    )


def run_roofline(work_dir: str):
    """The roofline the run's machine cached (``~/.cache/dynatune/roofline/``), found by the fingerprint its
    summary names; None when this machine has not cached it."""
    from dynatune.files import cache_root
    from dynatune.machine.roofline import Roofline

    summary = read_json_file(WorkDir(work_dir).summary, dict) or {}
    fingerprint = (summary.get("library") or {}).get("fingerprint")
    folder = cache_root("roofline")
    for name in sorted(os.listdir(folder)) if os.path.isdir(folder) else []:
        doc = read_json_file(os.path.join(folder, name), dict) or {}
        if fingerprint is None or doc.get("fingerprint") == fingerprint:
            return Roofline(**doc) if "peak_flops" in doc else None
    return None
