"""Kernels that read and write the planned memory itself: one tensor object per storage, made once a run,
instead of one per intermediate tensor.

Relax plans a model's intermediate tensors statically (``StaticPlanBlockMemory``): a few storages, and each
intermediate tensor a view of one of them (``R.memory.alloc_tensor(storage, 0, shape, dtype)``), made just
before the kernel that writes it: a ``vm.builtin.alloc_tensor`` call a run for each (a tensor object, a small
heap allocation; mnasnet0_5: 53 a run). A kernel only needs the view for its shape: its code reads and writes
the memory under it.

So where a kernel's parameter receives a planned tensor at every one of its calls, that parameter becomes
the whole storage, flat (``(n,)``, ``n`` read from the tensor it is given), and the kernel declares its tensor
over the same data inside (a ``DeclBuffer``: its loops, vector code and tuned schedule unchanged, as in
:mod:`dynatune.model.placement`). The model then makes one flat tensor per storage and type, right after the
storage, and passes it. The views nothing else reads are dropped; one that something other than a kernel
reads (a reshape, the model's output) stays, and views with the same place are made once
(:mod:`dynatune.model.shared_views`).

To run after ``StaticPlanBlockMemory`` and ``LowerAllocTensor`` and before ``KillAfterLastUse``.
"""

from __future__ import annotations

from dataclasses import dataclass

from dynatune.model.placement import with_params_as_views


@dataclass(frozen=True)
class _View:
    """A planned tensor's place: its storage's variable, and its type."""

    storage: object
    dtype: str


def flatten_planned_tensors_pass():
    """A module pass: ``main``'s kernels take the storages they read and write flat (the module's text)."""
    import tvm

    @tvm.transform.module_pass(opt_level=0, name="FlattenPlannedTensors")
    def flatten(mod, _ctx):
        return flatten_planned_tensors(mod)

    return flatten


def flatten_planned_tensors(mod):
    import tvm_ffi
    from tvm import relax

    if "main" not in [gv.name_hint for gv in mod.functions]:
        return mod
    mod = relax.transform.CanonicalizeBindings()(mod)  # (no ``y = x`` aliases between a view and its users)
    main = mod["main"]
    storages, views = _storages_and_views(main)
    calls = dict(kernel_calls(mod, main))  # binding variable -> its kernel call
    params = _flat_params(mod, main, calls, views)
    if not params:
        return mod
    flats = {}  # (storage, dtype) -> the flat tensor's variable
    for call in calls.values():
        for i, arg in enumerate(call.args):
            view = views[arg] if (call.op, i) in params else None
            if view is not None and (view.storage, view.dtype) not in flats:
                n = storages[view.storage] // (tvm_ffi.dtype(view.dtype).bits // 8)
                ty = relax.TensorType([n], view.dtype)
                flats[(view.storage, view.dtype)] = relax.Var(f"{view.storage.name}_flat", ty)
    builder = relax.BlockBuilder(mod)
    for gv in {gv for gv, _ in params}:
        builder.update_func(
            gv, _kernel_on_flat_params(mod[gv], sorted(i for g, i in params if g.same_as(gv)))
        )
    builder.update_func(mod.get_global_var("main"), _main_on_flats(main, calls, views, params, flats))
    return builder.get()


def kernel_calls(mod, main):
    """(binding variable, call) for each call of a TIR kernel in ``main``."""
    from tvm import relax, tirx

    for block in main.body.blocks:
        for b in block.bindings:
            value = getattr(b, "value", None)
            if isinstance(b, relax.VarBinding) and isinstance(value, relax.Call):
                if isinstance(value.op, relax.GlobalVar) and isinstance(mod[value.op], tirx.PrimFunc):
                    yield b.var, value


def _storages_and_views(main) -> tuple[dict, dict]:
    """``main``'s static storages (variable -> bytes) and the views of them at offset 0 with a static shape
    (variable -> :class:`_View`)."""
    import tvm
    from tvm import relax

    alloc_storage = tvm.ir.Op.get("relax.memory.alloc_storage")
    alloc_tensor = tvm.ir.Op.get("relax.memory.alloc_tensor")
    storages, views = {}, {}
    for block in main.body.blocks:
        for b in block.bindings:
            value = getattr(b, "value", None)
            if not isinstance(value, relax.Call):
                continue
            if value.op.same_as(alloc_storage) and isinstance(value.args[0], relax.ShapeExpr):
                size = [_int(d) for d in value.args[0].values]
                if len(size) == 1 and size[0] is not None:
                    storages[b.var] = size[0]
            elif value.op.same_as(alloc_tensor) and value.args[0] in storages:
                offset, ty = value.args[1], b.var.ty
                static = isinstance(ty, relax.TensorType) and static_shape(ty) is not None
                if static and _int(offset) == 0:
                    views[b.var] = _View(value.args[0], str(ty.dtype))
    return storages, views


