"""DynaTune: a UCB bandit over tasks, driven by a Bayesian belief of each task's next gain.

Each round one task gets the slot. For task ``i`` with weighted latency ``L_i = weight_i x best_i`` the
belief model (:mod:`dynatune.beliefs`; ``belief_model``: ``headroom`` by default, the roofline gap and a
zero-inflated jump likelihood, or ``curves``, learning-curve extrapolation) predicts the drop ``G_i`` of
``L_i`` after one more slot, with mean ``m_i`` and standard deviation ``s_i``. The objective is ``sum_i L_i``;
slots are equal, so the best use of the next slot is the task with the largest ``G_i``. Under uncertainty we
rank by an upper confidence bound::

    score_i = m_i + c * s_i + c_visit * L_i * sqrt(ln N / n_i)

(``N`` = slots so far, ``n_i`` = slots given to task ``i``): optimism from the belief's uncertainty plus a
UCB1 visit-count bonus, scaled by ``L_i`` so it stays in seconds.

Warm-up: a task competes only after ``warmup`` slots; until then the un-warmed task with the largest
``L_i`` goes first, so a small budget is spent on the heavy tasks. Retirement (re-checked every round):
a task is retired when exhausted, or when its optimistic gain ``m_i + c * s_i`` is below
``negligible x objective`` -- a task too small to matter never gets a slot, whatever its name. When
every task left is negligible, ``stop_when_negligible`` decides: stop (return None) or spend the rest of
the budget anyway (default: there may still be budget to use). The beliefs then no longer tell the tasks
apart, and ``fallback`` picks: ``"share"`` (default) the largest weighted latency per slot so far,
``L_i / n_i`` -- slots shared in proportion to what each task still costs, the uninformed rule (it is the
``best/n`` term of MetaSchedule's gradient rule) -- or ``"uncertain"`` the largest optimistic gain
``m_i + c * s_i``, the most uncertain curve. Real tuning curves are staircases (most slots gain nothing,
then a jump), so on the recorded traces ``"uncertain"`` kept probing small tasks that never improved
(a sweep on the replay traces, BENCHMARKS.md, session 2). A task with no valid latency
at all (not even its default) cannot be valued: it is warmed up last and otherwise scores 0.

Bounds: a task the beliefs put at a bound it cannot pass (:meth:`~dynatune.beliefs.Beliefs.limit`: its roof,
or its reachable floor) is retired with that note, and gets no slot, not even from ``fallback``, while another
task can still gain: a heavy kernel at 97 % of the machine's peak would otherwise keep the largest share.
"""

from __future__ import annotations

import math

from dynatune.beliefs import make_beliefs
from dynatune.errors import DynatuneError
from dynatune.schedulers.base import Belief, RoundContext
from dynatune.schedulers.common import ParamScheduler


def _weighted(b: Belief) -> float:
    wl = b.weight * b.best_s
    return wl if math.isfinite(wl) else -1.0


