"""Transfer: a task the library has never seen starts from the best schedules of the most similar tasks it
has (the same fused operators at other shapes), as in transfer-tuning (Gibson & Cano, PACT'22).

Each source trace is re-applied to the new task's workload with its tile sizes refitted to the new loop
extents (:func:`refit_tiles`); a trace that does not apply, or that MetaSchedule's postprocessors reject, is
dropped. The ones that survive are measured as the first part of the task's next batch, and the search's own
candidates fill the rest (:attr:`dynatune.search.session.TuningSession.first_candidates`).
"""

from __future__ import annotations

import re


def task_pattern(name: str) -> str:
    """A task's fused operators, its shapes left out: ``fused_conv2d7_add4_relu41`` ->
    ``fused_conv2d_add_relu``."""
    return "_".join(re.sub(r"(?<=[a-z])\d+$", "", part) for part in name.split("_"))


def refit_tiles(old: list[int], extent: int, max_innermost: int = -1) -> list[int]:
    """Tile sizes for a loop of ``extent`` as close as possible to ``old`` (tiles of another extent), from the
    innermost out: each inner tile is the largest divisor of what is left that is at most its old size (and
    at most ``max_innermost`` for the innermost one); the outermost takes the rest. Their product is
    ``extent``."""
    n = len(old)
    out = [1] * n
    rest = extent
    for i in range(n - 1, 0, -1):
        cap = max(1, int(old[i]))
        if i == n - 1 and max_innermost > 0:
            cap = min(cap, max_innermost)
        out[i] = max(d for d in range(1, min(cap, rest) + 1) if rest % d == 0)
        rest //= out[i]
    out[0] = rest
    return out


def _refitting(sch):
    """A decision provider for ``Trace.apply_to_schedule``: tile decisions refitted to the loops they
    split."""

    def provide(inst, inputs, attrs, decision):
        if inst.kind.name != "SamplePerfectTile" or decision is None:
            return decision
        extent = int(sch.get(inputs[0]).extent)
        return refit_tiles([int(x) for x in decision], extent, int(attrs[1]))

    return provide


def transferred_candidates(mod, sources, postprocs, limit: int, seed: int = 1) -> list:
    """Up to ``limit`` distinct MeasureCandidates for ``mod`` (an IRModule with ``main``) re-applied from
    ``sources`` (``[(workload json, record json), ...]``, best first)."""
    from dynatune.search.reapply import distinct_candidates, reapply

    def schedules():
        for k, (wl_json, rec_json) in enumerate(sources):
            trace = _trace(wl_json, rec_json)
            if trace is not None:
                yield reapply(mod, trace, postprocs, _refitting, seed=seed + k)

    return distinct_candidates(schedules(), limit)


def _trace(wl_json, rec_json):
    from tvm.s_tir.meta_schedule.database import TuningRecord, Workload

    try:
        return TuningRecord.from_json(rec_json, Workload.from_json(wl_json)).trace
    except Exception:  # a record of another TVM version: not transferable
        return None
