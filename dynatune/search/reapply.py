"""Re-applying a trace to a task with chosen decisions: how a candidate that no search sampled (an analytic
schedule, a schedule transferred from another task) enters MetaSchedule's search space.

The trace is one of the task's design spaces (or a record's trace); a *decision provider* picks each
sampling instruction's decision (``Trace.apply_to_schedule``). MetaSchedule's postprocessors then run as
they do on the search's own candidates, so the result is measured, recorded and mutated like any other.
"""

from __future__ import annotations


def reapply(mod, trace, postprocs, provider_for=None, seed: int = 1):
    """``trace`` applied to ``mod`` and ``postprocs`` run, or ``None`` when the trace does not fit ``mod``
    or a postprocessor rejects the result. ``provider_for(sch)`` gives the decision provider for the
    schedule the trace is applied to (its random variables are that schedule's); without it, the trace's
    own decisions are kept."""
    from tvm.s_tir import Schedule

    try:
        sch = Schedule(mod, seed=seed, debug_mask="none")
        provider = provider_for(sch) if provider_for is not None else None
        trace.apply_to_schedule(sch, remove_postproc=True, decision_provider=provider)
        sch.enter_postproc()
        if not all(p.apply(sch) for p in postprocs):
            return None
    except Exception:  # another loop nest, a block it lacks, a decision out of range
        return None
    return sch


def measure_candidate(sch):
    """A MeasureCandidate of a scheduled task, its arguments as the scheduled function takes them
    (RewriteLayout, weight pre-packing, changes the weights' shapes, as the search's own candidates take
    them)."""
    from tvm.s_tir.meta_schedule.arg_info import ArgInfo
    from tvm.s_tir.meta_schedule.search_strategy import MeasureCandidate

    return MeasureCandidate(sch, ArgInfo.from_entry_func(sch.mod, remove_preproc=True))


def distinct_candidates(schedules, limit: int, exclude=(), seen: set | None = None) -> list:
    """MeasureCandidates of the first ``limit`` structurally distinct schedules (``None`` skipped), none
    of them structurally one of the ``exclude`` candidates, nor one whose structural hash is in ``seen``
    (a caller's set, which the hashes of those returned join)."""
    from tvm_ffi import structural_hash

    out = []
    seen = seen if seen is not None else set()
    seen.update(structural_hash(c.sch.mod) for c in exclude)
    for sch in schedules:
        if len(out) >= limit:
            break
        if sch is None:
            continue
        h = structural_hash(sch.mod)
        if h not in seen:
            seen.add(h)
            out.append(measure_candidate(sch))
    return out
