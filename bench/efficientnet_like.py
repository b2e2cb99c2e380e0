"""An ONNX model with EfficientNet-B0's blocks, written with onnx.helper (no download, no PyTorch): the stem
(3x3 stride-2 conv, SiLU), then MBConv blocks, each a 1x1 expansion, a depthwise 3x3 or 5x5 convolution,
SiLU (``x * sigmoid(x)``), squeeze-and-excite (global average pool, 1x1 reduce, SiLU, 1x1 expand, sigmoid,
scale), a 1x1 projection and, where shapes allow, the residual add; then a 1x1 head conv, SiLU, global
pooling and the classifier. Seeded He-initialised weights, float32, batch 1, 224x224.

    python -m bench.efficientnet_like OUT.onnx [--blocks 16] [--seed 0]

``--blocks`` takes the first N of EfficientNet-B0's 16 blocks (its seven stages, 1, 2, 2, 3, 3, 4 and 1
blocks, 16 -> 24 -> 40 -> 80 -> 112 -> 192 -> 320 channels; all 16 by default).
"""

from __future__ import annotations

import sys

from bench.harness import parser

# EfficientNet-B0's stages
STAGES = [  # (expand ratio, out channels, kernel, stride of the first block, blocks)
    (1, 16, 3, 1, 1),
    (6, 24, 3, 2, 2),
    (6, 40, 5, 2, 2),
    (6, 80, 3, 2, 3),
    (6, 112, 5, 1, 3),
    (6, 192, 5, 2, 4),
    (6, 320, 3, 1, 1),
]


def build(blocks: int = 7, seed: int = 0, size: int = 224):
    import numpy as np
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(seed)
    nodes, inits = [], []
    count = iter(range(10_000))

    def name(kind: str) -> str:
        return f"{kind}{next(count)}"

    def conv(x: str, cin: int, cout: int, k: int, stride: int = 1, group: int = 1) -> str:
        w, b, y = name("w"), name("b"), name("conv")
        fan_in = cin // group * k * k
        inits.append(
            numpy_helper.from_array(
                (rng.standard_normal((cout, cin // group, k, k)) * np.sqrt(2.0 / fan_in)).astype(np.float32),
                w,
            )
        )
        inits.append(numpy_helper.from_array(np.zeros(cout, np.float32), b))
        pad = k // 2
        nodes.append(
            helper.make_node(
                "Conv",
                [x, w, b],
                [y],
                kernel_shape=[k, k],
                strides=[stride, stride],
                pads=[pad] * 4,
                group=group,
            )
        )
        return y

    def silu(x: str) -> str:
        s, y = name("sig"), name("silu")
        nodes.append(helper.make_node("Sigmoid", [x], [s]))
        nodes.append(helper.make_node("Mul", [x, s], [y]))
        return y

    def squeeze_excite(x: str, c: int, reduced: int) -> str:
        g = name("gap")
        nodes.append(helper.make_node("GlobalAveragePool", [x], [g]))
        r = silu(conv(g, c, reduced, 1))
        s = name("sig")
        nodes.append(helper.make_node("Sigmoid", [conv(r, reduced, c, 1)], [s]))
        y = name("se")
        nodes.append(helper.make_node("Mul", [x, s], [y]))
        return y

    x = silu(conv("input", 3, 32, 3, stride=2))
    c = 32
    layers = [(e, co, k, s if i == 0 else 1) for e, co, k, s, n in STAGES for i in range(n)]
    for expand, cout, k, stride in layers[:blocks]:
        h, ce = x, c * expand
        if expand != 1:
            h = silu(conv(h, c, ce, 1))
        h = silu(conv(h, ce, ce, k, stride=stride, group=ce))
        h = squeeze_excite(h, ce, max(1, c // 4))
        h = conv(h, ce, cout, 1)
        if stride == 1 and cout == c:
            y = name("res")
            nodes.append(helper.make_node("Add", [h, x], [y]))
            h = y
        x, c = h, cout
    x = silu(conv(x, c, 1280, 1))
    g = name("gap")
    nodes.append(helper.make_node("GlobalAveragePool", [x], [g]))
    f = name("flat")
    nodes.append(helper.make_node("Flatten", [g], [f]))
    inits.append(
        numpy_helper.from_array((rng.standard_normal((1000, 1280)) * 0.02).astype(np.float32), "fc_w")
    )
    inits.append(numpy_helper.from_array(np.zeros(1000, np.float32), "fc_b"))
    nodes.append(helper.make_node("Gemm", [f, "fc_w", "fc_b"], ["output"], transB=1))
    graph = helper.make_graph(
        nodes,
        "efficientnet_like",
        [helper.make_tensor_value_info("input", TensorProto.FLOAT, [1, 3, size, size])],
        [helper.make_tensor_value_info("output", TensorProto.FLOAT, [1, 1000])],
        inits,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model


def main(argv=None) -> int:
    import onnx

    ap = parser(__doc__)
    ap.add_argument("out")
    ap.add_argument("--blocks", type=int, default=sum(n for *_, n in STAGES), help="the first N (16: all)")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)
    model = build(args.blocks, args.seed)
    onnx.checker.check_model(model)
    onnx.save(model, args.out)
    print(f"wrote {args.out}: {len(model.graph.node)} nodes")
    return 0


if __name__ == "__main__":
    sys.exit(main())
