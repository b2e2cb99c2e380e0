"""A task's evolutionary search after its first batch, its initial population carried from batch to batch.

MetaSchedule's ``EvolutionarySearch`` builds each batch's initial population anew: the database's best
records (``init_measured_ratio`` of the population: 12 of 64) and random samples of the design space (the
other 52), every trace replayed and post-processed (2-11 ms each on one core), before one generation of
mutation ranked by the cost model picks the batch. In a 240 s squeezenet1_1 run that search was 44 % of the
tuning time, and about a quarter of it went to the initial population (BENCHMARKS.md, sessions 19, 23 and 25).

:class:`CarriedPopulation` runs the same steps through MetaSchedule's own C++ (``SampleInitPopulation`` and
``EvolveWithCostModel``, the functions its search calls, exported for this), with two changes:

- the database's best records are replayed once each, and their schedules kept while they stay among the
  best;
- the random samples are kept from batch to batch: each batch draws ``fresh`` new ones (MetaSchedule's
  ``init_min_unmeasured``, 16) in place of the oldest, so a sample serves about three batches as a parent
  before it is replaced.

The population's size, the mutation, the ranking and the picks are MetaSchedule's: ``EvolveWithCostModel``
returns the batch's best-ranked schedules none of which was returned before, ``eps_greedy`` of a batch are
random samples, and the search ends for a task when it finds nothing new. The random draws come from the
task's ``TuneContext``, as MetaSchedule's own do.

Off by default (``search.carry_population``). It measures 8-16 % more candidates in 240 s (squeezenet1_1 and
mnasnet0_5, two seeds each) with models as fast (carry / anew of the same seed 0.988-1.014), but after 900 s
its squeezenet1_1 model was 1.055x the time of the search that draws its population anew (BENCHMARKS.md,
session 26): fewer fresh samples per batch explore less, and a longer run pays for it.
"""

from __future__ import annotations

import random

_EVOLUTIONARY_SEARCH = "s_tir.meta_schedule.SearchStrategyEvolutionarySearch"  # its exported steps


class CarriedPopulation:
    """One task's batches after its first (:meth:`candidates`), from the task's pre-tuned ``ctx`` (its
    evolutionary search holds the state: the measured set, the random state, the cost model) and ``database``
    (a MetaSchedule database holding the task's ``workload``); ``fresh`` random samples are drawn anew per
    batch."""

    def __init__(self, ctx, database, workload, *, measured_ratio: float, fresh: int, max_trials: int):
        import tvm

        self.ctx, self.database, self.workload = ctx, database, workload
        self.strategy = ctx.search_strategy
        self.size = int(self.strategy.population_size)
        self.best_count = int(self.size * measured_ratio)  # as MetaSchedule's search counts them
        self.fresh, self.max_trials, self.generated = fresh, max_trials, 0
        self._sample = tvm.get_global_func(f"{_EVOLUTIONARY_SEARCH}SampleInitPopulation")
        self._evolve = tvm.get_global_func(f"{_EVOLUTIONARY_SEARCH}EvolveWithCostModel")
        self._best: dict = {}  # a best record's trace -> its schedule (None: it did not apply)
        self.samples: list = []  # the random samples carried, newest first
        self.drawn: list[int] = []  # per batch, the random samples asked for
        self.replays = 0  # best records replayed
        self._returned: set[int] = set()  # structural hashes of the schedules returned
        self._rng = random.Random(int(ctx.rand_state))  # the random picks (eps_greedy)

    def candidates(self, n: int) -> list:
        """The next ``n`` (at most) MeasureCandidates; ``[]`` when the search finds nothing new or has given
        the task its ``max_trials``. As MetaSchedule picks them: the best-ranked, and ``eps_greedy`` of the
        batch (rounded down) random samples of the population."""
        from dynatune.search.reapply import distinct_candidates

        n = min(n, self.max_trials - self.generated)
        if n <= 0:
            return []
        best = self._best_schedules()
        wanted = max(self.fresh, self.size - len(best) - len(self.samples))
        self.drawn.append(wanted)
        fresh = list(self._sample(self.strategy, wanted))
        self.samples = (fresh + self.samples)[: max(0, self.size - len(best))]
        if not self.samples:
            return []
        randoms = int(n * float(self.strategy.eps_greedy))
        ranked = self._evolve(self.strategy, best + self.samples, n - randoms) if n > randoms else []
        # the evolution knows its own picks, not the random ones: both checked against all returned
        picks = distinct_candidates(ranked, n, seen=self._returned)
        shuffled = self._rng.sample(self.samples, len(self.samples))
        picks += distinct_candidates(shuffled, n - len(picks), seen=self._returned)
        self.generated += len(picks)
        return picks

    def _best_schedules(self) -> list:
        """The database's best records of the task, post-processed, each replayed only once."""
        from dynatune.search.reapply import reapply

        postprocs = self.ctx.space_generator.postprocs
        kept = {}
        records = self.database.get_top_k(self.workload, self.best_count) if self.best_count > 0 else []
        for record in records:
            trace = record.trace
            if trace not in self._best:
                self.replays += 1
                self._best[trace] = reapply(self.ctx.mod, trace, postprocs)
            kept[trace] = self._best[trace]
        self._best = kept
        return [s for s in kept.values() if s is not None]
