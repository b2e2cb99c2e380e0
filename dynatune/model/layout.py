"""The data layout convolutions are tuned and compiled in.

ONNX models are NCHW. On a CPU, a convolution's output channels are what a kernel vectorizes best: with
NHWC the channel loop is innermost in memory, so MetaSchedule's multi-level tiling puts it innermost and
vectorizes it with contiguous stores and packed-weight loads, while in NCHW the innermost loop is the
output width (13, 27, 55... on the shared models: rarely a multiple of the vector width). Measured on
the README's model, the same 4-minute run gave 3.1x ONNX Runtime's latency in NHWC and 5.3x in NCHW
(BENCHMARKS.md). ``relax.transform.ConvertLayout`` rewrites the convolutions and carries the layout
through the element-wise, pooling and concat operators after them, inserting a transpose only where a
layout-sensitive operator (a reshape, the model's inputs and outputs) needs the original one.

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
        relax.transform.DeadCodeElimination(),
        _convert_or_keep(layout, _KERNEL_LAYOUT[layout]),
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
