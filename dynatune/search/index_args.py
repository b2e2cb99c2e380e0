"""Index arguments: which integer inputs of a task are used as indices, and how large they may be.

MetaSchedule fills every argument with random values when it measures a candidate. For an index input
(the ids of ``take``/``gather``, an embedding lookup) random integers address memory far outside the
indexed buffer, and the kernel crashes the runner. :func:`index_bounds` finds, for every integer
parameter whose values end up in the index expression of another buffer access, the extent of the
indexed dimension (the minimum over all such uses); :mod:`dynatune.search.measure` fills those parameters
uniformly in ``[0, high)``.

The values may reach the index directly (``A[ids[i], j]``), wrapped in arithmetic (legalized ops clamp
or wrap negative indices with ``if_then_else``/``min``/``max``), or through intermediate buffers and
bound variables (``t[i] = where(ids[i] < 0, ids[i] + n, ids[i]); out[i] = A[t[i]]``): a value stored
into a buffer, or bound to a variable, that is used as an index gets that index's bound too.
"""

from __future__ import annotations


def index_bounds(func) -> dict[int, int]:
    """``{parameter position: high}`` for the integer buffer parameters of PrimFunc ``func`` whose
    values are used as indices: every value in ``[0, high)`` is a valid index for all their uses."""
    import tvm
    import tvm_ffi
    from tvm import tirx

    bound: dict = {}  # variable (buffer or scalar) -> smallest extent of a dimension it indexes
    flows: list = []  # (destination variable, variables its value is computed from)

    def variables(expr) -> list:
        found = []
        tvm_ffi.structural_walk(expr, ((tvm.ir.Var,), found.append))
        return found

    def on_access(node, buffer) -> None:
        for dim, index in enumerate(node.indices):
            extent = _static_extent(buffer, dim)
            if extent is None:
                continue
            for v in variables(index):
                bound[v] = min(bound.get(v, extent), extent)

    def visit(node) -> None:
        if isinstance(node, tirx.BufferStore):
            on_access(node, node.buffer)
            flows.append((node.buffer, variables(node.value)))
        elif isinstance(node, tvm.ir.TensorLoad):
            on_access(node, node.source)
        else:  # a Bind statement or a Let expression
            flows.append((node.var, variables(node.value)))

    tvm_ffi.structural_walk(func.body, ((tvm.ir.TensorLoad, tirx.BufferStore, tirx.Bind, tirx.Let), visit))
    changed = True
    while changed:  # a value that flows into an index variable is bounded like it
        changed = False
        for dst, srcs in flows:
            if dst not in bound:
                continue
            for src in srcs:
                if src not in bound or bound[src] > bound[dst]:
                    bound[src] = bound[dst]
                    changed = True
    return {i: bound[p] for i, p in enumerate(func.params) if p in bound and _is_int_buffer(p)}


def _static_extent(buffer, dim: int) -> int | None:
    shape = getattr(buffer, "shape", None)
    if shape is None or dim >= len(shape):
        return None
    value = getattr(shape[dim], "value", None)
    return int(value) if isinstance(value, int) and value > 0 else None


def _is_int_buffer(param) -> bool:
    return getattr(param, "shape", None) is not None and str(getattr(param, "dtype", "")).startswith(
        ("int", "uint")
    )


def args_key(args_json) -> str:
    """The key of a task's arguments as MetaSchedule's runner worker receives them: the tuple of each
    ``ArgInfo.as_json()`` (plain lists, strings and ints, so the key is the same on both sides)."""
    return repr(tuple(args_json))


def bounds_by_args(pairs) -> dict[str, tuple[tuple[int, int], ...]]:
    """``{args_key: ((position, high), ...)}`` from ``(ArgInfo list, {position: high})`` pairs.

    Picklable, for the runner worker. Tasks whose arguments look alike share a key; each position then
    keeps the smallest bound, which is valid for all of them.
    """
    merged: dict[str, dict[int, int]] = {}
    for args_info, bounds in pairs:
        if not bounds:
            continue
        cur = merged.setdefault(args_key(a.as_json() for a in args_info), {})
        for pos, high in bounds.items():
            cur[pos] = min(cur.get(pos, high), high)
    return {key: tuple(sorted(b.items())) for key, b in merged.items()}
