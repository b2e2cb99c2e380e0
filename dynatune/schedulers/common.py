"""Helpers shared by the schedulers: parameter checking and per-task running bests."""

from __future__ import annotations

from dynatune.errors import DynatuneError
from dynatune.schedulers.base import Scheduler, running_best


class ParamScheduler(Scheduler):
    """A :class:`Scheduler` with declared parameters: ``defaults`` lists them, unknown ones are errors."""

    defaults: dict = {}

    def __init__(self, seed: int = 0, **params):
        unknown = sorted(set(params) - set(self.defaults))
        if unknown:
            known = ", ".join(sorted(self.defaults)) or "none"
            raise DynatuneError(
                f"unknown parameter(s) {', '.join(unknown)} for scheduler {self.name!r}",
                f"its parameters are: {known}",
            )
        super().__init__(seed, **{**self.defaults, **params})
        for k, v in self.params.items():
            setattr(self, k, v)


def best_history(task) -> list[float]:
    """Best latency after each slot of ``task`` (running minimum, starting from the untuned default)."""
    return running_best(task.default_s, [h[2] for h in task.history])
