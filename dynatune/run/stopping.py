"""When a run stops tuning before its budget: its beliefs say the model cannot get meaningfully faster.

The budget is a cap. After every round the tuner asks its :class:`StoppingRule` whether tuning should go
on; the rule answers with a :class:`StopCheck`, which names its figures and says why in one sentence. The run
records every check with its round (``rounds.jsonl``, MLflow's ``stop_gain_ms`` and ``stop_threshold_ms``),
the check that stopped it in its state (``run.json``), and the reason in its summary, report and MLflow run.

:class:`BeliefStopping`, the rule (``stopping:`` in the run config), weighs what the rest of the budget could
still buy: ``R = remaining seconds / slot`` slots. For every task the beliefs predict the gain of ``n`` more
slots, ``n = 1 .. R`` (:meth:`~dynatune.beliefs.Beliefs.predict_rest`), at its upper bound ``mean +
confidence x std``, not the mean alone; a task at a bound it cannot pass
(:meth:`~dynatune.beliefs.Beliefs.limit`) gains nothing. The rest's slots go where those upper bounds gain
most, the ``R`` largest of the tasks' per-slot steps: whatever task gets each slot, no spending of the rest
gains more. What that spending buys, at its upper bound, is the bound of a sum: the tasks' means plus
``confidence`` standard deviations of the sum, in which the tasks' own uncertainties add in squares and a
source they share (:meth:`~dynatune.beliefs.Beliefs.rest_spread`: the headroom model's pooled jump size, a
kind's attainable fraction) adds in full. (Summing every task's own upper bound counted 25-35 independent
uncertainties as if they all fell the same way.) Nor is it less than what any one task could buy alone with
the whole rest, at its own upper bound: the issue's "no task's expected gain over the rest". When that is
worth no more than ``min_gain_share`` of the model's estimated latency (the sum of weight x best), at
``patience`` checks in a row, tuning stops. A model of many small tasks, each below the share but together
above it, goes on (on the recorded traces, a rule that looked at one task at a time stopped mnasnet0_5 at 7 %
of its budget, 33 % slower than at its end, with a share of 5 %). It never stops:

- before every task has had its first batch (unless the tasks still waiting are, all of them together, worth
  less than the share, so that even their whole latency could not buy it, or are at their roofs already);
- on one check: ``patience`` rounds in a row, each with its new measurements, must agree, so one slot's luck
  (a jump that makes the rest look small, a zero gain that makes a task look converged) cannot end a run;
- with less than a slot of the budget left: the budget ends the run then (a rest of nothing "buys nothing",
  and counted as a stop it made a run that spent its whole budget say it had stopped early).

A resumed run (:class:`~dynatune.run.tuner.Tuner`) does not repeat a recorded stop blindly: with a larger
budget or another set of tasks the rule starts its count again, so it looks again after at least one new
round.

A retune (a fresh run warm-started from one the rule stopped: a nightly retune of an unchanged model) carries
that stop's count (:meth:`StoppingRule.carry`) when its tasks are the same, its rule's settings are, and every
task's best schedule was measured again here (the tuner's confirmation): the patience those checks met was
met on the same tasks' evidence, which the retune holds too, every best measured again. The rule looks once
more before the retune's first slot, at the tasks as the confirmation left them and over what the carried
checks weighed: the rest of the budget the stopped run had left (``carry``'s ``slots``), or the retune's own
rest if that is less. Below the share the retune stops there, without a slot; above it, the count starts
again, over the retune's own rest. (A first check after a slot let one slot's luck start a whole new count:
on the live runs a retune whose first slot jumped read 1.02x the threshold and tuned for 268 s. Weighing its
whole fresh budget asked another question than the carried checks had: a retune with 60 slots read 1.01-2.44x
the threshold where its source, with 12.5-28.8 slots left, had stopped, and tuned for 91-509 s.)

The rule takes its beliefs from the scheduler (DynaTune's own, :attr:`Scheduler.gain_beliefs`), or the
default headroom beliefs for a scheduler that has none.
"""

from __future__ import annotations

import math
from abc import ABC, abstractmethod
from dataclasses import asdict, dataclass

import numpy as np

from dynatune.beliefs.base import OWN, _valid, combined_std, rest_slots

__all__ = ["BeliefStopping", "StopCheck", "StoppingRule", "within_latency"]


def within_latency(mean: np.ndarray, sources: dict, whole_s: float, confidence: float):
    """A task's predicted gain (``mean``, and its standard deviation by source:
    :meth:`~dynatune.beliefs.Beliefs.rest_spread`) held within what the task has. No task gains more than all
    of its weighted latency ``whole_s``, so neither its mean nor its upper bound (``confidence`` standard
    deviations above the mean) passes it; where the bound would, every source's part is scaled alike down to
    the room left above the mean. (Uncapped, beliefs unsure of a task after one lucky slot carried a spread
    larger than the task into the rest's sum, whose bound then read the whole model.)"""
    mean = np.minimum(mean, whole_s)
    spread = confidence * combined_std(sources)
    room = whole_s - mean
    scale = np.where(spread > room, room / np.where(spread > 0, spread, 1.0), 1.0)
    return mean, {name: sd * scale for name, sd in sources.items()}


