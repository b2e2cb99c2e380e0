"""A task's FLOPs are its reductions' (dynatune.model.flops): a matmul's multiply-adds, not the ops of the
activation after it, which TVM's estimate counts too."""

from tvm import te
from tvm.s_tir.analysis import estimate_tir_flops

from dynatune.model.flops import task_flops


def _matmul_silu(m=64, n=16, k=32):
    a, b = te.placeholder((m, k), name="a"), te.placeholder((k, n), name="b")
    r = te.reduce_axis((0, k), name="r")
    c = te.compute((m, n), lambda i, j: te.sum(a[i, r] * b[r, j], axis=r), name="c")
    d = te.compute((m, n), lambda i, j: c[i, j] * te.sigmoid(c[i, j] + 1.0), name="d")
    return te.create_prim_func([a, b, d])


def test_a_matmul_with_an_activation_counts_its_multiply_adds_only():
    func = _matmul_silu()
    assert task_flops(func) == 2 * 64 * 16 * 32
    assert estimate_tir_flops(func.body) > task_flops(func)  # TVM's estimate counts the activation's ops too


def test_a_task_with_no_reduction_has_no_flops_and_a_module_reads_as_its_function():
    import tvm

    x = te.placeholder((8, 8), name="x")
    y = te.compute((8, 8), lambda i, j: te.sigmoid(x[i, j]) * 2.0, name="y")
    assert task_flops(te.create_prim_func([x, y])) == 0.0
    assert task_flops(tvm.IRModule({"main": _matmul_silu()})) == 2 * 64 * 16 * 32


def test_a_winograd_convolution_counts_its_batched_gemm_not_its_transforms():
    from dynatune.model.winograd import winograd_conv

    data = te.placeholder((1, 27, 27, 32), name="data")
    kernel_pack = te.placeholder((6, 6, 128, 32), name="kernel_pack")
    func = te.create_prim_func([data, kernel_pack, winograd_conv(data, kernel_pack, 1)])
    tiles = 7 * 7  # 27x27 outputs in 4x4 tiles
    assert task_flops(func) == 2 * 36 * tiles * 32 * 128  # the 36 products of each tile, channel by channel
    assert estimate_tir_flops(func.body) > 2 * task_flops(func)  # the transforms' terms, each counted