class DynaTuneScheduler(ParamScheduler):
    name = "dynatune"
    defaults = {
        "c": 1.0,  # weight of the belief's standard deviation in the UCB
        "c_visit": 0.002,  # weight of the visit-count bonus (fraction of L_i)
        "warmup": 1,  # slots every (non-negligible) task gets before it competes
        "negligible": 1e-3,  # retire a task whose optimistic gain is below this fraction of the objective
        "min_points": 3,  # history points needed to fit a learning curve (fewer: prior)
        "prior_gain": 0.5,  # prior gain of an untuned task, as a fraction of L_i (mean and std)
        "prior_gain_tuned": 0.1,  # prior gain of a task with 1..min_points-1 points
        "prior_strength": 2.0,  # pseudo-observations of the fixed prior vs. the tasks' observed drops
        "stall_strength": 2.0,  # prior weight (in tasks) of the time-to-first-improvement model
        "fallback": "share",  # all tasks negligible: "share" (L_i / n_i) or "uncertain" (m_i + c s_i)
        "stop_when_negligible": False,  # all tasks left negligible: stop (True) or go on with the best
        # the belief model: "headroom" (roofline + jumps) or "curves" (learning curves)
        "belief_model": "headroom",
    }

    def __init__(self, seed: int = 0, **params):
        super().__init__(seed, **params)
        if self.fallback not in ("share", "uncertain"):
            raise DynatuneError(
                f"unknown fallback {self.fallback!r} for scheduler 'dynatune'", "use 'share' or 'uncertain'"
            )
        self.model = make_beliefs(
            self.belief_model,
            min_points=self.min_points,
            prior_gain=self.prior_gain,
            prior_gain_tuned=self.prior_gain_tuned,
            prior_strength=self.prior_strength,
            stall_strength=self.stall_strength,
        )
        self.decisions = 0
        self._table: list[Belief] = []
        self._table_key = None

    def _evaluate(self, ctx: RoundContext) -> list[Belief]:
        key = (ctx.round, ctx.elapsed_s, ctx.slot_s, tuple((t.visits, t.exhausted) for t in ctx.tasks))
        if key == self._table_key:
            return self._table
        self.model.observe(ctx.tasks, ctx.slot_s)
        bests = [t.best_s for t in ctx.tasks]
        objective = math.fsum(t.weight * b for t, b in zip(ctx.tasks, bests) if math.isfinite(b))
        total = sum(t.visits for t in ctx.tasks)
        log_n = math.log(max(total, 1) + 1.0)
        table = []
        for t, best in zip(ctx.tasks, bests):
            wl = t.weight * best
            if t.exhausted:
                table.append(
                    Belief(t.index, t.name, t.weight, best, 0.0, 0.0, -math.inf, t.visits, True, "exhausted")
                )
                continue
            bound = self.model.limit(t)
            if bound:  # nothing left to gain: no slot while another task can gain
                table.append(
                    Belief(t.index, t.name, t.weight, best, 0.0, 0.0, 0.0, t.visits, True, bound, True)
                )
                continue
            mean, std, note = self.model.predict(t, ctx.slot_s, best)
            if not math.isfinite(best):  # no latency measured: warmed up last, then only as a fallback
                table.append(Belief(t.index, t.name, t.weight, best, 0.0, 0.0, 0.0, t.visits, False, note))
                continue
            optimistic = mean + self.c * std
            retired = optimistic < self.negligible * objective
            bonus = self.c_visit * wl * math.sqrt(log_n / max(t.visits, 1))
            score = optimistic + bonus
            table.append(
                Belief(
                    t.index,
                    t.name,
                    t.weight,
                    best,
                    mean,
                    std,
                    score,
                    t.visits,
                    retired,
                    "negligible" if retired else note,
                )
            )
        self._table, self._table_key = table, key
        return table

    def choose(self, ctx: RoundContext) -> int | None:
        table = self._evaluate(ctx)
        alive = [b for b in table if not b.retired]
        if not alive:
            if self.stop_when_negligible:
                return None
            alive = [b for b, t in zip(table, ctx.tasks) if not t.exhausted]  # negligible ones
            alive = [b for b in alive if not b.at_bound] or alive  # at a bound: only when all are
            if not alive:
                return None
            if self.fallback == "share":
                # the beliefs no longer tell the tasks apart: share slots by weighted latency per visit
                return max(alive, key=lambda b: (_weighted(b) / max(b.visits, 1), -b.task)).task
            # nothing is worth a slot by its belief: probe the most uncertain curve (no visit bonus)
            return max(alive, key=lambda b: (b.gain_mean_s + self.c * b.gain_std_s, -b.task)).task
        cold = [b for b in alive if b.visits < self.warmup]
        if cold:  # warm-up, heaviest weighted latency first
            return max(cold, key=lambda b: (_weighted(b), -b.task)).task
        return max(alive, key=lambda b: (b.score, -b.task)).task

    def after_round(self, ctx: RoundContext, choice: int) -> None:
        self.decisions += 1

    def beliefs(self, ctx: RoundContext) -> list[Belief]:
        return list(self._evaluate(ctx))

    @property
    def gain_beliefs(self):
        return self.model

    def state_dict(self) -> dict:
        # beliefs are a pure function of the task histories: nothing else to save
        return {"decisions": self.decisions}

    def load_state_dict(self, state: dict) -> None:
        self.decisions = int(state.get("decisions", 0))
        self.model.clear()
        self._table_key = None