@dataclass
class StopCheck:
    """One look of a rule at a run, after a round."""

    stop: bool
    reason: str  # one sentence: why the run stops, or why it goes on
    eligible: bool = False  # every task has had its first batch (or those left could not matter)
    gain_s: float = 0.0  # the most the rest of the budget could still buy (upper bound, weighted seconds)
    task: str = ""  # the task that could gain most over the rest on its own
    task_gain_s: float = 0.0  # ... and how much (upper bound, weighted seconds)
    threshold_s: float = 0.0  # min_gain_share x the model's estimated latency
    model_s: float = 0.0  # the model's estimated latency (sum of weight x best)
    slots_left: float = 0.0  # the rest of the budget, in slots
    slots_weighed: float = 0.0  # ... of them, those weighed: fewer while a carried stop's horizon holds
    streak: int = 0  # checks in a row (this one included) at which the rest was not worth the threshold
    carried: int = 0  # ... of them, the checks of the run this one was warm-started from (:meth:`carry`)

    def as_dict(self) -> dict:
        return asdict(self)


class StoppingRule(ABC):
    """Whether tuning should go on, after each round. Its count survives a restart (``state_dict``)."""

    name = "base"

    def attach(self, scheduler=None) -> None:
        """The run's scheduler, before the first check (a rule may use its beliefs)."""

    @abstractmethod
    def check(self, ctx) -> StopCheck:
        """Look at the run after a round (``ctx``: a :class:`~dynatune.schedulers.RoundContext`). Moves the
        rule's count on: call it once per round."""

    def reset(self) -> None:
        """Forget the count: the next stop needs fresh checks (a resumed run with new budget or tasks)."""

    def carry(self, streak: int, slots: float | None = None) -> None:
        """Begin the count at ``streak``: the checks in a row that stopped the run this fresh one was
        warm-started from, its tasks the same and their best schedules measured again here
        (:meth:`~dynatune.run.tuner.Tuner.carry_stop`); ``slots``: the rest of the budget those checks
        weighed (its last one's), None when unknown."""

    def settings(self) -> dict:
        """What the rule was asked (a stop decided under other settings is looked at again)."""
        return {"rule": self.name}

    def state_dict(self) -> dict:
        return {}

    def load_state_dict(self, state: dict) -> None:
        pass


