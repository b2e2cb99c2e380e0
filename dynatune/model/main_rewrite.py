"""A lowered ``main`` with some bindings gone and some variables read as others: what the finalize passes
that re-plan a model's memory (:mod:`dynatune.model.resident_storage`,
:mod:`dynatune.model.destination_entry`) build from it."""

from __future__ import annotations


def rewritten(func, dropped: set, replaced: dict, extra_params: list = (), fresh: bool = False):
    """``func`` (a Relax function of binding blocks) without the bindings of ``dropped``, reading each
    variable of ``replaced`` as its value (in calls' arguments, tuples and what it returns), with
    ``extra_params`` after its own. Raises ``ValueError`` where a dropped variable is still read (in an
    expression this does not rewrite): the function would not be well formed. ``fresh``: every parameter and
    bound variable a new one (a function beside ``func`` in one module: a variable is one function's)."""
    from tvm import relax

    replaced = dict(replaced)
    params = [*func.params, *extra_params]
    if fresh:
        replaced |= {p: relax.Var(p.name, p.ty) for p in func.params}
        params = [replaced.get(p, p) for p in params]

    def swap(expr):  # ``expr`` itself where nothing in it is replaced
        if isinstance(expr, relax.Var):
            return replaced.get(expr, expr)
        if isinstance(expr, relax.Tuple):
            fields = [swap(f) for f in expr.fields]
            return expr if _same(fields, expr.fields) else relax.Tuple(fields)
        if isinstance(expr, relax.TupleGetItem):
            inner = swap(expr.tuple_value)
            return expr if inner.same_as(expr.tuple_value) else relax.TupleGetItem(inner, expr.index)
        if isinstance(expr, relax.Call):
            args = [swap(a) for a in expr.args]
            return (
                expr
                if _same(args, expr.args)
                else relax.Call(expr.op, args, expr.attrs, expr.ty_args, ret_ty=expr.ty)
            )
        return expr

    blocks = []
    for block in func.body.blocks:
        bindings = []
        for b in block.bindings:
            if b.var in dropped:
                continue
            if isinstance(b, relax.VarBinding):
                value, var = swap(b.value), b.var
                if fresh:
                    var = replaced[b.var] = relax.Var(b.var.name, b.var.ty)
                if not (var.same_as(b.var) and value.same_as(b.value)):
                    b = relax.VarBinding(var, value)
            bindings.append(b)
        blocks.append(type(block)(bindings))
    new = relax.Function(
        params, relax.SeqExpr(blocks, swap(func.body.body)), func.ret_ty, func.is_pure, func.attrs
    )
    left = [v for v in relax.analysis.free_vars(new) if v in dropped]
    if left:
        raise ValueError(f"{left[0].name} is still read after its binding was dropped")
    return new


def _same(new: list, old) -> bool:
    return all(n.same_as(o) for n, o in zip(new, old))
