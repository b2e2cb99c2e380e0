"""A task's FLOPs: the arithmetic of its reductions, which the roofline's peak bounds.

A convolution's or a matmul's multiply-adds (2 FLOPs each), a pooling's or a mean's sums, a softmax's max
and sum: the loop nests of a task's PrimFunc that hold a reduction block, counted by TVM's
``estimate_tir_flops``. The elementwise nests around them (a bias, an activation, a residual add) are left
out. TVM's estimate counts every operation of those too, integer index arithmetic and comparisons included:
a fast SiLU epilogue (dynatune.model.fast_math) counts about 90 per element, which is not work the FMA
units do, and put kernels of the EfficientNet-like model at 125-136 % of the FMA peak (Zen 5, AVX-512).
Counted so, a task's FLOPs are the figure a model's GFLOP/s is usually quoted by, and its roofline bound
(:meth:`dynatune.machine.roofline.Roofline.bound_s`) a true lower bound: no kernel passes the peak. A task
with no reduction (a transpose, an elementwise op) has none: its bound is its bytes.

A Winograd convolution (:mod:`dynatune.model.winograd`) counts its batched GEMM only. Its input and output
transforms are reductions by constant matrices, mostly zeros and ones, which the compiler folds into a few
adds a value; TVM's estimate counts all 36 terms of each, every one a multiply-add, which put SqueezeNet's
55x55 Winograd kernel at 106 % of the FMA peak (Zen 4, AVX-512). Without them the count is still a lower
bound on the work, and the roofline bound one on the time.
"""

from __future__ import annotations


def _children(stmt) -> list:
    from tvm import s_tir, tirx

    if isinstance(stmt, s_tir.SBlockRealize):
        return [stmt.block.body]
    if isinstance(stmt, tirx.SeqStmt):
        return list(stmt.seq)
    body = getattr(stmt, "body", None)  # loops, lets, allocations, attributes
    return [body] if body is not None else []


def _reduces(stmt) -> bool:
    """Whether ``stmt`` holds a block with a reduction axis, other than a Winograd transform."""
    from tvm import s_tir, tirx

    from dynatune.model.winograd import RULES

    if isinstance(stmt, s_tir.SBlockRealize) and any(
        iv.iter_type == tirx.IterVar.CommReduce for iv in stmt.block.iter_vars
    ):
        return str(stmt.block.annotations.get("schedule_rule", "")) not in RULES
    return any(_reduces(c) for c in _children(stmt))


def task_flops(mod) -> float:
    """The FLOPs of the reductions of the PrimFunc in ``mod`` (an IRModule or a PrimFunc)."""
    from tvm import s_tir, tirx
    from tvm.s_tir.analysis import estimate_tir_flops

    func = mod["main"] if hasattr(mod, "functions") else mod
    nests = [func.body]
    while len(nests) == 1 and isinstance(nests[0], (s_tir.SBlockRealize, tirx.SeqStmt)):
        nests = _children(nests[0])  # the root block, its body: the loop nests in order
    return sum(float(estimate_tir_flops(nest)) for nest in nests if _reduces(nest))
