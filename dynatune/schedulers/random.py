"""Random baseline: a uniformly random task among those not exhausted (seeded, reproducible)."""

from __future__ import annotations

import numpy as np

from dynatune.schedulers.base import RoundContext
from dynatune.schedulers.common import ParamScheduler


class RandomScheduler(ParamScheduler):
    name = "random"
    defaults: dict = {}

    def choose(self, ctx: RoundContext) -> int | None:
        alive = [t.index for t in ctx.tasks if not t.exhausted]
        if not alive:
            return None
        # drawn from (seed, round): the same round always draws the same task, nothing to save
        return alive[int(np.random.default_rng([self.seed, ctx.round]).integers(len(alive)))]
