"""A second entry, ``main_into``: the model run into output tensors its caller passes (destination passing),
so a run allocates nothing at all.

After the resident storages (:mod:`dynatune.model.resident_storage`), ``main`` allocates only what it returns:
each output is a storage and a tensor of it (``vm.builtin.alloc_storage``, ``vm.builtin.alloc_tensor``), which
the caller keeps after the run. ``main_into(*inputs, *outputs)`` is ``main`` with those outputs as parameters:
the kernels that wrote the new tensors write the caller's, and it returns them. A caller that runs the model
again and again (:class:`dynatune.runtime.VMCall`: the loader, the MLflow model, the timing and the profile)
makes its output tensors once, with one run of ``main``, and calls ``main_into`` with them from then on, as
ONNX Runtime's I/O binding does.

``main`` stays as it was: a plain-TVM caller who keeps each run's outputs calls it. An entry is added only
where every output (the returned tensor, or each tensor of the returned tuples) is a tensor of a storage of
its own at offset 0, of a static shape, as TVM's memory plan makes a kernel's output; a model that returns an
input or a reshaped view keeps ``main`` alone, and its caller calls that.

To run after :func:`dynatune.model.resident_storage.keep_storages_resident_pass`, before ``KillAfterLastUse``.
"""

from __future__ import annotations

from dynatune.model.flat_storage import static_shape
from dynatune.model.main_rewrite import rewritten
from dynatune.runtime import INTO_ENTRY


def add_destination_entry_pass():
    """A module pass: ``main_into`` beside ``main`` (:func:`add_destination_entry`)."""
    import tvm

    @tvm.transform.module_pass(opt_level=0, name="AddDestinationEntry")
    def add(mod, _ctx):
        return add_destination_entry(mod)

    return add


def add_destination_entry(mod):
    from tvm import relax

    names = [gv.name_hint for gv in mod.functions]
    if "main" not in names or INTO_ENTRY in names:
        return mod
    main = mod["main"]
    inputs = int((main.attrs or {}).get("num_input", len(main.params)))
    outputs = _own_outputs(main) if inputs == len(main.params) else None  # (weights as parameters: not here)
    if outputs is None:
        return mod
    params = {tensor: relax.Var(f"{tensor.name}_out", tensor.ty) for tensor in outputs}
    dropped = set(params) | set(outputs.values())
    try:
        func = rewritten(main, dropped, params, extra_params=list(params.values()), fresh=True)
    except ValueError:  # (an output read where this cannot pass the caller's tensor instead)
        return mod
    func = func.with_attr("global_symbol", INTO_ENTRY)
    if "num_input" in (main.attrs or {}):  # the parameters the VM checks: the outputs too
        func = func.with_attr("num_input", inputs + len(params))
    builder = relax.BlockBuilder(mod)
    builder.add_func(func, INTO_ENTRY)
    return builder.get()


def _own_outputs(main) -> dict | None:
    """The tensors ``main`` returns, in the order a caller receives them (tuples flattened), each with its
    storage; ``None`` unless every one is a static-shape tensor at offset 0 of a storage nothing else uses."""
    import tvm
    from tvm import relax

    alloc_storage = tvm.ir.Op.get("relax.memory.alloc_storage")
    alloc_tensor = tvm.ir.Op.get("relax.memory.alloc_tensor")
    values = {b.var: getattr(b, "value", None) for block in main.body.blocks for b in block.bindings}
    uses: dict = {}

    def count(expr):
        if isinstance(expr, relax.Var):
            uses[expr] = uses.get(expr, 0) + 1

    for value in values.values():
        relax.analysis.post_order_visit(value, count)

    def flattened(expr) -> list:
        value = values.get(expr) if isinstance(expr, relax.Var) else expr
        if isinstance(value, relax.Tuple):
            return [t for field in value.fields for t in flattened(field)]
        return [expr]

    tensors = flattened(main.body.body)
    outputs = {}
    for tensor in tensors:
        value = values.get(tensor)
        own = (
            isinstance(value, relax.Call)
            and value.op.same_as(alloc_tensor)
            and isinstance(tensor.ty, relax.TensorType)
            and static_shape(tensor.ty) is not None
            and getattr(value.args[1], "value", None) == 0
        )
        storage = value.args[0] if own else None
        if not (own and isinstance(values.get(storage), relax.Call)):
            return None
        if not values[storage].op.same_as(alloc_storage) or uses.get(storage) != 1:
            return None
        outputs[tensor] = storage
    return outputs if outputs and len(outputs) == len(tensors) else None
