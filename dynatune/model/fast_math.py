"""Vectorizable transcendental functions: exp, erf, tanh and what is built on them, as polynomials.

On a CPU, TVM lowers ``exp`` and ``erf`` to libm calls, and ``tanh`` and ``sigmoid`` (``1 / (1 +
exp(-x))``) to ``expf`` calls: a vectorized loop still calls ``expf`` once per element (an
``llvm.exp.v32f32`` is scalarized into 32 ``expf`` calls), so EfficientNet's SiLU, BERT's GELU and every
softmax run their epilogue one element at a time. TVM's ``topi.fast_exp``, ``fast_erf`` and ``fast_tanh``
are polynomial approximations (relative errors of order 1e-7 in float32) that LLVM vectorizes like any
arithmetic.

``relax.transform.FastMathTransform`` rewrites ``exp``, ``erf``, ``tanh`` and ``softmax`` only, and for
every dtype. :func:`fast_math_pass` rewrites, in float32 only, the same four and also ``sigmoid``,
``nn.silu``, ``nn.gelu``, ``nn.gelu_tanh`` and ``nn.log_softmax`` (whose ``exp`` TVM's pass misses: they
are legalized straight to TIR). Like TVM's pass, it runs on Relax operators, before legalization and
fusion: the fast functions are fused into the kernels' epilogues as the originals would be.

What stays scalar: ``log`` (Softplus, Mish, the ``log`` of ``log_softmax``, which is one per row),
``pow``, the trigonometric functions, operators legalized straight to TIR with an ``exp`` inside
(``nn.selu``, ``nn.softplus``, ``nn.attention``), and any dtype other than float32.
"""

from __future__ import annotations

FAST_MATH_OPS = (
    "relax.exp",
    "relax.erf",
    "relax.tanh",
    "relax.sigmoid",
    "relax.nn.silu",
    "relax.nn.gelu",
    "relax.nn.gelu_tanh",
    "relax.nn.softmax",
    "relax.nn.log_softmax",
)


def _te_function(op_name: str, attrs):
    """The TE function computing ``op_name`` with the fast functions, and its PrimFunc name hint."""
    import math

    from tvm import te, tirx, topi

    def sigmoid(x):
        e = topi.fast_exp(te.compute(x.shape, lambda *i: -x(*i), name="T_sigmoid_neg"))
        one = tirx.const(1.0, x.dtype)
        return te.compute(x.shape, lambda *i: one / (one + e(*i)), name="T_sigmoid")

    def silu(x):
        s = sigmoid(x)
        return te.compute(x.shape, lambda *i: x(*i) * s(*i), name="T_silu")

    def gelu(x):  # x * (1/2 + erf(x / sqrt(2)) / 2), as TVM legalizes it
        half = tirx.const(0.5, x.dtype)
        scaled = te.compute(x.shape, lambda *i: x(*i) * tirx.const(0.5**0.5, x.dtype), name="T_gelu_in")
        erf = topi.fast_erf(scaled)
        return te.compute(x.shape, lambda *i: x(*i) * (half + erf(*i) * half), name="T_gelu")

    def gelu_tanh(x):  # x / 2 * (1 + tanh(sqrt(2 / pi) * x * (1 + 0.044715 x^2)))
        c, k = tirx.const(math.sqrt(2.0 / math.pi), x.dtype), tirx.const(0.044715, x.dtype)
        one, half = tirx.const(1.0, x.dtype), tirx.const(0.5, x.dtype)
        inner = te.compute(x.shape, lambda *i: c * x(*i) * (one + k * x(*i) * x(*i)), name="T_gelu_in")
        t = topi.fast_tanh(inner)
        return te.compute(x.shape, lambda *i: half * x(*i) * (one + t(*i)), name="T_gelu_tanh")

    def log_softmax(x, axis):  # x - max - log(sum(exp(x - max))): the log is one per row
        top = topi.max(x, axis=axis, keepdims=True)
        delta = topi.subtract(x, top)
        total = topi.sum(topi.fast_exp(delta), axis=axis, keepdims=True)
        return topi.subtract(delta, topi.log(total))

    table = {
        "relax.exp": (topi.fast_exp, (), "fast_exp"),
        "relax.erf": (topi.fast_erf, (), "fast_erf"),
        "relax.tanh": (topi.fast_tanh, (), "fast_tanh"),
        "relax.sigmoid": (sigmoid, (), "fast_sigmoid"),
        "relax.nn.silu": (silu, (), "fast_silu"),
        "relax.nn.gelu": (gelu, (), "fast_gelu"),
        "relax.nn.gelu_tanh": (gelu_tanh, (), "fast_gelu_tanh"),
        "relax.nn.softmax": (topi.nn.fast_softmax, ("axis",), "fast_softmax"),
        "relax.nn.log_softmax": (log_softmax, ("axis",), "fast_log_softmax"),
    }
    fn, attr_names, hint = table[op_name]
    return fn, [int(getattr(attrs, a)) for a in attr_names], hint


def fast_math_pass():
    """The module pass: every float32 call to one of :data:`FAST_MATH_OPS` becomes a ``call_tir`` of its fast
    version (run it before ``LegalizeOps``)."""
    import tvm
    from tvm import relax
    from tvm.relax.expr_functor import PyExprMutator, mutator

    @mutator
    class FastMath(PyExprMutator):
        def visit_call_(self, call):
            call = super().visit_call_(call)
            op = call.op
            if not isinstance(op, tvm.ir.Op) or op.name not in FAST_MATH_OPS or len(call.args) != 1:
                return call
            ty = call.args[0].ty
            if not isinstance(ty, relax.TensorType) or ty.dtype != "float32":
                return call
            fn, extra, hint = _te_function(op.name, call.attrs)
            return self.builder_.call_te(fn, call.args[0], *extra, primfunc_name_hint=hint)

    @tvm.transform.module_pass(opt_level=0, name="DynatuneFastMath")
    def transform(mod, _ctx):
        rewriter = FastMath(mod)
        for gv, func in mod.functions_items():
            if isinstance(func, relax.Function):
                rewriter.builder_.update_func(gv, rewriter.visit_expr(func))
        return rewriter.builder_.get()

    return transform
