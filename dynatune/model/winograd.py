"""Winograd F(4x4, 3x3) for the 3x3 stride-1 convolutions of a CNN on a CPU (``compile.winograd``; issue
#27 item 7: MLAS has no fp32 Winograd, so this is where TVM can go past ONNX Runtime).

A direct 3x3 convolution does 9 multiply-adds per input channel and output pixel; F(4x4, 3x3) computes
each 4x4 output tile from a 6x6 input tile with 36, 2.25x fewer (less the transforms, and the waste of a
map that is not a multiple of 4). Measured at 0.63-0.96x the analytic direct kernel's time on SqueezeNet's
four 3x3 shapes, with 3-7x the direct kernel's error (about 3e-6 relative; BENCHMARKS.md, session 14).

With ``compile.winograd`` the lowering legalizes every eligible ``conv2d`` (:func:`eligible`: NHWC data,
OHWI weight, 3x3, stride 1, no dilation, one group, batch 1, float32, at least :data:`MIN_CHANNELS` in and
out, at least :data:`MIN_TILES` output tiles) as two calls:

- the weight transform ``kernel_pack[6, 6, CO, CI] = G w G^T``, on the model's constant weight, which
  ``FoldConstant`` evaluates at compile time: the artifact holds the transformed weights;
- TOPI's Winograd stages (``_conv2d_winograd_nhwc_impl``, tile 4) on the data and ``kernel_pack``. The
  data-pack and inverse blocks carry TOPI's ``schedule_rule`` attributes, so MetaSchedule schedules them
  with its CPU Winograd rules; the batched GEMM between them is tiled like a matmul, and its
  ``kernel_pack`` is prepacked like any weight. The function is marked output-elementwise-fusable, so a
  bias and an activation fuse into its epilogue as they do into a direct convolution's.

A Winograd task is another function than the direct one: its key differs, and so do its FLOPs (TVM counts
the Winograd function's own transforms and products, not the direct convolution's), so its GFLOP/s does not
compare with a direct kernel's.

Where Winograd is faster is measured, not assumed: before the final compile each Winograd task's best
kernel is timed beside the direct convolution's (:mod:`dynatune.compiler.winograd_choice`), and the
convolutions where it lost are lowered direct (``Lowering.winograd_direct``: their :func:`signature`).
"""

from __future__ import annotations

TILE = 4  # F(4x4, 3x3): the output tile
KERNEL = 3
MIN_CHANNELS = 16  # fewer input or output channels: the transforms cost more than the GEMM saves
# fewer output tiles: the transformed weights (4x the direct ones) dominate. SqueezeNet's 13x13 maps (16
# tiles) are in: their Winograd kernels ran 1.33-1.36x slower in the model than alone and no faster than the
# direct ones in session 17, but on a Zen 4 in session 55 its 64->256 one ran 0.57x the direct kernel alone
# and 1.02x its cold time in the model, and the model 0.937 [0.84, 1.16] of the one without it. Where one
# loses, the compile's choice, timed cold, keeps it direct (dynatune.compiler.winograd_choice)
MIN_TILES = 16
RULES = ("conv2d_nhwc_winograd_data_pack", "conv2d_nhwc_winograd_inverse")  # MetaSchedule's CPU rules
OUT_ELEMWISE_FUSABLE = 4  # relax's OpPatternKind kOutEWiseFusable


