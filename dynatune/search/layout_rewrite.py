"""The weights' layout rewrite, applied to the candidates a batch builds rather than to every schedule the
search ranks (issue #29: the search's per-schedule cost).

MetaSchedule's CPU postprocessors end with ``RewriteLayout``: each weight is re-laid in the order the
schedule reads it (the layout weight pre-packing then gives the compiled model). The evolutionary search
runs every postprocessor on every schedule it draws, about eight per measured candidate (initial
population and mutants), though only the batch's picks are ever built. The rewrite was the costliest of
them: 4.1 ms of a 3x3 convolution's 17 ms per schedule, 2.2 ms of a 1x1's 8 (BENCHMARKS.md, session 29).

So the session's search runs the other postprocessors only, and ranks schedules by the features of the
schedule before its rewrite; each candidate a batch builds is finished here: its schedule copied and
rewritten, the copy built, measured and recorded (its trace holds the rewrite, as MetaSchedule's own
records do, so the compile applies the record as it is). The cost model learns from the unrewritten
candidate, as it ranked it. The rewrite is the last postprocessor, so the finished schedule is the one
MetaSchedule's search would have given.
"""

from __future__ import annotations

REJECTED = "build: the layout rewrite rejected the schedule"


def split_postprocs(postprocs) -> tuple[list, list]:
    """(the search's postprocessors, the ones deferred to the candidates built): ``RewriteLayout`` when
    it is the last of ``postprocs``, else nothing deferred."""
    from tvm.s_tir.meta_schedule.postproc import RewriteLayout

    postprocs = list(postprocs)
    if postprocs and isinstance(postprocs[-1], RewriteLayout):
        return postprocs[:-1], postprocs[-1:]
    return postprocs, []


def finish_candidates(cands, deferred, threads: int = 1) -> list:
    """Per candidate, the MeasureCandidate to build: a copy of its schedule with the ``deferred``
    postprocessors applied (``None`` where one rejects it); ``cands`` themselves when nothing is
    deferred. ``threads``: how many candidates are finished at once (TVM's calls release the GIL, and
    MetaSchedule's own search applies the same postprocessors from several threads); the order is kept."""
    from concurrent.futures import ThreadPoolExecutor

    from dynatune.search.reapply import measure_candidate

    if not deferred:
        return list(cands)

    def finish(c):
        sch = c.sch.copy()
        try:
            ok = all(p.apply(sch) for p in deferred)
        except Exception:  # a postprocessor that raises rejects the schedule, as the search's do
            ok = False
        return measure_candidate(sch) if ok else None

    if threads <= 1 or len(cands) <= 1:
        return [finish(c) for c in cands]
    with ThreadPoolExecutor(min(threads, len(cands))) as pool:
        return list(pool.map(finish, cands))
