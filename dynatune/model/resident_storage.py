"""Storages that stay: the planned memory a model's kernels work in is the executable's own, made once when
the library is loaded, not taken from the VM's pool at every run.

After the memory plan (``StaticPlanBlockMemory``) and the flat storages (:mod:`dynatune.model.flat_storage`),
a run still makes two objects per storage: ``vm.builtin.alloc_storage`` (the pool's memory, taken and given
back each run) and ``vm.builtin.alloc_tensor`` (its flat tensor). Where nothing but kernels reads a storage,
through that one flat tensor, the flat tensor becomes a constant of the executable: a tensor of the
storage's size (zero but for its first bytes, which number it: the VM's code generator makes equal
constants one), which the kernels write and read as before. A run then allocates nothing for it.

What stays pooled: a storage with a view other than its flat tensor (the model's output, a reshape's input:
the caller may hold those after the run), or flat tensors of two types.

Two things follow, and the artifact's documentation says them:
- every VM made from one loaded module (``tvm.runtime.load_module``) shares these tensors, so two threads
  must not run VMs of the same loaded module at once (load the library once per thread; one VM was never
  safe to share between threads);
- the library holds the storages' bytes, as it holds the weights.

To run after :func:`dynatune.model.flat_storage.flatten_planned_tensors_pass` and
:func:`dynatune.model.shared_views.share_identical_views_pass`, before ``KillAfterLastUse``.
"""

from __future__ import annotations

from dynatune.model.constant_folding import is_tensor_constant
from dynatune.model.flat_storage import kernel_calls, read_outside_kernel_calls


def keep_storages_resident_pass():
    """A module pass: ``main``'s storages that only kernels read, through their flat tensor, become
    constants of the executable."""
    import tvm

    @tvm.transform.module_pass(opt_level=0, name="KeepStoragesResident")
    def resident(mod, _ctx):
        return keep_storages_resident(mod)

    return resident


def keep_storages_resident(mod):
    from tvm import relax

    if "main" not in [gv.name_hint for gv in mod.functions]:
        return mod
    main = mod["main"]
    constants = _resident_flats(main, dict(kernel_calls(mod, main)))
    if not constants:
        return mod
    dropped = {var for pair in constants for var in pair}
    by_flat = {flat: const for (_storage, flat), const in constants.items()}
    blocks = []
    for block in main.body.blocks:
        bindings = []
        for b in block.bindings:
            if b.var in dropped:
                continue
            call = getattr(b, "value", None)
            if isinstance(call, relax.Call) and any(a in by_flat for a in call.args):
                args = [by_flat.get(a, a) for a in call.args]
                b = relax.VarBinding(
                    b.var, relax.Call(call.op, args, call.attrs, call.ty_args, ret_ty=call.ty)
                )
            bindings.append(b)
        blocks.append(type(block)(bindings))
    body = relax.SeqExpr(blocks, main.body.body)
    builder = relax.BlockBuilder(mod)
    builder.update_func(
        mod.get_global_var("main"), relax.Function(main.params, body, main.ret_ty, main.is_pure, main.attrs)
    )
    return builder.get()


def _resident_flats(main, calls: dict) -> dict:
    """(storage, flat tensor) -> a constant of the flat tensor's shape and type (:func:`_numbered`), for
    each static storage of ``main`` whose only use is one flat tensor (offset 0, the whole storage) that
    nothing but kernel calls reads."""
    import numpy as np
    import tvm
    import tvm_ffi
    from tvm import relax

    alloc_storage = tvm.ir.Op.get("relax.memory.alloc_storage")
    alloc_tensor = tvm.ir.Op.get("relax.memory.alloc_tensor")
    storages, uses = {}, {}  # storage -> bytes; storage -> its uses (a view's variable, or None: another)
    for block in main.body.blocks:
        for b in block.bindings:
            value = getattr(b, "value", None)
            if isinstance(value, relax.Call) and value.op.same_as(alloc_storage):
                size = (
                    [getattr(d, "value", None) for d in value.args[0].values]
                    if isinstance(value.args[0], relax.ShapeExpr)
                    else [None]
                )
                if len(size) == 1 and isinstance(size[0], int):
                    storages[b.var] = size[0]
                    uses[b.var] = []
                continue
            for storage in _vars_in(value) & set(storages):
                is_view = isinstance(value, relax.Call) and value.op.same_as(alloc_tensor)
                uses[storage].append(b.var if is_view and value.args[0].same_as(storage) else None)
    for storage in _vars_in(main.body.body) & set(storages):
        uses[storage].append(None)
    read_elsewhere = read_outside_kernel_calls(main, calls)
    taken = [t.numpy() for t in _tensor_constants_in(main)]  # the bytes a new constant must not repeat
    constants = {}
    for storage, size in storages.items():
        views = uses[storage]
        if len(views) != 1 or views[0] is None or views[0] in read_elsewhere:
            continue
        flat = views[0]
        ty = flat.ty
        dims = [getattr(d, "value", None) for d in ty.shape.values] if ty.shape is not None else [None]
        itemsize = tvm_ffi.dtype(str(ty.dtype)).bits // 8
        if len(dims) != 1 or dims[0] is None or dims[0] * itemsize != size:
            continue
        data = _numbered(dims[0], str(ty.dtype), len(constants))
        if any(other.shape == data.shape and np.array_equal(other, data) for other in taken):
            continue  # (a constant of the model's, or a tiny storage's, has those bytes: it stays pooled)
        taken.append(data)
        constants[(storage, flat)] = relax.const(data, str(ty.dtype))  # (not narrowed: int64 stays)
    return constants


def _numbered(n: int, dtype: str, index: int):
    """``n`` elements of ``dtype``, zero but for their first bytes, which spell ``index`` and ``dynatune``:
    the VM's code generator makes equal constants one (two storages in one tensor, or a storage in a
    weight, would compute wrong), so each storage's constant has bytes of its own."""
    import numpy as np

    data = np.zeros(n, dtype=dtype)
    raw = data.view(np.uint8)
    token = np.frombuffer(index.to_bytes(8, "little") + b"dynatune", dtype=np.uint8)
    raw[: min(raw.size, token.size)] = token[: raw.size]
    return data


def _tensor_constants_in(expr) -> list:
    """The tensors of the constants ``expr`` reads."""
    from tvm import relax

    found = []
    relax.analysis.post_order_visit(expr, lambda e: found.append(e.value) if is_tensor_constant(e) else None)
    return found


def _vars_in(expr) -> set:
    from tvm import relax

    found = set()
    relax.analysis.post_order_visit(expr, lambda e: found.add(e) if isinstance(e, relax.Var) else None)
    return found
