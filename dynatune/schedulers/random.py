"""Random baseline: a uniformly random task among those not exhausted (seeded, reproducible)."""

from __future__ import annotations

import numpy as np

from .base import RoundContext
from .common import ParamScheduler


class RandomScheduler(ParamScheduler):
    name = "random"
    defaults: dict = {}

    def __init__(self, seed: int = 0, **params):
        super().__init__(seed, **params)
        self.rng = np.random.default_rng(seed)

    def choose(self, ctx: RoundContext) -> int | None:
        alive = [t.index for t in ctx.tasks if not t.exhausted]
        if not alive:
            return None
        return alive[int(self.rng.integers(len(alive)))]

    def state_dict(self) -> dict:
        return {"rng": self.rng.bit_generator.state}

    def load_state_dict(self, state: dict) -> None:
        if "rng" in state:
            self.rng.bit_generator.state = state["rng"]
