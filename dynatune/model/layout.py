"""The data layout convolutions are tuned and compiled in.

ONNX models are NCHW. On a CPU, a convolution's output channels are what a kernel vectorizes best: with
NHWC the channel loop is innermost in memory, so MetaSchedule's multi-level tiling puts it innermost and
vectorizes it with contiguous stores and packed-weight loads, while in NCHW the innermost loop is the
output width (13, 27, 55... on the shared models: rarely a multiple of the vector width). Measured on
the README's model, the same 4-minute run gave 3.1x ONNX Runtime's latency in NHWC and 5.3x in NCHW
(BENCHMARKS.md). ``relax.transform.ConvertLayout`` rewrites the convolutions and carries the layout
through the element-wise, pooling and concat operators after them, inserting a transpose only where a
layout-sensitive operator (a reshape, the model's inputs and outputs) needs the original one. The
operators it has no rule for are rewritten first into equal ones it has (:func:`_layout_carrying_ops`),
so that no transpose is left between two layers and every activation fuses into its convolution.

``compile.conv_layout``:
- ``auto`` (default): NHWC on CPU targets; GPU targets keep the model's layout;
- ``NHWC``: NHWC on every target;
- ``NCHW``: the model's own layout, as before.

The layout is part of every task's PrimFunc, hence of its key: records tuned in one layout do not apply
to the other. A model ConvertLayout cannot rewrite keeps its own layout (the same way at extraction and
at compile time, so the keys still match), with a warning.
"""

from __future__ import annotations

import logging

CONV_LAYOUTS = ("auto", "NHWC", "NCHW")
_KERNEL_LAYOUT = {"NHWC": "OHWI"}  # the weight layout that goes with each data layout (prepacking
# then lets each tuned kernel choose its own)

log = logging.getLogger(__name__)


def resolve_conv_layout(target, setting: str = "auto") -> str | None:
    """The layout convolutions are converted to for ``target``, or None to keep the model's own."""
    from tvm.relax.pipeline import BackendDispatcher

    if setting not in CONV_LAYOUTS:
        raise ValueError(f"conv_layout must be one of {', '.join(CONV_LAYOUTS)}, not {setting!r}")
    if setting == "auto":
        return None if BackendDispatcher.is_gpu_target(target) else "NHWC"
    return None if setting == "NCHW" else setting


def conv_layout_passes(layout: str | None) -> list:
    """Passes that convert every conv2d to ``layout`` (none for None)."""
    if layout is None:
        return []
    from tvm import relax

    return [
        _drop_inference_dropout(),
        _layout_carrying_ops(),
        # (a dropped dropout leaves ``y = x``: ConvertLayout would go back to NCHW and forth around it)
        relax.transform.CanonicalizeBindings(),
        relax.transform.DeadCodeElimination(),
        _convert_or_keep(layout, _KERNEL_LAYOUT[layout]),
        # ConvertLayout converts a tensor once per reader (the input of ``x + block(x)`` twice): one is kept
        relax.transform.EliminateCommonSubexpr(call_only=True),
    ]


def _convert_or_keep(layout: str, kernel_layout: str):
    import tvm
    from tvm import relax

    convert = relax.transform.ConvertLayout({"relax.nn.conv2d": [layout, kernel_layout]})

    @tvm.transform.module_pass(opt_level=0, name="ConvertConvLayoutOrKeep")
    def convert_or_keep(mod, _ctx):
        try:
            return convert(mod)
        except Exception as exc:  # noqa: BLE001  TVM raises InternalError (or others); extraction and
            # compile fall back alike, so the keys still match
            log.warning(
                "conv layout %s not applied (%s); the model keeps its own layout",
                layout,
                str(exc).strip().splitlines()[-1][:200],
            )
            return mod

    return convert_or_keep


def _drop_inference_dropout():
    """``nn.dropout(x)[0]`` -> ``x``: dropout is the identity at inference, and its (output, mask) tuple
    stops ConvertLayout (TVM 0.27 fails on it with "Expected nested to match tuple")."""
    import tvm
    from tvm import relax
    from tvm.relax.expr_functor import PyExprMutator, mutator

    @mutator
    class DropDropout(PyExprMutator):
        def visit_tuple_getitem_(self, op):
            value = op.tuple_value
            call = self.lookup_binding(value) if isinstance(value, relax.Var) else value
            if (
                op.index == 0
                and isinstance(call, relax.Call)
                and getattr(call.op, "name", "") == "relax.nn.dropout"
            ):
                return self.visit_expr(call.args[0])
            return super().visit_tuple_getitem_(op)

    @tvm.transform.module_pass(opt_level=0, name="DropInferenceDropout")
    def drop_dropout(mod, _ctx):
        for gv, func in list(mod.functions.items()):
            if isinstance(func, relax.Function):
                mod[gv] = DropDropout().visit_expr(func)
        return mod

    return drop_dropout


