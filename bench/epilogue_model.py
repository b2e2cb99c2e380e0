"""A small model whose time is in transcendental epilogues: the SiLU of EfficientNet, the GELU (Erf) of BERT
and a softmax, as a user's model has them after a convolution or a matmul.

    python bench/epilogue_model.py /tmp/epilogue.onnx
    python bench/epilogue_model.py /tmp/relu6.onnx relu6     # MobileNet-V2's blocks, ReLU6 as Clip

Conv(16->32, 3x3) -> Sigmoid -> Mul (SiLU) -> Conv(32->32, 3x3) -> SiLU -> reshape to tokens ->
MatMul(32->128) -> GELU written with Erf -> MatMul(128->32) -> Softmax. Input 1x16x56x56, random weights
(seed 0). Used by BENCHMARKS.md's fast-math figures with ``bench/vs_onnxruntime.py --config``.
"""

from __future__ import annotations

import argparse

import numpy as np


def make(path: str, seed: int = 0) -> str:
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(seed)

    def weight(name, *shape):
        fan_in = int(np.prod(shape[1:])) if len(shape) > 1 else shape[0]
        return numpy_helper.from_array(
            (rng.standard_normal(shape) * np.sqrt(2.0 / fan_in)).astype(np.float32), name
        )

    inits = [
        weight("w1", 32, 16, 3, 3),
        weight("w2", 32, 32, 3, 3),
        numpy_helper.from_array((rng.standard_normal((32, 128)) / np.sqrt(32)).astype(np.float32), "m1"),
        numpy_helper.from_array((rng.standard_normal((128, 32)) / np.sqrt(128)).astype(np.float32), "m2"),
        numpy_helper.from_array(np.array([1, 32, -1], np.int64), "tok_shape"),
        numpy_helper.from_array(np.array(np.sqrt(0.5), np.float32), "inv_sqrt2"),
        numpy_helper.from_array(np.array(1.0, np.float32), "one"),
        numpy_helper.from_array(np.array(0.5, np.float32), "half"),
    ]
    nodes = [
        helper.make_node("Conv", ["x", "w1"], ["c1"], pads=[1, 1, 1, 1]),
        helper.make_node("Sigmoid", ["c1"], ["s1"]),
        helper.make_node("Mul", ["c1", "s1"], ["a1"]),
        helper.make_node("Conv", ["a1", "w2"], ["c2"], pads=[1, 1, 1, 1]),
        helper.make_node("Sigmoid", ["c2"], ["s2"]),
        helper.make_node("Mul", ["c2", "s2"], ["a2"]),
        helper.make_node("Reshape", ["a2", "tok_shape"], ["t0"]),
        helper.make_node("Transpose", ["t0"], ["tok"], perm=[0, 2, 1]),
        helper.make_node("MatMul", ["tok", "m1"], ["h"]),
        helper.make_node("Mul", ["h", "inv_sqrt2"], ["hs"]),
        helper.make_node("Erf", ["hs"], ["e"]),
        helper.make_node("Add", ["e", "one"], ["e1"]),
        helper.make_node("Mul", ["h", "e1"], ["he"]),
        helper.make_node("Mul", ["he", "half"], ["g"]),
        helper.make_node("MatMul", ["g", "m2"], ["o"]),
        helper.make_node("Softmax", ["o"], ["y"], axis=-1),
    ]
    graph = helper.make_graph(
        nodes,
        "epilogues",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 16, 56, 56])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 3136, 32])],
        initializer=inits,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    onnx.checker.check_model(model)
    onnx.save(model, path)
    return path


def make_relu6(path: str, seed: int = 0, blocks: int = 3) -> str:
    """MobileNet-V2's inverted residual blocks, with ReLU6 as ONNX ``Clip(0, 6)``: 1x1 expand (16 -> 96) ->
    Clip -> depthwise 3x3 -> Clip -> 1x1 project (96 -> 16) -> residual Add, ``blocks`` times, on 1x16x56x56.
    """
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(seed)

    def weight(name, *shape):
        fan_in = int(np.prod(shape[1:]))
        return numpy_helper.from_array(
            (rng.standard_normal(shape) * np.sqrt(1.0 / fan_in)).astype(np.float32), name
        )

    inits = [
        numpy_helper.from_array(np.array(0.0, np.float32), "lo"),
        numpy_helper.from_array(np.array(6.0, np.float32), "hi"),
    ]
    nodes, x = [], "x"
    for b in range(blocks):
        inits += [weight(f"e{b}", 96, 16, 1, 1), weight(f"d{b}", 96, 1, 3, 3), weight(f"p{b}", 16, 96, 1, 1)]
        nodes += [
            helper.make_node("Conv", [x, f"e{b}"], [f"ce{b}"]),
            helper.make_node("Clip", [f"ce{b}", "lo", "hi"], [f"re{b}"]),
            helper.make_node("Conv", [f"re{b}", f"d{b}"], [f"cd{b}"], group=96, pads=[1, 1, 1, 1]),
            helper.make_node("Clip", [f"cd{b}", "lo", "hi"], [f"rd{b}"]),
            helper.make_node("Conv", [f"rd{b}", f"p{b}"], [f"cp{b}"]),
            helper.make_node("Add", [x, f"cp{b}"], [f"y{b}"]),
        ]
        x = f"y{b}"
    graph = helper.make_graph(
        nodes,
        "relu6_blocks",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 16, 56, 56])],
        [helper.make_tensor_value_info(x, TensorProto.FLOAT, [1, 16, 56, 56])],
        initializer=inits,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    onnx.checker.check_model(model)
    onnx.save(model, path)
    return path


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("path", nargs="?", default="/tmp/epilogue.onnx", help="where the ONNX model is written")
    ap.add_argument("kind", nargs="?", choices=("epilogue", "relu6"), default="epilogue")
    args = ap.parse_args()
    print((make_relu6 if args.kind == "relu6" else make)(args.path))
