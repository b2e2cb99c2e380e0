"""Concatenation by placement: each input of a concatenation is written straight into its slice of the
concatenated tensor, and the concatenation's copy kernel is gone.

A SqueezeNet fire module, an Inception block or a DenseNet layer ends in ``concat(conv_a(x), conv_b(x))``.
As lowered, that is three kernels: the two convolutions write their outputs, and a copy kernel reads both
and writes the concatenation (6 % of the README model's time, memory-bound). ONNX Runtime avoids the copy.
Here, after the tuned schedules are applied, every concatenation whose inputs are each produced by one
kernel (a ``call_tir`` used by nothing else) is rewritten:

- the first producer allocates the whole concatenated tensor and writes its own slice
  (``call_tir``);
- each next producer writes its slice of the same tensor, in place (``call_tir_inplace``);
- each producer's kernel is its tuned kernel, unchanged but for its output: a strided view of the
  concatenated tensor at the producer's offset on the concatenation's axis (a ``DeclBuffer`` over the
  whole tensor's data; the loops, the vector code and the tuned schedule stay as measured).

The tasks do not change: the producers are tuned as extracted, and a placed concatenation's own task is
left out of the extraction (:func:`placed_concat_keys`), so no tuning time goes to a kernel the
compiled model never calls. Extraction and compilation decide which concatenations are placed from the
same fused module, so they agree.
"""

from __future__ import annotations

from dataclasses import dataclass

PLACED = "_placed"  # the suffix of a producer's kernel that writes into its slice


@dataclass(frozen=True)
class Placement:
    """One concatenation to place: its binding's variable, the producers' variables in order, the axis."""

    concat_var: object
    producers: tuple
    axis: int


def concat_axis(func) -> int | None:
    """The axis of ``func`` when it is a plain concatenation of its inputs (TOPI's ``concatenate``, as
    legalized, regenerated for the same shapes and compared structurally), else ``None``."""
    import tvm_ffi
    from tvm import te, topi

    params = list(func.params)
    if len(params) < 3 or any(not hasattr(p, "shape") for p in params):
        return None
    try:
        shapes = [[int(d) for d in p.shape] for p in params]
    except (TypeError, ValueError):  # a symbolic dimension
        return None
    out, inputs = shapes[-1], shapes[:-1]
    if any(len(s) != len(out) for s in inputs) or len({p.dtype for p in params}) != 1:
        return None
    differing = [k for k in range(len(out)) if any(s[k] != out[k] for s in inputs)] or [len(out) - 1]
    if len(differing) != 1:
        return None
    axis = differing[0]
    if sum(s[axis] for s in inputs) != out[axis]:
        return None
    placeholders = [te.placeholder(p.shape, p.dtype, name=p.name) for p in params[:-1]]
    ref = te.create_prim_func([*placeholders, topi.concatenate(placeholders, axis)])
    if not tvm_ffi.structural_equal(func.body, ref.body, map_free_vars=True):
        return None
    return axis


def concat_functions(mod) -> dict[str, int]:
    """{name: axis} of ``mod``'s functions that are plain concatenations (:func:`concat_axis`); on the
    fused module, before any schedule is applied (a scheduled one no longer compares)."""
    from tvm import tirx

    found = {}
    for gv, func in mod.functions.items():
        if isinstance(func, tirx.PrimFunc) and gv.name_hint.startswith("concatenate"):
            axis = concat_axis(func)
            if axis is not None:
                found[gv.name_hint] = axis
    return found


def placed_concats(mod, concats: dict[str, int]) -> list[Placement]:
    """The calls of ``concats`` (:func:`concat_functions`) in ``mod``'s ``main`` that can be placed: each
    input bound in the same dataflow block to a single-output ``call_tir`` that nothing else uses."""
    from tvm import relax

    main = mod["main"]
    uses: dict = {}

    def count(expr):
        if isinstance(expr, relax.Var):
            uses[expr] = uses.get(expr, 0) + 1

    relax.analysis.post_order_visit(main.body, count)
    found = []
    for block in main.body.blocks:
        producers = set()
        for binding in block.bindings:
            value = getattr(binding, "value", None)
            if not _is_call_tir(value) or len(value.args) != 2:
                continue
            name = value.args[0].name_hint
            args = list(value.args[1].fields)
            if (
                name in concats
                and all(a in producers for a in args)
                and all(uses.get(a, 0) == 1 for a in args)
                and len(set(args)) == len(args)
            ):
                found.append(Placement(binding.var, tuple(args), concats[name]))
            if _single_tensor(binding.var):
                producers.add(binding.var)
    return found


def placed_concat_keys(fused, key) -> set:
    """The ``key`` (a task's key, of the normalized function) of every concatenation of ``fused`` that is
    placed at each of its call sites: structurally equal functions are one task, kept if any call keeps its
    copy. They are compiled away, so they are not tuned."""
    from tvm.s_tir.meta_schedule.tune_context import _normalize_mod

    concats = concat_functions(fused)
    placed = {p.concat_var for p in placed_concats(fused, concats)}
    keys, kept = set(), set()
    for block in fused["main"].body.blocks:
        for b in block.bindings:
            value = getattr(b, "value", None)
            if _is_call_tir(value) and value.args[0].name_hint in concats:
                k = key(_normalize_mod(fused[value.args[0]]))
                (keys if b.var in placed else kept).add(k)
    return keys - kept