def _layout_carrying_ops():
    """The operators ConvertLayout cannot carry a layout through, rewritten into equal ones it can.

    TVM 0.27's ConvertLayout keeps any operator without a layout rule in the model's layout, with a
    transpose before and after it; that operator then cannot fuse into the preceding convolution's
    epilogue, and becomes a kernel of its own (transpose, operator, transpose: a third of MobileNet-V2's
    time went to its ReLU6s). On some it fails outright, and the whole model stays NCHW. The ones ONNX
    models produce between two convolutions:

    - ``Clip``: the importer emits it as ``call_tir`` of TOPI's ``maximum`` and ``minimum``, which no pass
      can see into -> ``relax.maximum`` / ``relax.minimum`` (recognised by regenerating the TOPI function
      and comparing it structurally);
    - ``relax.clip`` (``HardSigmoid``, ``HardSwish``) -> ``maximum(minimum(x, hi), lo)``, TOPI's order;
    - ``relax.nn.leakyrelu`` (``LeakyRelu``) with ``0 <= alpha`` -> ``maximum(x, alpha * x)`` (``minimum``
      when ``alpha > 1``): ``x > 0 ? x : alpha * x`` bit for bit, signed zeros and NaN included (infinities
      too, unless ``alpha`` is 0);
    - a zero ``Pad`` (emitted as ``call_tir`` of TOPI's ``pad``) of the spatial axes feeding a convolution
      -> the convolution's own padding;
    - ``Sum``, ``Max`` and ``Min`` (older ResNet exports' residual adds), emitted as
      ``sum(stack([...]), axis=0)``, on which ConvertLayout fails -> ``add`` (``maximum``, ``minimum``)
      pairwise;
    - a binary operator between a 4-D tensor and one of lower rank (a ``[C, 1, 1]`` scale made by ONNX
      Unsqueeze, as in Caffe2's batch norms) -> the same with the other reshaped to 4-D;
    - ``x + conv(x)`` (MobileNet-V2's residual add, first operand the block's input) -> ``conv(x) + x``, so
      the add takes the convolution's layout (see ``_conv_side_first``).

    Each rewrite computes the same float operations as the original (but for ``Sum``'s reduction, which
    starts from +0.0, the sign of a zero sum, and ``Max``'s, which starts from the lowest float, a max of
    infinities), and the element-wise ones fuse into the convolution's epilogue. Still kept in the model's
    layout: ``Where``, ``Shrink``, a non-zero or non-spatial ``Pad``, a ``Pad`` before anything but a
    convolution, and what a reshape needs (ShuffleNet's channel shuffle, the Flatten before a classifier).
    """
    import numpy as np
    import tvm
    from tvm import relax
    from tvm.relax.expr_functor import PyExprMutator, mutator

    @mutator
    class CarryLayout(PyExprMutator):
        def __init__(self, mod):
            super().__init__(mod)
            self.mod = mod
            self.conv_outputs: dict = {}  # var -> whether it is a convolution's output (see _from_conv)

        def visit_call_(self, call):
            call = super().visit_call_(call)
            name = getattr(call.op, "name", "")
            if name == "relax.call_tir":
                found = _importer_te_call(self.mod[call.args[0]], call)
                if found is not None and found[0] in ("maximum", "minimum"):
                    x, bound = call.args[1].fields[0], found[1]
                    if not isinstance(bound, relax.Expr):
                        bound = relax.const(bound, x.ty.dtype)
                    return getattr(relax.op, found[0])(x, bound)
                return call
            x = call.args[0] if call.args else None
            if x is None or not isinstance(x.ty, relax.TensorType) or not str(x.ty.dtype).startswith("float"):
                return call
            if name == "relax.clip" and None not in (bounds := [_number(b) for b in call.args[1:3]]):
                lo, hi = (relax.const(b, x.ty.dtype) for b in bounds)  # topi.clip: max(min(x, hi), lo)
                return relax.op.maximum(self.builder_.emit(relax.op.minimum(x, hi)), lo)
            if name == "relax.nn.leakyrelu" and float(call.attrs.alpha) >= 0:
                alpha = float(call.attrs.alpha)
                scaled = self.builder_.emit(relax.op.multiply(x, relax.const(alpha, x.ty.dtype)))
                return (relax.op.maximum if alpha <= 1 else relax.op.minimum)(x, scaled)
            if name == "relax.nn.conv2d":
                return self._absorb_pad(call)
            if name in _STACK_REDUCTIONS:
                return self._unstack(call, getattr(relax.op, _STACK_REDUCTIONS[name]))
            if name in _BROADCASTING and len(call.args) == 2:
                return self._full_rank(self._conv_side_first(call))
            return call

        def _conv_side_first(self, call):
            """``x + conv(...)`` -> ``conv(...) + x`` (``add`` and ``multiply``, exact in either order):
            ConvertLayout gives a binary operator its first operand's layout, so a residual add whose first
            operand is the block's input (MobileNet-V2's ``x + block(x)``, which chains from the model's
            NCHW input) would stay NCHW, with a transpose on each side, in every block."""
            a, b = call.args
            if call.op.name in _COMMUTATIVE and not self._from_conv(a) and self._from_conv(b):
                return relax.Call(call.op, [b, a], call.attrs)
            return call

        def _from_conv(self, expr, depth: int = 0) -> bool:
            """Whether ``expr`` is a convolution's output, through element-wise operators (remembered per
            variable: every binary operator asks about its operands, and a chain shares them)."""
            if not isinstance(expr, relax.Var):
                return False
            if expr not in self.conv_outputs:
                value = self.lookup_binding(expr)
                name = getattr(getattr(value, "op", None), "name", "")
                found = name == "relax.nn.conv2d"
                if not found and (name in _BROADCASTING or name in _UNARY) and depth <= 64:
                    found = any(self._from_conv(a, depth + 1) for a in value.args)
                self.conv_outputs[expr] = found
            return self.conv_outputs[expr]

        def _unstack(self, reduce, binary):
            """``reduce(stack([broadcast_to(x_i, s), ...], 0), 0)``, as the importer emits ONNX Sum, Max and
            Min -> ``x_0 op x_1 op ...``, left to right as the reduction goes (and broadcasting alike)."""
            axis = reduce.attrs.axis
            if reduce.attrs.keepdims or axis is None or [int(a) for a in axis] != [0]:
                return reduce
            stack = self._bound(reduce.args[0], "relax.stack")
            if stack is None or int(stack.attrs.axis) != 0 or not isinstance(stack.args[0], relax.Tuple):
                return reduce
            xs = []
            for x in stack.args[0].fields:
                broadcast = self._bound(x, "relax.broadcast_to")
                xs.append(broadcast.args[0] if broadcast is not None else x)
            shapes = [_static_shape(x) for x in xs]
            if len(xs) < 2 or None in shapes or _static_shape(reduce) is None:
                return reduce
            if list(np.broadcast_shapes(*(tuple(s) for s in shapes))) != _static_shape(reduce):
                return reduce
            total = xs[0]
            for x in xs[1:-1]:
                total = self.builder_.emit(self._full_rank(binary(total, x)))
            return self._full_rank(binary(total, xs[-1]))

        def _full_rank(self, call):
            """``x op c`` with ``x`` 4-D and ``c`` of rank 1 to 3 (a channel scale ``[C, 1, 1]``, as ONNX
            Unsqueeze makes it) -> ``x op reshape(c, [1, C, 1, 1])``: the same broadcast, which ConvertLayout
            carries through (it has no rule for operands of different ranks)."""
            shapes = [_static_shape(a) for a in call.args]
            ranks = sorted(len(s) for s in shapes) if None not in shapes else [0, 0]
            if ranks[0] in (0, 4) or ranks[1] != 4:
                return call
            args = [
                a if len(s) == 4 else self.builder_.emit(relax.op.reshape(a, [1] * (4 - len(s)) + s))
                for a, s in zip(call.args, shapes)
            ]
            return relax.Call(call.op, args, call.attrs)

        def _bound(self, var, op_name):
            """The call to ``op_name`` bound to ``var``, or None."""
            value = self.lookup_binding(var) if isinstance(var, relax.Var) else None
            is_call = isinstance(value, relax.Call) and getattr(value.op, "name", "") == op_name
            return value if is_call else None

        def _absorb_pad(self, conv):
            producer = self._bound(conv.args[0], "relax.call_tir")
            if producer is None:
                return conv
            found = _importer_te_call(self.mod[producer.args[0]], producer)
            attrs = conv.attrs
            if found is None or found[0] != "pad" or found[3] != 0.0 or len(attrs.padding) != 4:
                return conv
            _, before, after, _ = found
            layout = str(attrs.data_layout)
            h, w = layout.index("H"), layout.index("W")
            if any(before[i] or after[i] for i in range(len(layout)) if i not in (h, w)):
                return conv
            top, left, bottom, right = (int(p) for p in attrs.padding)
            return relax.op.nn.conv2d(
                producer.args[1].fields[0],
                conv.args[1],
                strides=[int(v) for v in attrs.strides],
                padding=[top + before[h], left + before[w], bottom + after[h], right + after[w]],
                dilation=[int(v) for v in attrs.dilation],
                groups=int(attrs.groups),
                data_layout=layout,
                kernel_layout=str(attrs.kernel_layout),
                out_layout=str(attrs.out_layout),
                out_dtype=attrs.out_dtype,
            )

    @tvm.transform.module_pass(opt_level=0, name="CarryLayoutThroughActivations")
    def carry_layout(mod, _ctx):
        rewriter = CarryLayout(mod)
        for gv, func in mod.functions_items():
            if isinstance(func, relax.Function):
                rewriter.builder_.update_func(gv, rewriter.visit_expr(func))
        return rewriter.builder_.get()

    return carry_layout


