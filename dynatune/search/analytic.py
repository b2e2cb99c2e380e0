"""Analytic first candidates: a register-blocked kernel derived from the target, not searched for.

MLAS and oneDNN get near the peak with a micro-kernel whose shape follows from the vector unit: the
accumulators fill the vector registers, each reduction step loads a few weight vectors and broadcasts one
input per row, and the threads split the output tiles. MetaSchedule's multi-level tiling (``SSRSRS`` on
CPU) can express exactly that kernel, but the evolutionary search finds it only after thousands of trials.
So for every task whose design space tiles a block (convolutions of any kind, dense, matmul, batch
matmul), this module *chooses* the design space's decisions:

- the innermost spatial tile (``S3``) is the register block: the output's innermost axis (channels in NHWC,
  columns in a matmul) as whole vectors, times rows taken from the next axes (width, then height), so that
  ``rows x vectors`` accumulators fill the registers the target has
  (:attr:`~dynatune.machine.vector.VectorUnit.accumulators`), with enough independent FMAs to hide their
  latency (:mod:`dynatune.machine.register_block` scores the blocks);
- the inner reduction tile (``R1``) is 1: each step is one broadcast per row and one load per weight
  vector (AVX-512 folds the broadcast into the FMA), and the whole reduction runs on the accumulators;
- the outer spatial tiles (``S0``) give the threads balanced jobs, ``S1`` walks the tiles of a job, and
  the epilogue (bias, activation, residual add) is computed per register block;
- loops up to 64 steps are unrolled;
- a producer stage (a convolution's padding) is computed once, at the root, in its own pass: a dense
  convolution reads each input value once per output channel, which that pass pays for. Each register block
  also gives a second candidate with the producer inlined, its reads bounds-checked where the block reads
  the input: a depthwise convolution reads each value for one channel only, and the extra pass made its
  kernel 2-6x slower (mnasnet0_5's 5x5 and 3x3 depthwise convolutions; inlined padding made squeezenet1_1's
  3x3 convolutions up to 2x slower: BENCHMARKS.md, session 23). The first batch measures both.

The weights are pre-packed in the order the kernel reads them by MetaSchedule's ``RewriteLayout``, as for
any other candidate. The candidate is a trace of the task's own design space
(:mod:`dynatune.search.reapply`): it is measured in the task's first batch, recorded like any other, and
the evolutionary search mutates from it. A tiled shape the plan does not fit (a design space of another
structure) gets no analytic candidate, and the search goes on as before.

A task that tiles no block (a pooling, a reduction over the spatial axes, a transpose: memory-bound) gets
*streaming* candidates instead (:func:`streaming_candidates`): the design space that splits no reduction
(no ``RFactor``), every producer (a pooling's padding) inlined into its consumer, so each output vector is
computed from the input in one pass, with the unroll MetaSchedule's first choices give. On SqueezeNet's
max pools that space ran 1.4-4x faster than the ``RFactor`` one (13 against 18-39 us for the 55x55 ->
27x27 pool), and a pool's single slot of 8 candidates drew it only by chance (BENCHMARKS.md, session 18).
"""

from __future__ import annotations

from dataclasses import dataclass

from dynatune.machine.register_block import RegisterBlock, divisors, register_blocks

UNROLL_STEPS = 64  # the unroll decision: the register block and its epilogue unrolled, not the reduction
JOBS_PER_CORE = 8  # parallel jobs per core for balanced threads
ROOT, INLINE = -1, -2  # SampleComputeLocation's decisions: a producer in its own pass, or inlined
PRODUCER_PLACES = (ROOT, INLINE)  # the candidates each register block gives, in this order


@dataclass(frozen=True)
class TilePlan:
    """The decisions of one tiled block: a 4-level split per spatial loop, 2-level per reduction loop."""

    spatial: tuple[tuple[int, int, int, int], ...]
    reduction: tuple[tuple[int, int], ...]
    block: RegisterBlock