def eligible(call) -> bool:
    """Whether ``call`` (a ``relax.nn.conv2d``) is one :func:`legalize` computes with Winograd."""
    attrs = call.attrs
    try:
        data = [int(d) for d in call.args[0].ty.shape.values]
        kernel = [int(d) for d in call.args[1].ty.shape.values]
    except (AttributeError, TypeError, ValueError):  # a symbolic shape
        return False
    pad = [int(p) for p in attrs.padding]
    tiles = [-(-(d + 2 * pad[0] - KERNEL + 1) // TILE) for d in data[1:3]] if pad else [0, 0]
    return (
        attrs.data_layout == "NHWC"
        and attrs.kernel_layout == "OHWI"
        and attrs.out_layout in ("", "NHWC")
        and [int(s) for s in attrs.strides] == [1, 1]
        and [int(d) for d in attrs.dilation] == [1, 1]
        and int(attrs.groups) == 1
        and str(call.args[0].ty.dtype) == "float32"
        and str(attrs.out_dtype) in ("", "None", "float32")  # None or "": the input's
        and len(set(pad)) == 1
        and data[0] == 1
        and kernel[1:3] == [KERNEL, KERNEL]
        and min(kernel[0], kernel[3]) >= MIN_CHANNELS
        and tiles[0] * tiles[1] >= MIN_TILES
    )


def signature(call) -> str:
    """An eligible convolution's shape, as :attr:`Lowering.winograd_direct` names it: its NHWC input and
    output without the batch, ``"27x27x32->27x27x128"``."""
    return _signature(call.args[0].ty.shape.values, call.ty.shape.values)


def task_signature(func) -> str | None:
    """The :func:`signature` of the convolution a Winograd task's PrimFunc ``func`` computes (``None`` for
    another task): the input its ``data_pad`` block reads and the output its ``conv2d_winograd`` block
    writes."""
    import tvm_ffi
    from tvm.s_tir import SBlock

    shapes = {}

    def visit(block) -> None:
        if block.name_hint == "data_pad" and block.reads:
            shapes["in"] = block.reads[0].source.shape
        elif block.name_hint == "conv2d_winograd" and block.writes:
            shapes["out"] = block.writes[0].source.shape

    tvm_ffi.structural_walk(func.body, ((SBlock,), visit))
    return _signature(shapes["in"], shapes["out"]) if len(shapes) == 2 else None


def _signature(data, out) -> str:
    return "->".join("x".join(str(int(d)) for d in list(shape)[1:]) for shape in (data, out))


def computes_winograd(call, direct=()) -> bool:
    """Whether the lowering computes ``call`` (a ``relax.nn.conv2d``) with Winograd: it is
    :func:`eligible` and its :func:`signature` is not among those kept ``direct``."""
    return eligible(call) and signature(call) not in direct


def weight_transform(kernel):
    """``kernel_pack[eps, nu, co, ci] = sum G[eps, kh] G[nu, kw] kernel[co, kh, kw, ci]`` (TE; OHWI in)."""
    from tvm import te
    from tvm.topi.nn.winograd_util import winograd_transform_matrices

    alpha = TILE + KERNEL - 1
    co, _, _, ci = kernel.shape
    _, _, g = winograd_transform_matrices(TILE, KERNEL, "float32")
    kh, kw = te.reduce_axis((0, KERNEL), "r_kh"), te.reduce_axis((0, KERNEL), "r_kw")
    return te.compute(
        (alpha, alpha, co, ci),
        lambda eps, nu, o, i: te.sum(kernel[o, kh, kw, i] * g[eps, kh] * g[nu, kw], axis=[kh, kw]),
        name="kernel_pack",
    )


def winograd_conv(data, kernel_pack, pad: int):
    """TOPI's NHWC Winograd stages (tile 4, batch 1) with the transformed weight an input: the
    convolution's output ``[1, OH, OW, CO]``."""
    from tvm import te, topi
    from tvm.topi.nn.winograd_util import winograd_transform_matrices

    m, alpha = TILE, TILE + KERNEL - 1
    _, h, w, ci_ = (int(d) for d in data.shape)
    co_ = int(kernel_pack.shape[2])
    a_mat, b_mat, _ = winograd_transform_matrices(m, KERNEL, "float32")
    oh, ow = h + 2 * pad - KERNEL + 1, w + 2 * pad - KERNEL + 1
    nh, nw = (oh + m - 1) // m, (ow + m - 1) // m
    extra_h, extra_w = (nh - 1) * m + alpha - (h + 2 * pad), (nw - 1) * m + alpha - (w + 2 * pad)
    data_pad = topi.nn.pad(
        data,
        (0, pad, pad, 0),
        (0, pad + extra_h, pad + extra_w, 0),
        name="data_pad",
        attrs={"schedule_rule": "None"},
    )
    input_tile = te.compute(
        (alpha, alpha, nh * nw, ci_),
        lambda eps, nu, p, c: data_pad[0, (p // nw) * m + eps, (p % nw) * m + nu, c],
        name="input_tile",
        attrs={"schedule_rule": "None"},
    )
    data_pack = _tile_transform(input_tile, b_mat, (alpha, alpha, nh * nw, ci_), ("eps", "nu", "p", "c"), 0)
    rc = te.reduce_axis((0, ci_), name="ci")
    bgemm = te.compute(
        (alpha, alpha, nh * nw, co_),
        lambda eps, nu, p, co: te.sum(data_pack[eps, nu, p, rc] * kernel_pack[eps, nu, co, rc], axis=[rc]),
        name="bgemm",
        attrs={"meta_schedule.write_cache_level": [2]},  # as TOPI's
    )
    inverse = _tile_transform(bgemm, a_mat, (m, m, nh * nw, co_), ("vh", "vw", "p", "co"), 1)
    return te.compute(
        (1, oh, ow, co_),
        lambda n, y, x, co: inverse[y % m, x % m, (y // m) * nw + x // m, co],
        name="conv2d_winograd",
    )


def _tile_transform(src, mat, shape, names, stage: int):
    """``out[a, b, p, c] = sum src[r_a, r_b, p, c] mat[r_a, a] mat[r_b, b]``: the data transform (``stage``
    0, ``B``) or the inverse (1, ``A``), as TOPI writes them (``names``: its names of the four axes), with
    the MetaSchedule rule of the stage."""
    from tvm import te

    alpha = TILE + KERNEL - 1
    r_a, r_b = te.reduce_axis((0, alpha), "r_a"), te.reduce_axis((0, alpha), "r_b")

    def fcompute(*i):
        return te.sum(src[r_a, r_b, i[2], i[3]] * mat[r_a, i[0]] * mat[r_b, i[1]], axis=[r_a, r_b])

    return te.compute(
        shape,
        fcompute,
        name=("data_pack", "inverse")[stage],
        attrs={
            "auto_scheduler_simplify_const_tensor_indices": [*names[:2], "r_a", "r_b"],
            "schedule_rule": RULES[stage],
        },
        varargs_names=list(names),
    )


def legalize(bb, call, direct=()):
    """``relax.nn.conv2d`` legalized: Winograd where :func:`computes_winograd` (``direct``: the signatures
    kept direct), TOPI's direct convolution elsewhere."""
    import tvm

    if not computes_winograd(call, direct):
        return tvm.ir.Op.get("relax.nn.conv2d").get_attr("FLegalize")(bb, call)
    kernel_pack = bb.emit_te(weight_transform, call.args[1], primfunc_name_hint="winograd_weight_transform")
    out = bb.call_te(
        winograd_conv,
        call.args[0],
        kernel_pack,
        int(call.attrs.padding[0]),
        primfunc_name_hint="conv2d_winograd",
    )
    gvar = out.args[0]
    bb.update_func(gvar, bb.get()[gvar].with_attr("op_pattern", OUT_ELEMWISE_FUSABLE))
    return out
