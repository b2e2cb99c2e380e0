"""Constant folding in one LLVM build: what ``relax.transform.FoldConstant`` gives, in a fraction of its time.

TVM's ``FoldConstant`` evaluates each ``call_tir`` whose arguments are all constants (a batch norm's scale
folded into its convolution's weights, a weight's layout transform, its channel padding) by building its
PrimFunc with LLVM on its own, one build per call: 586 builds and 42 s for ONNX's light Inception-V2, nearly
all of its import. :func:`fold_constants_passes` first evaluates every such call of ``main`` in
order, each PrimFunc built once, all of them in one LLVM module for the same plain ``llvm`` target
``FoldConstant`` uses (so the values are the same, bit for bit); then ``FoldConstant`` itself, for
whatever is left (and to put the constants at their call sites, as it does). The result is the module
``FoldConstant`` alone would give (``tests/model/test_constant_folding.py`` compares them structurally,
constants' bytes included).
"""

from __future__ import annotations

# the target TVM's FoldConstant builds with (src/relax/transform/fold_constant.cc: ``Target("llvm")``)
FOLDING_TARGET = {"kind": "llvm"}
# the largest output FoldConstant materializes from no tensor input (its ``kMaxFoldElements``)
MAX_CREATED_ELEMENTS = 1024


def fold_constants_passes() -> list:
    """The passes to use where ``relax.transform.FoldConstant()`` would be."""
    from tvm import relax

    return [fold_calls_on_constants_pass(), relax.transform.FoldConstant()]


def is_tensor_constant(expr) -> bool:
    import tvm
    from tvm.ir.expr import GenericConst

    return isinstance(expr, GenericConst) and isinstance(expr.value, tvm.runtime.Tensor)


def _static_tensor(ty) -> tuple[list[int], str] | None:
    from tvm import relax, tirx

    if not isinstance(ty, relax.TensorType) or ty.shape is None:
        return None
    if not all(isinstance(d, tirx.IntImm) for d in ty.shape):
        return None
    return [int(d) for d in ty.shape], ty.dtype


def _static_outputs(call) -> list[tuple[list[int], str]] | None:
    """The shape and dtype of each of ``call``'s tensor outputs, if all static (None otherwise)."""
    from tvm import relax

    types = list(call.ty_args)
    if len(types) == 1 and isinstance(types[0], relax.TupleType):
        types = list(types[0].fields)
    outputs = [_static_tensor(ty) for ty in types]
    return outputs if outputs and None not in outputs else None


def _worth_folding(outputs, args) -> bool:
    """FoldConstant's ``ShouldBeFolded``: not a large tensor computed from no tensor (an ``iota``, ``zeros``:
    cheaper made at run time than stored)."""
    import math

    return bool(args.fields) or len(outputs) > 1 or math.prod(outputs[0][0]) <= MAX_CREATED_ELEMENTS


def calls_on_constants(mod, func) -> list[tuple]:
    """``func``'s ``call_tir`` bindings that compute from constants alone, in order: [(var, call, outputs)],
    ``outputs`` [(shape, dtype)] (one, or a tuple's). An argument is a tensor constant or the var of an
    earlier such binding (of one output)."""
    from tvm import relax, tirx
    from tvm.ir import Op

    call_tir = Op.get("relax.call_tir")
    folded, found = set(), []
    for block in func.body.blocks:
        for binding in block.bindings:
            call = binding.value
            if not isinstance(binding, relax.VarBinding) or not isinstance(call, relax.Call):
                continue
            if not call.op.same_as(call_tir) or len(call.args) != 2:
                continue
            callee, args = call.args
            if not isinstance(args, relax.Tuple) or not isinstance(mod[callee], tirx.PrimFunc):
                continue
            if (outputs := _static_outputs(call)) is None or not _worth_folding(outputs, args):
                continue
            if all(is_tensor_constant(a) or (isinstance(a, relax.Var) and a in folded) for a in args.fields):
                if len(outputs) == 1:
                    folded.add(binding.var)
                found.append((binding.var, call, outputs))
    return found


def evaluate(mod, calls) -> dict | None:
    """{var: [tvm.runtime.Tensor of each output]} of each of ``calls`` (:func:`calls_on_constants`), their
    PrimFuncs built in one module; None if that module does not build (``FoldConstant`` then does what it
    can, alone)."""
    import tvm

    symbols, funcs = {}, {}
    for _, call, _ in calls:
        name = call.args[0].name_hint
        if name not in symbols:
            symbols[name] = f"fold_{len(symbols)}"
            funcs[symbols[name]] = mod[call.args[0]].with_attr("global_symbol", symbols[name])
    try:
        library = tvm.tirx.build(tvm.IRModule(funcs), target=tvm.target.Target(FOLDING_TARGET))
    except Exception:  # (TVM raises its build errors as several Python types) FoldConstant then folds alone
        return None
    kernels = {symbol: library[symbol] for symbol in funcs}
    values = {}
    for var, call, outputs in calls:
        args = [a.value if is_tensor_constant(a) else values[a][0] for a in call.args[1].fields]
        values[var] = [tvm.runtime.empty(shape, dtype) for shape, dtype in outputs]
        kernels[symbols[call.args[0].name_hint]](*args, *values[var])
    return values


def _as_constant(outputs):
    """One output as a constant, several as a tuple of constants (as FoldConstant writes them)."""
    from tvm import relax

    return relax.const(outputs[0]) if len(outputs) == 1 else relax.Tuple([relax.const(o) for o in outputs])


def fold_calls_on_constants_pass():
    """Replace each ``call_tir`` of ``main`` that computes from constants alone with its value."""
    import tvm
    from tvm.relax.expr_functor import PyExprMutator, mutator

    @mutator
    class ReplaceCalls(PyExprMutator):
        def __init__(self, mod, constants):
            super().__init__(mod)
            self.constants = constants

        def visit_call_(self, call):
            constant = self.constants.get(call)
            return constant if constant is not None else super().visit_call_(call)

    @tvm.transform.module_pass(opt_level=0, name="FoldCallsOnConstants")
    def fold(mod, _ctx):
        if "main" not in [gv.name_hint for gv in mod.get_global_vars()]:
            return mod
        main = mod.get_global_var("main")
        calls = calls_on_constants(mod, mod[main])
        values = evaluate(mod, calls) if calls else None
        if not values:
            return mod
        constants = {call: _as_constant(values[var]) for var, call, _ in calls}
        out = mod.clone()  # (the caller's module is left as it was)
        out[main] = ReplaceCalls(mod, constants).visit_expr(mod[main])
        return out

    return fold