def static_shape(ty) -> list[int] | None:
    """A tensor type's dimensions, where every one is a constant (else ``None``)."""
    dims = [_int(d) for d in ty.shape.values] if ty.shape is not None else [None]
    return None if None in dims else dims


def _int(expr) -> int | None:
    value = getattr(expr, "value", None)
    return value if isinstance(value, int) else None


def _flat_params(mod, main, calls: dict, views: dict) -> set:
    """(kernel, position) of every kernel parameter that receives, at every call of the kernel (in ``main``,
    the only function that calls it), a planned view of its own type that nothing but such parameters reads:
    each such view is gone once its kernels take the storage flat (a view that something else reads, such as
    the model's output, would stay, and its storage's flat tensor would be one object more, not one less)."""
    sites: dict = {}  # (kernel, position) -> the arguments given there
    for call in calls.values():
        for i, arg in enumerate(call.args):
            sites.setdefault((call.op, i), []).append(arg)
    read_elsewhere = read_outside_kernel_calls(main, calls)
    elsewhere = _called_outside_main(mod)

    def fits(gv, i, arg) -> bool:
        view = views.get(arg)
        return view is not None and arg not in read_elsewhere and view.dtype == str(mod[gv].params[i].dtype)

    params = {
        (gv, i)
        for (gv, i), args in sites.items()
        if gv not in elsewhere and all(fits(gv, i, a) for a in args)
    }
    while True:  # a view given to a parameter that stays is read as a view: its other parameters stay too
        kept_views = {a for key, args in sites.items() if key not in params for a in args if a in views}
        smaller = {key for key in params if not kept_views.intersection(sites[key])}
        if smaller == params:
            return params
        params = smaller


def read_outside_kernel_calls(main, calls: dict) -> set:
    """The variables ``main`` reads other than as a kernel call's argument (returned, reshaped, ...)."""
    from tvm import relax

    read = set()

    def note(expr):
        if isinstance(expr, relax.Var):
            read.add(expr)

    for block in main.body.blocks:
        for b in block.bindings:
            if b.var not in calls:
                relax.analysis.post_order_visit(b.value, note)
    relax.analysis.post_order_visit(main.body.body, note)
    return read


def _called_outside_main(mod) -> set:
    from tvm import relax

    called = set()
    for gv, func in mod.functions.items():
        if isinstance(func, relax.Function) and gv.name_hint != "main":
            relax.analysis.post_order_visit(
                func, lambda e: called.add(e) if isinstance(e, relax.GlobalVar) else None
            )
    return called


def _kernel_on_flat_params(func, positions: list[int]):
    """``func`` with each parameter at ``positions`` taken flat: ``(n,)`` of its type, ``n`` symbolic, and the
    tensor it was declared over the same data inside."""
    from tvm import tirx

    replaced = {}
    for i in positions:
        old = func.params[i]
        index_type = old.shape[0].ty if old.shape and hasattr(old.shape[0], "ty") else "int64"
        flat = tirx.decl_buffer([tirx.Var(f"{old.name}_n", index_type)], old.dtype, name=old.name)
        view = tirx.decl_buffer(old.shape, old.dtype, name=f"{old.name}_in_storage", data=flat.data)
        replaced[i] = (flat, view)
    return with_params_as_views(func, replaced)


def _main_on_flats(main, calls: dict, views: dict, params: set, flats: dict):
    """``main`` passing the flat tensors to the flattened parameters, each made right after its storage, and
    without the views given to them (nothing else reads those: :func:`_flat_params`)."""
    from tvm import relax

    flattened = {arg for call in calls.values() for i, arg in enumerate(call.args) if (call.op, i) in params}
    blocks = []
    for block in main.body.blocks:
        bindings = []
        for b in block.bindings:
            if b.var in flattened:
                continue
            call = calls.get(b.var)
            if call is not None:
                args = [
                    flats[(views[arg].storage, views[arg].dtype)] if (call.op, i) in params else arg
                    for i, arg in enumerate(call.args)
                ]
                b = relax.VarBinding(
                    b.var, relax.Call(call.op, args, call.attrs, call.ty_args, ret_ty=call.ty)
                )
            bindings.append(b)
            for (storage, dtype), flat in flats.items():
                if b.var.same_as(storage):
                    n = flat.ty.shape.values[0]
                    alloc = relax.op.memory.alloc_tensor(storage, 0, relax.ShapeExpr([n]), dtype)
                    bindings.append(relax.VarBinding(flat, alloc))
        blocks.append(type(block)(bindings))
    body = relax.SeqExpr(blocks, main.body.body)
    return relax.Function(main.params, body, main.ret_ty, main.is_pure, main.attrs)
