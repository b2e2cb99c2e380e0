"""A task's first batch without the evolutionary search: its head, then random samples of its design space.

A task's first batch measures its head first: the analytic or streaming candidates
(:mod:`dynatune.search.analytic`), or the records the schedule library transfers. MetaSchedule's
evolutionary search filled the rest of the batch: a population of 64 sampled, mutated and ranked by the
cost model, to pick the 4 to 6 candidates left. That search cost about 1 s per task, and the coverage pass
gives every task such a batch: 42 of a 240 s run's seconds were the coverage pass's search (mnasnet0_5,
35 tasks). Its picks, ranked by a cost model that has not yet seen the task, beat the head in 14 of 151
first batches (five 240 s runs of squeezenet1_1 and mnasnet0_5 in session 23, by 3-92 %: a classifier,
a mean, a few convolutions; BENCHMARKS.md, session 24). So the rest of a first batch is drawn at random
from the task's design space, as MetaSchedule's own initial population is (each space's trace replayed
with its sampling decisions drawn anew, then the postprocessors), at a few milliseconds per candidate. The
cost model still learns the task from the whole batch, and the evolutionary search takes over from the
task's second batch.
"""

from __future__ import annotations

ATTEMPTS_PER_CANDIDATE = 4  # samples drawn per candidate wanted: a postprocessor rejects some, some repeat


def sampled_candidates(mod, spaces, postprocs, n: int, seed: int, exclude=()) -> list:
    """Up to ``n`` structurally distinct MeasureCandidates drawn at random from ``spaces`` (the task's
    design spaces, taken in turn), none of them one of the ``exclude`` candidates; reproducible for a
    ``seed``."""
    from tvm.s_tir import Trace

    from dynatune.search.reapply import distinct_candidates, reapply

    if n <= 0 or not spaces:
        return []
    blanks = [Trace(space.trace.insts, {}) for space in spaces]  # no decisions: each is sampled anew
    draws = (
        reapply(mod, blanks[k % len(blanks)], postprocs, seed=(seed * 100_003 + k) % (2**31 - 1))
        for k in range(n * ATTEMPTS_PER_CANDIDATE)
    )
    return distinct_candidates(draws, n, exclude)
