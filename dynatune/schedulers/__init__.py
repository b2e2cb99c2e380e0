"""Task schedulers: which task gets the next tuning slot.

``make_scheduler(name, seed=0, **params)`` builds one from :data:`SCHEDULERS`.
"""

from __future__ import annotations

from dynatune.errors import DynatuneError
from dynatune.schedulers.base import Belief, RoundContext, Scheduler, TaskView
from dynatune.schedulers.dynatune import DynaTuneScheduler
from dynatune.schedulers.gradient import GradientScheduler
from dynatune.schedulers.greedy import GreedyScheduler
from dynatune.schedulers.random import RandomScheduler
from dynatune.schedulers.round_robin import RoundRobinScheduler

SCHEDULERS: dict[str, type[Scheduler]] = {
    "dynatune": DynaTuneScheduler,
    "round_robin": RoundRobinScheduler,
    "gradient": GradientScheduler,
    "random": RandomScheduler,
    "greedy": GreedyScheduler,
}


def make_scheduler(name: str, seed: int = 0, **params) -> Scheduler:
    """A new scheduler ``name`` (see :data:`SCHEDULERS`); unknown names or parameters raise DynatuneError."""
    cls = SCHEDULERS.get(name)
    if cls is None:
        raise DynatuneError(f"unknown scheduler {name!r}", "choose one of: " + ", ".join(SCHEDULERS))
    return cls(seed=seed, **params)


__all__ = [
    "SCHEDULERS",
    "make_scheduler",
    "Scheduler",
    "TaskView",
    "RoundContext",
    "Belief",
    "DynaTuneScheduler",
    "GradientScheduler",
    "GreedyScheduler",
    "RandomScheduler",
    "RoundRobinScheduler",
]
