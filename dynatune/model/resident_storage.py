"""Storages that stay: the planned memory a model's kernels work in is the executable's own, made once when
the library is loaded, not taken from the VM's pool at every run.

After the memory plan (``StaticPlanBlockMemory``) and the flat storages (:mod:`dynatune.model.flat_storage`),
a run still makes two objects per storage: ``vm.builtin.alloc_storage`` (the pool's memory, taken and given
back each run) and ``vm.builtin.alloc_tensor`` (its flat tensor). Where nothing but kernels reads a storage,
through that one flat tensor, the flat tensor becomes a constant of the executable: a tensor of the
storage's size (zero but for its first bytes, which number it: the VM's code generator makes equal
constants one), which the kernels write and read as before. A run then allocates nothing for it.

A storage the plan gives to one tensor after another (views at offset 0 that a kernel cannot take flat:
transformer_tiny's layer norm writes an intermediate tensor and the output) stays too when the views' lives
are apart: each view becomes a constant of its own shape (more bytes in the library, no object a run).

What stays pooled: a storage with a view something other than a kernel reads (the model's output, a
reshape's input: the caller may hold those after the run, or a view of them), with views at other offsets,
or with two views live at once (their memory must be one).

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
from dynatune.model.flat_storage import kernel_calls, read_outside_kernel_calls, static_shape
from dynatune.model.main_rewrite import rewritten


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
    kept, by_view = _resident_views(main, dict(kernel_calls(mod, main)))
    if not kept:
        return mod
    func = rewritten(main, kept | set(by_view), by_view)
    builder = relax.BlockBuilder(mod)
    builder.update_func(mod.get_global_var("main"), func)
    return builder.get()


def _resident_views(main, calls: dict) -> tuple[set, dict]:
    """The static storages of ``main`` that stay, and for each of their views a constant of its shape and
    type (:func:`_numbered`): the storages whose every use is a view at offset 0 of a static shape that
    nothing but kernel calls reads, the views' lives apart (the memory plan gave the storage to one tensor
    after another: each may have memory of its own). Usually one view, the flat tensor."""
    import numpy as np
    import tvm
    from tvm import relax

    alloc_storage = tvm.ir.Op.get("relax.memory.alloc_storage")
    alloc_tensor = tvm.ir.Op.get("relax.memory.alloc_tensor")
    uses = {}  # each static storage -> its uses (a view's variable, or None: another)
    born, last = {}, {}  # variable -> the position of its binding, of the last binding that reads it
    bindings = [b for block in main.body.blocks for b in block.bindings]
    for at, b in enumerate(bindings):
        value = getattr(b, "value", None)
        read = _vars_in(value)
        born[b.var] = at
        for var in read:
            last[var] = at
        if isinstance(value, relax.Call) and value.op.same_as(alloc_storage):
            if isinstance(value.args[0], relax.ShapeExpr) and len(value.args[0].values) == 1:
                uses[b.var] = []
            continue
        for storage in read & uses.keys():
            view = isinstance(value, relax.Call) and value.op.same_as(alloc_tensor)
            view = view and value.args[0].same_as(storage) and getattr(value.args[1], "value", None) == 0
            uses[storage].append(b.var if view and static_shape(b.var.ty) else None)
    for storage in _vars_in(main.body.body) & uses.keys():
        uses[storage].append(None)
    read_elsewhere = read_outside_kernel_calls(main, calls)
    taken = [t.numpy() for t in _tensor_constants_in(main)]  # the bytes a new constant must not repeat
    kept, constants = set(), {}
    for storage in uses:
        views = sorted(uses[storage], key=lambda v: -1 if v is None else born[v])
        if not views or views[0] is None or any(v in read_elsewhere for v in views):
            continue
        if any(last.get(a, born[a]) >= born[b] for a, b in zip(views, views[1:])):
            continue  # (two views live at once share their memory: the storage stays pooled)
        datas = [
            _numbered(static_shape(v.ty), str(v.ty.dtype), len(constants) + i) for i, v in enumerate(views)
        ]
        if any(o.shape == d.shape and np.array_equal(o, d) for d in datas for o in taken):
            continue  # (a constant of the model's, or a tiny storage's, has those bytes: it stays pooled)
        taken += datas
        kept.add(storage)
        for view, data in zip(views, datas):
            constants[view] = relax.const(data, str(view.ty.dtype))  # (not narrowed: int64 stays)
    return kept, constants


def _numbered(shape: list[int], dtype: str, index: int):
    """A tensor of ``shape`` and ``dtype``, zero but for its first bytes, which spell ``index`` and
    ``dynatune``: the VM's code generator makes equal constants one (two storages in one tensor, or a storage
    in a weight, would compute wrong), so each constant has bytes of its own."""
    import numpy as np

    data = np.zeros(shape, dtype=dtype)
    raw = data.reshape(-1).view(np.uint8)
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