def plan_tiles(spatial: list[int], reduction: list[int], unit, cores: int, rank: int = 0) -> TilePlan | None:
    """The decisions for a block with these loop extents (spatial loops in the block's order, the output's
    innermost axis last): the ``rank``-th best register block (0 the best), or ``None`` without one."""
    if not spatial or not reduction:
        return None
    blocks = register_blocks(spatial, unit)
    if rank >= len(blocks):
        return None
    block = blocks[rank]
    inner = list(block.rows) + [block.columns]
    jobs, parallel, tiles = JOBS_PER_CORE * cores, 1, []
    for extent, s3 in zip(spatial, inner):
        rest = extent // s3
        want = max(1, -(-jobs // parallel))
        s0 = min([d for d in divisors(rest) if d >= want] or [rest])
        parallel *= s0
        tiles.append((s0, rest // s0, 1, s3))
    return TilePlan(tuple(tiles), tuple((e, 1) for e in reduction), block)


def planned_decisions(plan: TilePlan, producers: int = ROOT):
    """A decision provider (per schedule) that gives the plan's tiles, in the order the design space
    samples them (spatial loops 4-way, reduction loops 2-way), the unroll of :data:`UNROLL_STEPS`, and
    every compute location ``producers`` (:data:`ROOT` or :data:`INLINE`)."""

    def provider_for(sch):
        spatial, reduction = iter(plan.spatial), iter(plan.reduction)

        def provide(inst, inputs, attrs, decision):
            name = inst.kind.name
            if name == "SamplePerfectTile":
                return list(next(spatial) if int(attrs[0]) == 4 else next(reduction))
            if name == "SampleCategorical":  # the unroll's steps
                values = [int(v) for v in attrs[0]]
                return values.index(UNROLL_STEPS) if UNROLL_STEPS in values else decision
            if name == "SampleComputeLocation":
                return producers
            return decision

        return provide

    return provider_for


def tiled_loops(mod, space) -> tuple[list[int], list[int]] | None:
    """The extents of the loops ``space`` tiles (spatial, reduction, in sampling order), or ``None`` when
    it does not tile exactly one block with the CPU's ``SSRSRS`` structure."""
    insts = list(space.trace.insts)
    tiled = [
        i for i in insts if i.kind.name == "Annotate" and "meta_schedule.tiling_structure" in str(i.attrs)
    ]
    if len(tiled) != 1 or "SSRSRS" not in str(space.trace):
        return None
    extents: dict[int, list[int]] = {4: [], 2: []}

    def provider_for(sch):
        def record(inst, inputs, attrs, decision):
            if inst.kind.name == "SamplePerfectTile":
                extents.setdefault(int(attrs[0]), []).append(int(sch.get(inputs[0]).extent))
            return decision

        return record

    from dynatune.search.reapply import reapply

    if reapply(mod, space.trace, [], provider_for) is None or set(extents) != {4, 2}:
        return None
    return extents[4], extents[2]


def _consumer_depth(space) -> int:
    """How deep in the tiled loops the tiled block's consumer (its epilogue) is computed: -1 when it is
    not; the deepest, next to the register block, is best."""
    insts = list(space.trace.insts)
    tiles = next((i for i in reversed(insts) if i.kind.name == "Reorder"), None)
    at = next((i for i in insts if i.kind.name == "ReverseComputeAt"), None)
    if tiles is None or at is None:
        return -1
    loop = at.inputs[1]
    return next((k for k, rv in enumerate(tiles.inputs) if rv.same_as(loop)), -1)


def analytic_candidates(mod, spaces, postprocs, unit, cores: int, limit: int = 2) -> list:
    """The distinct analytic MeasureCandidates for task ``mod`` from its ``limit`` best register blocks,
    best first, each with its producers at the root and then inlined (:data:`PRODUCER_PLACES`; one
    candidate when it has none), from the design space in ``spaces`` that computes the epilogue nearest
    the register block; for a task that tiles no block, up to ``limit`` :func:`streaming_candidates`;
    ``[]`` when no space fits."""
    from dynatune.search.reapply import distinct_candidates, reapply
    from dynatune.search.space import tiles_a_block

    if unit is None or limit < 1:
        return []
    for space in sorted(spaces, key=_consumer_depth, reverse=True):
        loops = tiled_loops(mod, space)
        if loops is None:
            continue
        plans = [plan_tiles(*loops, unit, cores, rank) for rank in range(limit)]
        schedules = (
            reapply(mod, space.trace, postprocs, planned_decisions(p, at))
            for p in plans
            if p is not None
            for at in PRODUCER_PLACES
        )
        found = distinct_candidates(schedules, limit * len(PRODUCER_PLACES))
        if found:
            return found
    if any(tiles_a_block(space) for space in spaces):
        return []
    return streaming_candidates(mod, spaces, postprocs, limit)


def task_analytic_candidates(mod, target, limit: int = 2, unroll_steps=None) -> tuple[list, list]:
    """``mod``'s analytic candidates as a tuning session heads its first batch with them (the session's
    design space and unroll steps, the target's vector unit and cores), and that space's postprocessors:
    for a benchmark that times or counts them outside a session."""
    from tvm.s_tir import meta_schedule as ms

    from dynatune.machine.target import planned_cores
    from dynatune.machine.vector import vector_unit
    from dynatune.search import space

    generator = space.post_order_apply(mod, target, unroll_steps or space.UNROLL_STEPS)
    ctx = ms.TuneContext(mod=mod, target=target, space_generator=generator, num_threads=1)
    postprocs = ctx.space_generator.postprocs
    spaces, unit = ctx.generate_design_space(), vector_unit(target)
    return analytic_candidates(mod, spaces, postprocs, unit, planned_cores(target), limit), postprocs


def streaming_decisions(unroll: int):
    """A decision provider: every compute location inlined (``-2``), the ``unroll``-th unroll choice."""

    def provider_for(sch):
        def provide(inst, inputs, attrs, decision):
            name = inst.kind.name
            if name == "SampleCategorical":
                return min(unroll, len(attrs[0]) - 1)
            if name == "SampleComputeLocation":
                return INLINE
            return decision

        return provide

    return provider_for


def streaming_candidates(mod, spaces, postprocs, limit: int = 2) -> list:
    """Up to ``limit`` MeasureCandidates of a task that tiles no block: its design space with no split
    reduction, producers inlined, the first unroll choices (``[]`` when no space fits)."""
    from dynatune.search.reapply import distinct_candidates, reapply

    for space in spaces:
        if "RFactor" in str(space.trace):
            continue
        schedules = (reapply(mod, space.trace, postprocs, streaming_decisions(k)) for k in range(limit))
        found = distinct_candidates(schedules, limit)
        if found:
            return found
    return []
