"""The search space a task is tuned in: MetaSchedule's own rules for the target, with the unroll steps the
session chooses (``search.unroll_steps``).

MetaSchedule's CPU rules let the search unroll each block's loops by 0, 16, 64 or 512 steps
(``ParallelizeVectorizeUnroll``). On a task that tiles a block (a convolution, a matmul: MetaSchedule's
multi-level tiling), a 512-step kernel took about twice the others' build time on average (squeezenet1_1
and mnasnet0_5: 0.24-0.26 s against 0.11-0.14 s; session 19's 35 s build was one of them), and it was the
best kernel of 6 of their 52 tiled tasks, by 1-62 % (BENCHMARKS.md, session 20). So a tiled task's search
samples from ``search.unroll_steps``, (0, 16, 64) by default. A task that tiles no block (a pooling, a
mean, a softmax) keeps MetaSchedule's own steps: a small reduction unrolled whole ran up to 3.9x faster
there (squeezenet1_1's global average pool), and its builds are cheap. A trace recorded with 512 steps
keeps its own choices when it is replayed (a trace carries its candidates): nothing recorded is lost.
``search.unroll_steps: [0, 16, 64, 512]`` gives every task MetaSchedule's own space.
"""

from __future__ import annotations

UNROLL_STEPS = (0, 16, 64)


def post_order_apply(mod, target, unroll_steps=UNROLL_STEPS):
    """The space generator MetaSchedule's ``"post-order-apply"`` would give ``mod`` on ``target``; if
    ``mod`` tiles a block, its loops unrolled by one of ``unroll_steps``."""
    return search_space(mod, target, unroll_steps)[0]


def search_space(mod, target, unroll_steps=UNROLL_STEPS, defer_layout_rewrite: bool = False):
    """(:func:`post_order_apply`'s space generator, the postprocessors deferred to the candidates built).
    With ``defer_layout_rewrite``, the generator's postprocessors leave out the layout rewrite, which the
    second item holds (:mod:`dynatune.search.layout_rewrite`); else nothing is deferred."""
    from tvm.s_tir import meta_schedule as ms

    from dynatune.model.outer_reduction import register_rule
    from dynatune.search.layout_rewrite import split_postprocs

    register_rule()  # the custom rule a marked block names (model.outer_reduction)
    defaults = ms.TuneContext(mod=mod, target=target, space_generator="post-order-apply", num_threads=1)
    rules = defaults.space_generator.sch_rules
    if any(tiles_a_block(space) for space in defaults.generate_design_space()):
        rules = [with_unroll_steps(rule, unroll_steps) for rule in rules]
    else:
        rules = [rule.clone() for rule in rules]
    postprocs, deferred = "from-target", []
    if defer_layout_rewrite:
        postprocs, deferred = split_postprocs(defaults.space_generator.postprocs)
        postprocs = [p.clone() for p in postprocs]
    generator = ms.space_generator.PostOrderApply(
        sch_rules=rules, postprocs=postprocs, mutator_probs="from-target"
    )
    return generator, deferred


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


def tiles_a_block(space) -> bool:
    """Whether a design space tiles a block (MetaSchedule's multi-level tiling: a convolution, a matmul)."""
    return "meta_schedule.tiling_structure" in str(space.trace)