class BeliefStopping(StoppingRule):
    name = "beliefs"

    def __init__(
        self,
        min_gain_share: float = 0.02,
        patience: int = 3,
        confidence: float = 1.0,
        beliefs=None,
    ):
        """``beliefs``: a :class:`~dynatune.beliefs.Beliefs` (None: the scheduler's, by :meth:`attach`)."""
        self.min_gain_share = min_gain_share
        self.patience = patience
        self.confidence = confidence
        self.beliefs = beliefs
        self.streak = 0
        self.carried = 0
        self.carried_slots: float | None = None  # the horizon of the carried checks (:meth:`carry`)

    def attach(self, scheduler=None) -> None:
        if self.beliefs is None:
            self.beliefs = getattr(scheduler, "gain_beliefs", None)
        if self.beliefs is None:  # a scheduler without beliefs: the default ones
            from dynatune.beliefs import make_beliefs

            self.beliefs = make_beliefs("headroom")

    def rest_gains(self, ctx, slots: float) -> list[tuple[object, np.ndarray, np.ndarray, dict]]:
        """``[(task, upper bound of its gain after n = 1 .. ceil(slots) more slots, its mean, its standard
        deviation by source)]`` (weighted s) for every task that can still gain (after :meth:`observe`)."""
        out = []
        for t in ctx.tasks:
            if t.exhausted or not _valid(t.best_s) or self.beliefs.limit(t):
                continue
            mean, sources = self.beliefs.rest_spread(t, ctx.slot_s, slots)
            mean, sources = within_latency(mean, sources, t.weight * t.best_s, self.confidence)
            bound = np.maximum.accumulate(mean + self.confidence * combined_std(sources))
            out.append((t, bound, mean, sources))
        return out

    def rest_bound(self, gains, n: int) -> float:
        """The most the rest's ``n`` slots could buy, at its upper bound. The slots go where the tasks' own
        upper bounds gain most (the ``n`` largest of their per-slot steps: whatever task gets each slot, no
        spending of the rest gains more); what that spending buys is the sum of the tasks' means plus
        ``confidence`` standard deviations of the sum: the tasks' own uncertainties are independent, so they
        add in squares, while a source they share (:meth:`~dynatune.beliefs.Beliefs.rest_spread`) adds in
        full within itself. Never more than the tasks' whole latency."""
        if not gains or n <= 0:
            return 0.0
        steps = [np.diff(g, prepend=0.0) for _, g, _, _ in gains]
        owner = np.concatenate([np.full(len(st), i) for i, st in enumerate(steps)])
        order = np.argsort(-np.concatenate(steps), kind="stable")[:n]
        slots_of = np.bincount(owner[order].astype(int), minlength=len(gains))
        mean, own, shared = 0.0, 0.0, {}
        for (_, _, m, sources), k in zip(gains, slots_of):
            if k == 0:
                continue
            mean += float(m[k - 1])
            for name, sd in sources.items():
                if name == OWN:
                    own += float(sd[k - 1]) ** 2
                else:
                    shared[name] = shared.get(name, 0.0) + float(sd[k - 1])
        spread = math.sqrt(own + sum(v * v for v in shared.values()))
        whole = math.fsum(t.weight * t.best_s for (t, *_), k in zip(gains, slots_of) if k)
        return min(mean + self.confidence * spread, whole)

    def check(self, ctx) -> StopCheck:
        model_s = math.fsum(t.weight * t.best_s for t in ctx.tasks if _valid(t.best_s))
        threshold = self.min_gain_share * model_s
        slots = max(ctx.budget_s - ctx.elapsed_s, 0.0) / ctx.slot_s
        if self.beliefs is None:
            self.attach()
        self.beliefs.observe(ctx.tasks, ctx.slot_s)
        # a task at its roof from the start has nothing to gain from its first batch either
        waiting = [t for t in ctx.tasks if not t.exhausted and not t.history and not self.beliefs.limit(t)]
        untuned = math.fsum(t.weight * t.best_s if _valid(t.best_s) else math.inf for t in waiting)
        weighed = min(slots, self.carried_slots) if self.carried and self.carried_slots is not None else slots
        figures = dict(threshold_s=threshold, model_s=model_s, slots_left=slots, slots_weighed=weighed)
        if slots < 1:  # nothing left to save: the budget ends the run, not the rule (its count stays)
            return StopCheck(False, "less than a slot of the budget is left", streak=self.streak, **figures)
        if waiting and untuned >= threshold:  # below it, all of them together could not gain the share
            self.reset()
            return StopCheck(False, f"{len(waiting)} task(s) still wait for their first batch", **figures)
        gains = self.rest_gains(ctx, weighed)
        task, alone = max(
            ((t, float(g[-1])) for t, g, _, _ in gains if g.size), key=lambda x: x[1], default=(None, 0.0)
        )
        gain = max(self.rest_bound(gains, rest_slots(weighed)), alone)
        name = task.name if task is not None else ""
        self.streak = self.streak + 1 if gain <= threshold else 0
        self.carried = min(self.carried, self.streak)
        if not self.carried:
            self.carried_slots = None  # the count started again: this run's own budget from now on
        stop = self.streak >= self.patience
        rest = f"the rest of the budget ({slots:.1f} slots)"
        if weighed < slots:
            rest = (
                f"the {weighed:.1f} slots the run it was warm-started from had left when it stopped (of this "
                f"run's {slots:.1f})"
            )
        what = (
            f"{rest} could still buy at most {gain * 1e3:.4g} ms (the "
            f"beliefs' upper bound; the most from one task, {name or '-'}: {alone * 1e3:.4g} ms)"
        )
        share = f"{self.min_gain_share:.2%} of the model's {model_s * 1e3:.4g} ms ({threshold * 1e3:.4g} ms)"
        if stop:
            reason = f"{what}, below {share} at {self.streak} checks in a row"
            if self.carried:
                reason += (
                    f" ({self.carried} of them the checks that stopped the run this one was warm-started "
                    "from, its best schedules measured again here)"
                )
        elif gain <= threshold:
            reason = f"{what}, below {share}: {self.streak} of {self.patience} checks in a row"
        else:
            reason = f"{what}, above {share}"
        return StopCheck(
            stop, reason, True, gain, name, alone, streak=self.streak, carried=self.carried, **figures
        )

    def reset(self) -> None:
        self.streak = self.carried = 0
        self.carried_slots = None

    def carry(self, streak: int, slots: float | None = None) -> None:
        self.streak = self.carried = int(streak)
        self.carried_slots = float(slots) if slots is not None else None

    def settings(self) -> dict:
        return {
            "rule": self.name,
            "min_gain_share": self.min_gain_share,
            "patience": self.patience,
            "confidence": self.confidence,
        }

    def state_dict(self) -> dict:
        return {"streak": self.streak, "carried": self.carried, "carried_slots": self.carried_slots}

    def load_state_dict(self, state: dict) -> None:
        self.streak = int(state.get("streak", 0))
        self.carried = int(state.get("carried", 0))
        slots = state.get("carried_slots")
        self.carried_slots = float(slots) if slots is not None else None
