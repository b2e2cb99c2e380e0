"""A reduction over a tensor's outer axes that keeps its innermost axis, scheduled as a vector loop over that
axis (CPU targets, ``compile.outer_reduction``).

A global average pool in NHWC (an EfficientNet's squeeze-excite ``mean``, a classifier's pooling) sums a
``[1, H, W, C]`` tensor over ``H`` and ``W``. TOPI writes it as one reduction block whose loops put the
channel outermost and the reduction innermost, and MetaSchedule's CPU rules only split, reorder nothing,
and vectorize an innermost *spatial* loop: every design space they give sums each channel with scalar
loads ``C`` floats apart. On the EfficientNet-like model's 112x112x32 mean the best of 40 candidates took
107 us (15 GB/s); its three largest means were 0.30 ms of a 3.7 ms model (BENCHMARKS.md, #55).

The lowering marks each such block (:func:`mark_pass`: a sum, max or min over every axis but the innermost,
whose other axes are 1, over at least :data:`MIN_REDUCED` elements) with the block annotation
``schedule_rule: dynatune_outer_reduction``. MetaSchedule's ``ApplyCustomRule`` then builds the block's
design spaces with :func:`outer_reduction_space` alone (registered for the CPU target keys by
:func:`register_rule`). In both, the innermost axis is a vector loop *inside* the reduction: each step loads
whole vectors of consecutive channels, as the data lies in memory, and adds them to running sums.

- **By channels**: each parallel job sums a run of channels over the whole reduction, and computes the
  block's consumer (a mean's division) for them: one pass, one parallel region.
- **By slices** (``RFactor``): the reduced axes fused and split into contiguous slices, each parallel job
  summing one slice for a run of channels into its own partial sums; a short second pass adds them up. For
  few channels (32 channels are two jobs of 16) over a large map.

The search samples the vector loop's width (divisors of the channels up to :data:`MAX_VECTOR`, whole vectors
of :data:`VECTOR_STEP` floats where it can) and the slices (divisors of the reduced extent up to
:data:`MAX_PARTS`). The EfficientNet-like model's three largest means (112x112x32, 56x56x144, 56x56x96) took
5.1, 8.7 and 3.7 us alone after a 5-minute run, where the generic spaces' best had taken 107, 72 and 75 us.

The mark is part of the task (its key changes): a mean tuned before the mark is another task.
"""

from __future__ import annotations

import math

from dynatune.machine.register_block import divisors

RULE = "dynatune_outer_reduction"  # the block annotation's value, and the rule's name
MIN_REDUCED = 64  # fewer elements reduced per output: left to MetaSchedule's own rules
MAX_PARTS = 64  # the most slices the reduction is split into (one parallel job each)
MAX_VECTOR = 64  # the widest vector loop, in elements
VECTOR_STEP = 8  # the vector loop's width is a multiple of this where the channels allow
REDUCERS = ("Add", "Max", "Min")  # what RFactor can split


def outer_reduction_axes(realize) -> tuple[int, list[int]] | None:
    """For an ``SBlockRealize``: (the index of the block's innermost kept axis, the indices of its reduced
    axes) when it is an outer reduction :func:`mark_pass` marks, else ``None``."""
    block = realize.block
    iters = list(block.iter_vars)
    reads = [r for r in block.reads if not any(r.source.same_as(w.source) for w in block.writes)]
    if block.init is None or len(reads) != 1 or len(block.writes) != 1 or len(iters) < 2:
        return None
    if type(block.body).__name__ != "BufferStore" or type(block.body.value).__name__ not in REDUCERS:
        return None
    if not all(type(v).__name__ == "Var" for v in realize.iter_values):
        return None  # bound to expressions of loops: not TOPI's plain nest
    kinds = [int(iv.iter_type) for iv in iters]  # 0: spatial, 2: reduction
    spatial = [i for i, k in enumerate(kinds) if k == 0]
    reduced = [i for i, k in enumerate(kinds) if k == 2]
    if not spatial or reduced != list(range(len(spatial), len(iters))):
        return None  # the reduced axes are not the innermost loops, which are fused
    last = reads[0].region[-1].min
    inner = next((i for i in spatial if iters[i].var.same_as(last)), None)
    try:
        extents = [int(iv.dom.extent) for iv in iters]
    except TypeError:  # a symbolic extent (an unbound batch)
        return None
    if inner is None or any(extents[i] != 1 for i in spatial if i != inner):
        return None
    return (inner, reduced) if math.prod(extents[i] for i in reduced) >= MIN_REDUCED else None


def _realizes(func) -> list:
    import tvm_ffi
    from tvm.s_tir import SBlockRealize

    found = []
    tvm_ffi.structural_walk(func.body, ((SBlockRealize,), found.append))
    return found


