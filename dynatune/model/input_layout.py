"""A convolution that reads the model's NCHW input itself: no transpose kernel before the first layer.

With convolutions in NHWC (:mod:`dynatune.model.layout`), ``ConvertLayout`` leaves a transpose between the
model's NCHW input and its first convolution. That transpose is a kernel of its own: it reads the input
and writes it again, and in the model it runs at a fraction of its speed alone, since it is the first
kernel of each inference and its output comes cold into the convolution (mnasnet0_5 on an AVX-512 Intel
machine: 0.046 ms in the model against 0.017 alone, 3.4 % of the model; BENCHMARKS.md, session 22). ONNX
Runtime has no such kernel: its first NCHWc convolution reads the NCHW input.

Here a convolution whose data is ``permute_dims(x, [0, 2, 3, 1])`` of a function parameter ``x`` reads
``x`` itself: it becomes ``conv2d(x, w, data_layout="NCHW", out_layout="NHWC")``, legalized (TOPI has no
such mixed layout) as an NHWC convolution that reads the input in NCHW, with the padding in its reads: the
transpose costs no pass of its own. The output channels stay innermost and vectorized as in any NHWC
convolution, and the epilogue fuses as before.

``compile.read_input`` (default on for CPU targets whose convolutions are NHWC) changes the first
convolution's task key, and removes the transpose's task. A convolution of another kind (grouped, or one
that ``compile.winograd`` computes as Winograd) keeps its transpose.
"""

from __future__ import annotations

NCHW_TO_NHWC = [0, 2, 3, 1]
OUT_ELEMWISE_FUSABLE = 4  # tvm.relax's OpPatternKind: an epilogue fuses into it


def read_input_pass(keep=None):
    """Passes: a convolution of a permuted function parameter reads the parameter (see above), but where
    ``keep(call)`` holds (a convolution the lowering computes otherwise: Winograd)."""
    import tvm
    from tvm import relax
    from tvm.relax.expr_functor import PyExprMutator, mutator

    @mutator
    class _ReadInput(PyExprMutator):
        def __init__(self, mod, params):
            super().__init__(mod)
            self.params = params

        def visit_call_(self, call):
            call = super().visit_call_(call)
            source = self._permuted_param(call)
            if source is None or (keep is not None and keep(call)):
                return call
            a = call.attrs
            return relax.op.nn.conv2d(
                source, call.args[1], a.strides, a.padding, a.dilation, a.groups,
                "NCHW", a.kernel_layout, "NHWC", a.out_dtype,
            )  # fmt: skip

        def _permuted_param(self, call):
            """``x`` when ``call`` is an NHWC conv2d (OHWI weights, one group) of
            ``permute_dims(x, [0, 2, 3, 1])``, ``x`` a parameter."""
            if getattr(call.op, "name", None) != "relax.nn.conv2d":
                return None
            a = call.attrs
            if (a.data_layout, a.kernel_layout, a.out_layout, int(a.groups)) != ("NHWC", "OHWI", "NHWC", 1):
                return None
            data = call.args[0]
            value = self.lookup_binding(data) if isinstance(data, relax.Var) else data
            if not (isinstance(value, relax.Call) and getattr(value.op, "name", "") == "relax.permute_dims"):
                return None
            axes = value.attrs.axes
            source = value.args[0]
            if axes is None or [int(x) for x in axes] != NCHW_TO_NHWC or source not in self.params:
                return None
            return source

    @relax.transform.function_pass(opt_level=0, name="ConvReadsInput")
    def read_input(func, mod, _ctx):
        if not isinstance(func, relax.Function):
            return func
        return _ReadInput(mod, set(func.params)).visit_expr(func)

    # the transposes no convolution reads any more are dropped
    return tvm.transform.Sequential([read_input, relax.transform.DeadCodeElimination()])


def reads_nchw(call) -> bool:
    """Whether ``call`` is a conv2d this module rewrote: NCHW data, NHWC output."""
    return call.attrs.data_layout == "NCHW" and call.attrs.out_layout == "NHWC"


def legalize(bb, call):
    """A conv2d rewritten here, legalized: one PrimFunc (see :func:`conv_reading_nchw`)."""
    a = call.attrs
    strides, padding, dilation = ([int(x) for x in v] for v in (a.strides, a.padding, a.dilation))
    out_dtype = a.out_dtype if a.out_dtype != "" else None

    def conv(data, weight):
        return conv_reading_nchw(data, weight, strides, padding, dilation, out_dtype)

    out = bb.call_te(conv, call.args[0], call.args[1], primfunc_name_hint="conv2d")
    gvar = out.args[0]
    bb.update_func(gvar, bb.get()[gvar].with_attr("op_pattern", OUT_ELEMWISE_FUSABLE))
    return out


def conv_reading_nchw(data, weight, strides, padding, dilation, out_dtype=None):
    """An NHWC convolution (OHWI weights, one group) of ``data`` in NCHW, padded where it is read.

    One stage, with the padding in its reads: MetaSchedule inlines no transpose (its reads are not in the
    order of its loops), so a transpose or padding stage of its own would be a second pass over the input,
    inside the kernel."""
    from tvm import te
    from tvm import tirx as tir

    n, c, h, w = data.shape
    out_c, kh, kw, _ = weight.shape
    top, left, bottom, right = padding
    (sh, sw), (dh, dw) = strides, dilation
    out_h = (h + top + bottom - (kh - 1) * dh - 1) // sh + 1
    out_w = (w + left + right - (kw - 1) * dw - 1) // sw + 1
    dtype = out_dtype or data.dtype
    ry, rx, rc = te.reduce_axis((0, kh), "ry"), te.reduce_axis((0, kw), "rx"), te.reduce_axis((0, c), "rc")

    def value(b, y, x, k):
        iy, ix = y * sh + ry * dh - top, x * sw + rx * dw - left
        inside = tir.all(iy >= 0, iy < h, ix >= 0, ix < w)
        pixel = tir.if_then_else(inside, data[b, rc, iy, ix], tir.const(0, data.dtype))
        return te.sum(pixel.astype(dtype) * weight[k, ry, rx, rc].astype(dtype), axis=[ry, rx, rc])

    return te.compute((n, out_h, out_w, out_c), value, name="conv2d_nhwc")
