"""The scheduler interface: each round, pick ONE task to tune for a slot.

A scheduler sees the same :class:`RoundContext` whether it drives real tuning (the pipeline) or a
replay of recorded traces (the replay benchmark), so only the choice differs between strategies.
"""

from __future__ import annotations

import math
from abc import ABC, abstractmethod
from dataclasses import dataclass, field


def running_best(start: float, values) -> list[float]:
    """The best latency so far after each of ``values``, from ``start`` (the untuned default). A value that
    is None, not finite or not positive measured nothing; a finite value beats an infinite start."""
    out, best = [], start
    for v in values:
        if v is not None and math.isfinite(v) and v > 0 and (v < best or not math.isfinite(best)):
            best = v
        out.append(best)
    return out


@dataclass
class TaskView:
    """What a scheduler may know about one task."""

    index: int
    name: str
    key: str
    weight: int
    flops: float
    default_s: float  # untuned latency (seconds), measured once
    history: list = field(default_factory=list)  # [(cum tuning seconds, cum trials, best_s)] per slot
    exhausted: bool = False  # search space exhausted, or the task cannot build/run
    bound_s: float = (
        0.0  # roofline bound of its latency on this machine (0: unknown, :mod:`dynatune.machine.roofline`)
    )
    anchor_s: float = 0.0  # ONNX Runtime's time for the same operator here (0: unknown, compiler.anchors)

    @property
    def best_s(self) -> float:
        return (running_best(self.default_s, [h[2] for h in self.history]) or [self.default_s])[-1]

    @property
    def seconds(self) -> float:
        return self.history[-1][0] if self.history else 0.0

    @property
    def trials(self) -> int:
        return self.history[-1][1] if self.history else 0

    @property
    def visits(self) -> int:
        return len(self.history)


@dataclass
class RoundContext:
    tasks: list[TaskView]
    round: int
    slot_s: float
    elapsed_s: float = 0.0
    budget_s: float = math.inf


@dataclass
class Belief:
    """A scheduler's view of one task this round (logged as the belief table)."""

    task: int
    name: str
    weight: int
    best_s: float
    gain_mean_s: float  # expected drop of weight x latency after one more slot (seconds)
    gain_std_s: float
    score: float  # the value the scheduler ranks by (UCB for DynaTune)
    visits: int
    retired: bool = False
    note: str = ""
    at_bound: bool = False  # at a bound it cannot pass (its roof, its floor): no slot while another can gain


class Scheduler(ABC):
    name: str = "base"

    def __init__(self, seed: int = 0, **params):
        self.seed = seed
        self.params = params

    @abstractmethod
    def choose(self, ctx: RoundContext) -> int | None:
        """Index of the task to tune next, or None when every task is retired.

        No side effects: the same context gives the same choice, so a round that raises and is retried
        chooses again what it chose before. State changes belong in :meth:`after_round`.
        """

    def after_round(self, ctx: RoundContext, choice: int) -> None:
        """The slot of ``choice`` (chosen on ``ctx``) has run: advance the scheduler's own state."""

    def pick(self, ctx: RoundContext) -> int | None:
        """``choose`` then ``after_round``: for drivers that do not run a slot in between (tests, benches)."""
        i = self.choose(ctx)
        if i is not None:
            self.after_round(ctx, i)
        return i

    def beliefs(self, ctx: RoundContext) -> list[Belief]:
        """The per-task table behind the last choice (schedulers without beliefs give a plain one)."""
        return [
            Belief(t.index, t.name, t.weight, t.best_s, 0.0, 0.0, 0.0, t.visits, t.exhausted)
            for t in ctx.tasks
        ]

    @property
    def gain_beliefs(self):
        """The :class:`~dynatune.beliefs.Beliefs` behind the choices (None: a scheduler without beliefs)."""
        return None

    def state_dict(self) -> dict:
        return {}

    def load_state_dict(self, state: dict) -> None:
        pass