_STACK_REDUCTIONS = {"relax.sum": "add", "relax.max": "maximum", "relax.min": "minimum"}
_COMMUTATIVE = {"relax.add", "relax.multiply"}
_UNARY = {f"relax.{op}" for op in ("nn.relu", "sigmoid", "tanh", "exp", "clip", "nn.silu", "nn.gelu")}
_BROADCASTING = {
    f"relax.{op}" for op in ("add", "subtract", "multiply", "divide", "maximum", "minimum", "power")
}


def _number(prim_value) -> float | None:
    """The number a ``relax.PrimValue`` holds, or None if it holds no constant."""
    value = getattr(prim_value, "value", None)
    value = getattr(value, "value", value)
    return float(value) if isinstance(value, (int, float)) else None


def _static_shape(expr) -> list[int] | None:
    from tvm import relax, tirx

    shape = expr.ty.shape if isinstance(expr.ty, relax.TensorType) else None
    if shape is None or not all(isinstance(d, tirx.IntImm) for d in shape):
        return None
    return [int(d) for d in shape]


def _importer_te_call(func, call):
    """What ``func``, the PrimFunc that ``call`` (a ``call_tir``) calls, computes, if it is one of the TOPI
    functions the ONNX importer emits for ``Clip`` and ``Pad``: ``("maximum" | "minimum", bound)`` (``bound``
    a Relax argument or a float) or ``("pad", before, after, value)``; None otherwise.

    The parameters are read off the function's single block, then the TOPI function is regenerated with them
    and must be structurally equal to ``func``: anything else (another computation, a fused function, a
    dtype or a broadcast the reading missed) is left alone.
    """
    from tvm import relax, tirx, topi
    from tvm_ffi import structural_equal

    args = list(call.args[1].fields) if isinstance(call.args[1], relax.Tuple) else []
    if not isinstance(func, tirx.PrimFunc) or not args or len(args) > 2:
        return None
    if any(_static_shape(e) is None for e in args + [call]):
        return None
    node = func.body
    while not isinstance(node, tirx.BufferStore):
        node = getattr(node, "block", None) or getattr(node, "body", None)
        if node is None:
            return None
    value = node.value
    params = [relax.Var(f"a{i}", a.ty) for i, a in enumerate(args)]
    candidates = []  # (what it would be, the TOPI function and its arguments that would give func)
    if isinstance(value, (tirx.Max, tirx.Min)):
        kind = "maximum" if isinstance(value, tirx.Max) else "minimum"
        if len(args) == 2:
            candidates.append(((kind, args[1]), getattr(topi, kind), params))
        elif isinstance(value.b, tirx.FloatImm):
            bound = float(value.b.value)
            candidates.append(((kind, bound), getattr(topi, kind), [params[0], bound]))
    elif len(args) == 1 and getattr(getattr(value, "op", None), "name", "") == "prim.if_then_else":
        _, load, pad_value = value.args
        if isinstance(pad_value, tirx.FloatImm) and hasattr(load, "indices"):
            before = []
            for index in load.indices:
                if isinstance(index, tirx.Sub) and isinstance(index.b, tirx.IntImm):
                    before.append(int(index.b.value))
                else:
                    before.append(0)
            shapes = zip(_static_shape(call), _static_shape(args[0]), before)
            after = [out - in_ - b for out, in_, b in shapes]
            pad = float(pad_value.value)
            candidates.append((("pad", before, after, pad), topi.nn.pad, [params[0], before, after, pad]))
    for found, te_func, te_args in candidates:
        scratch = relax.BlockBuilder()
        try:
            regenerated = scratch.call_te(te_func, *te_args)
        except Exception:  # noqa: BLE001  a reading TOPI rejects is no match
            continue
        if structural_equal(scratch.get()[regenerated.args[0]], func):
            return found
    return None