def place(mod, concats: dict[str, int]):
    """``mod`` with every placeable call of ``concats`` (:func:`placed_concats`) placed: its producers moved
    to the concatenation's binding, the first allocating the whole tensor, the others in place."""
    from tvm import relax

    if not concats:
        return mod
    # (weight prepacking leaves ``y = x`` aliases between a kernel and its users)
    mod = relax.transform.CanonicalizeBindings()(mod)
    placements = placed_concats(mod, concats)
    if not placements:
        return mod
    main = mod["main"]
    by_concat = {p.concat_var: p for p in placements}
    produced = {v for p in placements for v in p.producers}
    values = {b.var: b.value for block in main.body.blocks for b in block.bindings}
    kernels: dict = {}
    builder = relax.BlockBuilder(mod)

    def kernel(gv, full_shape, axis, offset):
        key = (gv.name_hint, tuple(int(d) for d in full_shape), axis, offset)
        if key not in kernels:
            func = into_slice(mod[gv], full_shape, axis, offset)
            kernels[key] = builder.add_func(func, gv.name_hint + PLACED)
        return kernels[key]

    blocks = []
    for block in main.body.blocks:
        bindings = []
        for b in block.bindings:
            if b.var in produced:
                continue
            p = by_concat.get(b.var)
            if p is None:
                bindings.append(b)
                continue
            full_ty = b.var.ty
            offset, whole = 0, None
            for k, producer in enumerate(p.producers):
                call = values[producer]
                gv, args = call.args[0], list(call.args[1].fields)
                callee = kernel(gv, full_ty.shape.values, p.axis, offset)
                if whole is None:
                    value = relax.call_tir(callee, relax.Tuple(args), out_ty=full_ty)
                else:
                    value = relax.op.call_tir_inplace(callee, relax.Tuple([*args, whole]), len(args), full_ty)
                last = k == len(p.producers) - 1
                var = b.var if last else relax.DataflowVar(f"{producer.name}_placed", full_ty)
                bindings.append(relax.VarBinding(var, value))
                whole = var
                offset += int(producer.ty.shape.values[p.axis])
        blocks.append(type(block)(bindings))
    builder.update_func(
        mod.get_global_var("main"),
        relax.Function(
            main.params, relax.SeqExpr(blocks, main.body.body), main.ret_ty, main.is_pure, main.attrs
        ),
    )
    return relax.transform.DeadCodeElimination()(builder.get())


def _is_call_tir(value) -> bool:
    from tvm import relax

    return isinstance(value, relax.Call) and getattr(value.op, "name", "") == "relax.call_tir"


def _single_tensor(var) -> bool:
    from tvm import relax

    return isinstance(var.ty, relax.TensorType)


def into_slice(func, full_shape, axis: int, offset: int):
    """``func`` (output last) writing its output into ``[..., offset:offset + n, ...]`` (on ``axis``) of a
    tensor of ``full_shape``, which becomes its last parameter."""
    from tvm import tirx

    old = func.params[-1]
    dims = [int(d) for d in full_shape]
    index_type = old.shape[0].ty if hasattr(old.shape[0], "ty") else "int64"
    shape = [tirx.IntImm(index_type, d) for d in dims]
    strides = [tirx.IntImm(index_type, _prod(dims[k + 1 :])) for k in range(len(dims))]
    full = tirx.decl_buffer(shape, old.dtype, name=old.name)
    view = tirx.decl_buffer(
        old.shape,
        old.dtype,
        name=f"{old.name}_placed",
        data=full.data,
        strides=strides,
        elem_offset=tirx.IntImm(index_type, offset * _prod(dims[axis + 1 :])),
    )
    return with_params_as_views(func, {len(func.params) - 1: (full, view)})


def with_params_as_views(func, replaced: dict):
    """``func`` with the parameter at each position of ``replaced`` (position -> (new parameter, view)) taken
    as its new parameter, and the tensor it was declared inside as the view, over the new parameter's data:
    the body reads and writes the view, its loops and schedule unchanged. (Concatenations by placement; the
    flat storages of :mod:`dynatune.model.flat_storage`.)"""
    import tvm_ffi
    from tvm import tirx
    from tvm.tirx.stmt import DeclBuffer, SeqStmt

    params, views = list(func.params), {}
    for i, (new, view) in replaced.items():
        views[params[i]] = view
        params[i] = new

    def to_view(value, mutator):
        for old, view in views.items():
            if value.same_as(old):
                return view
        return mutator.default_mutate(value)

    body = tvm_ffi.structural_mutate(func.body, [(type(func.params[0]), to_view)])
    decls = [DeclBuffer(view, data=params[i].data) for i, (_new, view) in replaced.items()]
    return tirx.PrimFunc(params, SeqStmt([*decls, body]), attrs=func.attrs)


def _prod(xs) -> int:
    p = 1
    for x in xs:
        p *= int(x)
    return p
