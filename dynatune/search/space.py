"""The search space a task is tuned in: MetaSchedule's own rules for the target, with the unroll steps the
session chooses (``search.unroll_steps``).

MetaSchedule's CPU rules let the search unroll each block's loops by 0, 16, 64 or 512 steps
(``ParallelizeVectorizeUnroll``). The 512-step kernels cost the most to build: 0.34 s on average against
0.11-0.14 s for the others, 2.5-3x, and every build that ran for tens of seconds was one of them. In the
recorded runs they won no task (BENCHMARKS.md, session 20). Their builds were about a third of the build
time for 15 % of the candidates. So by default the search samples from (0, 16, 64). A trace recorded with
512 steps keeps its own choices when it is replayed (a trace carries its candidates), so nothing recorded
is lost. ``search.unroll_steps: [0, 16, 64, 512]`` restores MetaSchedule's own space.
"""

from __future__ import annotations

UNROLL_STEPS = (0, 16, 64)


def post_order_apply(mod, target, unroll_steps=UNROLL_STEPS):
    """The space generator MetaSchedule's ``"post-order-apply"`` would give ``mod`` on ``target``, its
    loops unrolled by one of ``unroll_steps``."""
    from tvm.s_tir import meta_schedule as ms

    defaults = ms.TuneContext(mod=mod, target=target, space_generator="post-order-apply", num_threads=1)
    rules = [with_unroll_steps(rule, unroll_steps) for rule in defaults.space_generator.sch_rules]
    return ms.space_generator.PostOrderApply(
        sch_rules=rules, postprocs="from-target", mutator_probs="from-target"
    )


def with_unroll_steps(rule, unroll_steps):
    """A new copy of ``rule``; a parallelize-vectorize-unroll rule's copy samples ``unroll_steps``."""
    from tvm.s_tir import meta_schedule as ms

    if not isinstance(rule, ms.schedule_rule.ParallelizeVectorizeUnroll):
        return rule.clone()
    return ms.schedule_rule.ParallelizeVectorizeUnroll(
        max_jobs_per_core=int(rule.max_jobs_per_core),
        max_vectorize_extent=int(rule.max_vectorize_extent),
        unroll_max_steps=[int(s) for s in unroll_steps],
        unroll_explicit=bool(rule.unroll_explicit),
    )
