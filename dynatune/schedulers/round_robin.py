"""Round robin (AutoTVM-style equal shares): cycle through the tasks that are not exhausted."""

from __future__ import annotations

from dynatune.schedulers.base import RoundContext
from dynatune.schedulers.common import ParamScheduler


class RoundRobinScheduler(ParamScheduler):
    name = "round_robin"
    defaults: dict = {}

    def __init__(self, seed: int = 0, **params):
        super().__init__(seed, **params)
        self.next_index = 0  # position in the cycle

    def choose(self, ctx: RoundContext) -> int | None:
        n = len(ctx.tasks)
        for k in range(n):
            i = (self.next_index + k) % n
            if not ctx.tasks[i].exhausted:
                return i
        return None

    def after_round(self, ctx: RoundContext, choice: int) -> None:
        self.next_index = choice + 1

    def state_dict(self) -> dict:
        return {"next_index": self.next_index}

    def load_state_dict(self, state: dict) -> None:
        self.next_index = int(state.get("next_index", 0))
