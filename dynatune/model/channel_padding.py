"""Output channels padded to whole register blocks, where the padding costs little: after a global pooling,
or sliced off inside the convolution's own kernel.

A convolution vectorizes its output channels (NHWC). When their number is not a multiple of the target's
vector lanes, no tiling MetaSchedule can sample covers them with whole registers: SqueezeNet's
1000-channel classifier is 8 x 125 channels, and on AVX-512 (16 lanes) it ran at 1.11-1.24x ONNX
Runtime's kernel, which pads (BENCHMARKS.md, session 17), while the 3x3 convolutions beside it ran at
0.9-1.0x. When their vectors admit only a poor register block, the same holds. Here such a convolution gets
zero weights up to whole register blocks, and the padding is carried through what follows it channel by
channel (the bias add with a zero-padded bias, the activation, a global average pooling) until a slice
takes the real channels back.

How far: to the whole vectors, or one vector more, whichever lets the best register block
(:mod:`dynatune.machine.register_block`) compute more real channels per FMA. 1008 channels on a 13 x 13
output are 63 AVX-512 vectors: only a one-vector block of 13 rows fits, 14 loads for 13 FMAs, and on a CPU
with two 512-bit FMA pipes the kernel stayed at 1.12x ONNX Runtime's (BENCHMARKS.md, session 20). 1024 are
64 vectors: 13 rows x 2 vectors, for 1.6 % more FLOPs. On a 12 x 12 output, 20 channels become 32 on
AVX-512 and 24 on AVX2.

Where the slice lands:
- on a tensor of one pixel (after a global pooling): the padded channels cost their share of FLOPs (0.8-2.4 %
  for 1000 channels) and a copy of a few hundred floats, no more;
- inside the convolution's own kernel, for a convolution whose channels are not whole vectors at all
  (mnasnet0_5's 24, 40 and 72 on AVX-512: half-filled ymm registers, at most half the zmm peak). The
  padding is carried only through element-wise operators that each have the one user (the bias add, the
  activation), so the slice, and what reads it (a residual add), fuse into the convolution's kernel and the
  padded tensor is never written out. This needs a reduction of at least a vector per output and a better
  register block once padded (:func:`_worth_a_slice_in_its_kernel`). Analytic first candidates of mnasnet0_5's
  five such 1x1 convolutions ran 0.75-0.92x their unpadded time (BENCHMARKS.md, session 26).
Anything else keeps its convolution as it is. The real channels compute exactly what they did: the same
weights, the same reduction order, the same epilogue (tested).

``compile.pad_channels`` (default on for CPU targets whose convolutions are NHWC); it is part of the
lowering, so it changes the padded convolutions' task keys, the same at extraction and compile time.
"""

from __future__ import annotations

import math
from collections import defaultdict
from dataclasses import dataclass, field

from dynatune.machine.register_block import block_score
from dynatune.model.layout import _BROADCASTING as _BINARY
from dynatune.model.layout import _UNARY as _LAYOUT_UNARY

# per-channel operators a padded tensor is carried through, channel axis last (NHWC): the element-wise ones
# the layout carries through, and these
_UNARY = _LAYOUT_UNARY | {"relax.nn.gelu_tanh", "relax.negative"}
_SPATIAL_REDUCE = {"relax.mean", "relax.sum", "relax.max", "relax.min"}
_POOLS = {"relax.nn.avg_pool2d", "relax.nn.max_pool2d", "relax.nn.adaptive_avg_pool2d"}


EXTRA_VECTORS = 1  # vectors a convolution may be padded past its whole vectors, for a better register block