def mark(func):
    """``func`` (a PrimFunc) with each outer reduction's block annotated with :data:`RULE` (the same
    function when it has none)."""
    from tvm import s_tir

    found = [r for r in _realizes(func) if outer_reduction_axes(r) is not None]
    if not found:
        return func
    sch = s_tir.Schedule(func)
    for realize in found:
        block = sch.get_sblock(realize.block.name_hint)
        loop_vars = [sch.get(loop).loop_var for loop in sch.get_loops(block)]
        if all(a.same_as(b) for a, b in zip(loop_vars, realize.iter_values)) and len(loop_vars) == len(
            realize.iter_values
        ):  # TOPI's nest: one loop per axis, in the axes' order
            sch.annotate(block, "schedule_rule", RULE)
    return sch.mod["main"]


def mark_pass():
    """A module pass: :func:`mark` on every PrimFunc (run after legalization, before fusion)."""
    import tvm
    from tvm import tirx

    @tvm.transform.module_pass(opt_level=0, name="MarkOuterReductions")
    def _mark(mod, _ctx):
        for gv, func in list(mod.functions.items()):
            if isinstance(func, tirx.PrimFunc):
                marked = mark(func)
                if not marked.same_as(func):
                    mod[gv] = marked
        return mod

    return _mark


def vector_widths(channels: int) -> list[int]:
    """The vector loop's widths the search samples: divisors of ``channels`` up to :data:`MAX_VECTOR`,
    multiples of :data:`VECTOR_STEP` where there are any, else the widest."""
    widths = [d for d in divisors(channels) if d <= MAX_VECTOR]
    return [w for w in widths if w % VECTOR_STEP == 0] or widths[-1:]


def part_counts(reduced: int) -> list[int]:
    """The numbers of slices the search samples: divisors of ``reduced`` from 2 to :data:`MAX_PARTS`
    (``[1]`` when there are none)."""
    return [d for d in divisors(reduced) if 2 <= d <= MAX_PARTS] or [1]


def _sample(sch, values: list[int]):
    return sch.sample_categorical(values, [1.0 / len(values)] * len(values))


def outer_reduction_space(sch, block) -> list:
    """The rule: ``block``'s design spaces, as the module's docstring says: by channels, and by slices."""
    realize = next(r for r in _realizes(sch.mod["main"]) if r.block.same_as(sch.get(block)))
    inner, reduced = outer_reduction_axes(realize)
    extents = [int(iv.dom.extent) for iv in realize.block.iter_vars]
    sch.unannotate(block, "schedule_rule")
    loops = sch.get_loops(block)  # one per axis, in the axes' order (:func:`mark`)
    fused = sch.fuse(*[loops[i] for i in reduced]) if len(reduced) > 1 else loops[reduced[0]]
    by_slices = sch.copy()
    _by_channels(sch, block, loops[inner], fused, extents[inner])
    total = math.prod(extents[i] for i in reduced)
    spaces = [sch]
    if part_counts(total) != [1]:
        _by_slices(by_slices, block, inner, fused, total, extents[inner])
        spaces.append(by_slices)
    return spaces


def _by_channels(sch, block, channel, reduction, channels: int) -> None:
    """Each parallel job sums a run of channels over the whole reduction, a vector of them at a time, and
    computes the block's consumer (a mean's division) for them."""
    outer, vector = sch.split(channel, [None, _sample(sch, vector_widths(channels))])
    sch.reorder(outer, reduction, vector)
    sch.parallel(outer)
    sch.vectorize(vector)
    _consumer_at(sch, block, outer)


def _by_slices(sch, block, inner: int, reduction, total: int, channels: int) -> None:
    """Each parallel job sums one slice of the reduction for a run of channels into its own partial sums
    (``RFactor``); a second pass adds the slices up, a vector of channels at a time."""
    part, within = sch.split(reduction, [_sample(sch, part_counts(total)), None])
    partial = sch.rfactor(part, 0)
    *kept, part, within = sch.get_loops(partial)  # a copy of the nest: the kept axes, then the two
    width = _sample(sch, vector_widths(channels))
    outer, vector = sch.split(kept[inner], [None, width])
    sch.reorder(part, outer, within, vector)
    sch.parallel(sch.fuse(part, outer))
    sch.vectorize(vector)
    *kept, part = sch.get_loops(block)
    outer, vector = sch.split(kept[inner], [None, width])
    sch.reorder(outer, part, vector)
    sch.vectorize(vector)
    _consumer_at(sch, block, outer)


def _consumer_at(sch, block, loop) -> None:
    """The block's one consumer (a mean's division) computed under ``loop``, where it can be."""
    from tvm.s_tir.schedule import ScheduleError

    consumers = sch.get_consumers(block)
    if len(consumers) == 1:
        try:
            sch.reverse_compute_at(consumers[0], loop)
        except ScheduleError:
            pass


CPU_KEYS = ("cpu", "arm_cpu")  # the target keys MetaSchedule may look the rule up by on a CPU (x86, Arm)


def register_rule() -> None:
    """Register :func:`outer_reduction_space` as MetaSchedule's custom rule :data:`RULE` for CPU targets
    (again is harmless)."""
    import tvm

    for key in CPU_KEYS:
        tvm.register_global_func(f"s_tir.meta_schedule.{key}.{RULE}", outer_reduction_space, override=True)