def padded_channels(channels: int, rows: list[int], unit) -> int:
    """``channels`` padded for ``unit`` on an output of ``rows`` (its extents but the channels'): to whole
    vectors, or up to :data:`EXTRA_VECTORS` more, whichever computes the most real channels per FMA (of
    equal ones the least padded)."""
    whole = -(-channels // unit.lanes) * unit.lanes
    options = [whole + k * unit.lanes for k in range(EXTRA_VECTORS + 1)]
    return max(options, key=lambda c: (round(block_score([*rows, c], unit) * channels / c, 6), -c))


def pad_channels_pass(unit):
    """A module pass padding every convolution it can (see the module's doc) for the vector unit ``unit``."""
    import tvm
    from tvm import relax

    @tvm.transform.module_pass(opt_level=0, name="PadOutputChannels")
    def pad_channels(mod, _ctx):
        for gv, func in list(mod.functions.items()):
            if not isinstance(func, relax.Function):
                continue
            plan = _plan(func, unit)
            if plan.convs:
                mod[gv] = _rewrite(mod, func, plan)
        return mod

    return pad_channels


@dataclass
class _Plan:
    convs: dict = field(default_factory=dict)  # conv var -> (its real output channels, padded)
    carried: dict = field(default_factory=dict)  # var computed on the padded tensor -> (real, padded)


def _plan(func, unit) -> _Plan:
    """Which convolutions to pad, and which bindings after them carry the padding."""
    from tvm import relax

    bindings, users = {}, defaultdict(list)
    for block in func.body.blocks:
        for binding in block.bindings:
            if isinstance(binding, relax.VarBinding):
                bindings[binding.var] = binding.value
                for arg in _var_args(binding.value):
                    users[arg].append(binding.var)
    for out in _var_args(func.body.body):
        users[out].append(None)  # the function's result: a slice is needed there
    plan = _Plan()
    for var, value in bindings.items():
        channels = _paddable_conv(var, value, unit, bindings)
        if channels is None:
            continue
        carried: set = set()
        if not _carries_to_one_pixel(var, channels[0], bindings, users, carried):
            if not _worth_a_slice_in_its_kernel(var, value, channels, unit):
                continue
            carried = _elementwise_chain(var, channels[0], bindings, users)
        plan.convs[var] = channels
        plan.carried.update({v: channels for v in carried})
    return plan


def _worth_a_slice_in_its_kernel(var, value, channels: tuple[int, int], unit) -> bool:
    """Whether a convolution whose padding a slice must take back at a tensor of many pixels gains by it: its
    channels are not whole vectors (the kernel runs in narrower registers or part-filled ones), each output
    sums at least a vector's worth of products (with fewer, mnasnet0_5's 8 -> 24 channels on 112 x 112, its
    loads and stores bound the kernel, and the padded FMAs only add to them: 1.05x its time), and its best
    register block computes more real channels per FMA padded than not."""
    real, padded = channels
    shape, weight = _shape(var), _shape(value.args[1])
    if real % unit.lanes == 0 or weight is None:
        return False
    rows, reduction = shape[:-1], math.prod(weight[1:])  # OHWI: H x W x I products per output
    gain = block_score([*rows, padded], unit) * real / padded > block_score([*rows, real], unit)
    return reduction >= unit.lanes and gain


def _elementwise_chain(var, channels: int, bindings, users) -> set:
    """The element-wise bindings after ``var`` that carry its padding inside its kernel: each the only user
    of the one before it, so the slice after the last lands in the convolution's fused kernel."""
    chain: set = set()
    while len(users[var]) == 1 and users[var][0] is not None:
        user = users[var][0]
        value = bindings[user]
        if _op(value) not in _UNARY | _BINARY or not _carries(user, value, var, channels, bindings):
            break
        chain.add(user)
        var = user
    return chain


def _paddable_conv(var, value, unit, bindings) -> tuple[int, int] | None:
    """The output channels of a convolution to pad, and how many it gets; or None."""
    from tvm import relax

    if not (isinstance(var, relax.DataflowVar) and _op(value) == "relax.nn.conv2d"):
        return None
    attrs, shape = value.attrs, _shape(var)
    layouts = (str(attrs.data_layout), str(attrs.kernel_layout), str(attrs.out_layout))
    if layouts != ("NHWC", "OHWI", "NHWC") or int(attrs.groups) != 1 or shape is None:
        return None
    if str(var.ty.dtype) != "float32" or not _constant(value.args[1], bindings):
        return None
    channels = shape[-1]
    padded = padded_channels(channels, shape[:-1], unit) if channels >= unit.lanes else channels
    return (channels, padded) if padded != channels else None


def _carries_to_one_pixel(var, channels: int, bindings, users, carried: set, depth: int = 0) -> bool:
    """Whether every use of ``var`` (padded) either carries the padding on, or can take a slice of one
    pixel; the bindings that carry it are added to ``carried``."""
    needs_slice = False
    for user in users[var]:
        if user is not None and depth < 32 and _carries(user, bindings[user], var, channels, bindings):
            if not _carries_to_one_pixel(user, channels, bindings, users, carried, depth + 1):
                return False
            carried.add(user)
        else:
            needs_slice = True
    shape = _shape(var)
    return not needs_slice or (shape is not None and math.prod(shape[:-1]) == 1)


def _carries(var, value, padded, channels: int, bindings) -> bool:
    """Whether ``value`` (bound to ``var``), one of whose operands is the padded ``padded``, computes each
    channel from that channel alone, channel axis last, so it can run on the padded tensor."""
    from tvm import relax

    op, shape = _op(value), _shape(var)
    if not isinstance(var, relax.DataflowVar) or shape is None or not shape or shape[-1] != channels:
        return False
    args = list(value.args)
    if op in _UNARY:
        return args[0].same_as(padded) and all(not _is_tensor(a) for a in args[1:])
    if op in _BINARY:
        return all(a.same_as(padded) or _channel_operand(a, channels, bindings) for a in args)
    if op in _SPATIAL_REDUCE:
        axes = value.attrs.axis
        rank = len(_shape(padded))
        return axes is not None and all(int(a) % rank != rank - 1 for a in axes)
    if op in _POOLS:
        return str(value.attrs.layout) == "NHWC" and str(value.attrs.out_layout) == "NHWC"
    return False


def _channel_operand(expr, channels: int, bindings) -> bool:
    """A constant operand of a binary operator on the padded tensor: one value per channel or one for all."""
    shape = _shape(expr)
    return shape is not None and (not shape or shape[-1] in (1, channels)) and _constant(expr, bindings)


def _rewrite(mod, func, plan: _Plan):
    from tvm import relax
    from tvm.relax.expr_functor import PyExprMutator, mutator

    @mutator
    class PadChannels(PyExprMutator):
        def __init__(self):
            super().__init__(mod)
            self.padded: dict = {}  # original var -> the padded var computed instead
            self.sliced: dict = {}  # original var -> the slice of its padded var

        def visit_var_binding_(self, binding):
            var, value = binding.var, binding.value
            if var in plan.convs:
                weight = self._pad(self.visit_expr(value.args[1]), *plan.convs[var], axis=0)
                new = relax.Call(value.op, [self.visit_expr(value.args[0]), weight], value.attrs)
            elif var in plan.carried:
                channels = plan.carried[var]
                args = [self._carried_arg(a, value, channels) for a in value.args]
                new = relax.Call(value.op, args, value.attrs)
            else:
                return super().visit_var_binding_(binding)
            self.padded[var] = self.builder_.emit(new)

        def _carried_arg(self, arg, value, channels: tuple[int, int]):
            if arg in self.padded:
                return self.padded[arg]
            arg_value = self.visit_expr(arg)
            shape = _shape(arg)
            if shape and shape[-1] == channels[0]:  # a per-channel constant: its padding reaches no result
                fill = 1.0 if _op(value) in ("relax.divide", "relax.power") else 0.0
                return self._pad(arg_value, *channels, axis=len(shape) - 1, value=fill)
            return arg_value

        def _pad(self, expr, channels: int, padded: int, axis: int, value: float = 0.0):
            rank = len(_shape(expr))
            width = [0] * (2 * rank)
            width[2 * axis + 1] = padded - channels
            return self.builder_.emit(relax.op.nn.pad(expr, width, pad_value=value))

        def visit_dataflow_var_(self, op):
            if op not in self.padded:
                return super().visit_dataflow_var_(op)
            if op not in self.sliced:
                rank, channels = len(_shape(op)), _shape(op)[-1]
                self.sliced[op] = self.builder_.emit(
                    relax.op.strided_slice(self.padded[op], axes=[rank - 1], begin=[0], end=[channels])
                )
            return self.sliced[op]

    return PadChannels().visit_expr(func)


def _op(value) -> str:
    return getattr(getattr(value, "op", None), "name", "")


def _var_args(expr):
    """The variables ``expr`` reads directly (its arguments, and a tuple's fields)."""
    from tvm import relax

    if isinstance(expr, relax.Var):
        return [expr]
    if isinstance(expr, relax.Tuple):
        return [v for f in expr.fields for v in _var_args(f)]
    if isinstance(expr, relax.Call):
        return [v for a in expr.args for v in _var_args(a)]
    if isinstance(expr, relax.TupleGetItem):
        return _var_args(expr.tuple_value)
    return []


def _is_tensor(expr) -> bool:
    from tvm import relax

    return isinstance(getattr(expr, "ty", None), relax.TensorType)


def _shape(expr) -> list[int] | None:
    from dynatune.model.layout import _static_shape

    return _static_shape(expr) if _is_tensor(expr) else None


def _constant(expr, bindings, depth: int = 0) -> bool:
    """Whether ``expr`` is computed from constants alone (FoldConstant folds it, padding included)."""
    from tvm import relax
    from tvm.ir import Op
    from tvm.ir.expr import Constant  # tensor and scalar (PrimValue) constants

    if isinstance(expr, (Constant, relax.ShapeExpr)):
        return True
    if isinstance(expr, relax.Var):
        value = bindings.get(expr)
        return value is not None and depth < 16 and _constant(value, bindings, depth + 1)
    if isinstance(expr, relax.Call) and isinstance(expr.op, Op):
        return not _op(expr).startswith("relax.call_") and all(
            _constant(a, bindings, depth + 1) for a in expr.args
        )
    return False
