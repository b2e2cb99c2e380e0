"""The built-in default model: SqueezeNet 1.1 with deterministic random weights.

The ``onnx`` package ships a light SqueezeNet 1.1 (``onnx/backend/test/data/light/light_squeezenet.onnx``):
the real topology, but its weights are ``ConstantOfShape`` nodes (every weight 0.02), so its output is the
same for every input and a check against ONNX Runtime would pass for a wrong compiled model too. The
default model is a copy of it with seeded random weights:

1. each convolution's weight is drawn He-initialised by its fan-in (normal, std ``sqrt(2 / fan_in)``),
   each bias N(0, 0.01);
2. then, layer by layer in graph order, each convolution's output channels are normalised on one seeded
   random input (LSUV-style data-dependent init: weight and bias rescaled so each channel's pre-activation
   has mean 0 and std 1). He init alone keeps the activations' scale, but their positive mean (after each
   ReLU) is the same for every input and dominates the global average pool: the softmax output would move
   by ~2 % between two random inputs. Normalised, it moves by ~20-35 % (and the top class changes).

It is written once (atomically) to dynatune's cache, ``<cache>/models/<source sha>-seed<N>-v<F>/NAME.onnx``,
and named ``squeezenet1.1-random-weights`` (its file stem).
"""

from __future__ import annotations

import hashlib
import importlib.util
import os

NAME = "squeezenet1.1-random-weights"
SEED = 0
BIAS_STD = 0.01
_FORMAT = 1  # bump when the way the weights are made changes: a new cache entry


def light_squeezenet_path() -> str:
    """The onnx package's light squeezenet (found without importing ``onnx``)."""
    spec = importlib.util.find_spec("onnx")
    if spec is not None and spec.submodule_search_locations:
        root = list(spec.submodule_search_locations)[0]
    else:  # pragma: no cover - onnx is a dependency
        import onnx

        root = os.path.dirname(onnx.__file__)
    return os.path.join(root, "backend", "test", "data", "light", "light_squeezenet.onnx")


def default_model_path(seed: int = SEED) -> str:
    """The default model's file, written to the cache on first use (a cached file is reused as it is)."""
    from dynatune.errors import DynatuneError
    from dynatune.files import cache_root

    source = light_squeezenet_path()
    try:
        with open(source, "rb") as f:
            tag = hashlib.sha256(f.read()).hexdigest()[:12]
    except OSError as e:
        raise DynatuneError(
            f"the default model's source {source} cannot be read: {e}", "give a model: --model PATH"
        ) from None
    path = cache_root("models", f"{tag}-seed{seed}-v{_FORMAT}", NAME + ".onnx")
    if not os.path.exists(path):
        try:
            write_random_weights(source, path, seed)
        except OSError as e:
            raise DynatuneError(
                f"cannot write the default model to {path}: {e}",
                "set DYNATUNE_CACHE_DIR to a writable directory, or give a model: --model PATH",
            ) from None
    return path


def randomize_weights(model, seed: int = SEED):
    """A copy of ONNX ``model`` whose float weights (initializers, and ``ConstantOfShape`` nodes that
    make them) are seeded random values: He by fan-in for tensors of rank >= 2, N(0, BIAS_STD) otherwise.
    The ``ConstantOfShape`` nodes become initializers, and initializers are no graph inputs any more."""
    import numpy as np
    import onnx
    from onnx import numpy_helper

    m = onnx.ModelProto()
    m.CopyFrom(model)
    g = m.graph
    arrays = {i.name: numpy_helper.to_array(i) for i in g.initializer}
    rng = np.random.default_rng(seed)

    def draw(name: str, shape: tuple) -> onnx.TensorProto:
        if len(shape) >= 2:
            fan_in = max(1, int(np.prod(shape[1:])))
            values = rng.standard_normal(shape) * np.sqrt(2.0 / fan_in)
        else:
            values = rng.standard_normal(shape) * BIAS_STD
        return numpy_helper.from_array(values.astype(np.float32), name)

    weights: dict[str, onnx.TensorProto] = {}
    nodes = []
    for node in g.node:
        if node.op_type == "ConstantOfShape" and node.input and node.input[0] in arrays:
            weights[node.output[0]] = draw(node.output[0], tuple(int(d) for d in arrays[node.input[0]]))
        else:
            nodes.append(node)
    used = {i for n in nodes for i in n.input}
    for init in g.initializer:  # e.g. the light model's biases
        if init.name in used and init.name not in weights:
            a = arrays[init.name]
            weights[init.name] = draw(init.name, a.shape) if a.dtype == np.float32 else init
    del g.node[:]
    g.node.extend(nodes)
    del g.initializer[:]
    g.initializer.extend(weights[name] for name in sorted(weights))
    inputs = [i for i in g.input if i.name not in weights and i.name in used]
    del g.input[:]
    g.input.extend(inputs)
    m.ir_version = max(m.ir_version, 4)  # initializers that are not graph inputs: constants
    g.name = NAME
    normalize_convs(m, seed)
    onnx.checker.check_model(m)
    return m


def normalize_convs(model, seed: int = SEED) -> None:
    """Rescale each ``Conv``'s weight and bias in place, in graph order, so that on one seeded standard
    normal input each output channel's pre-activation has mean 0 and std 1 (ONNX Runtime, one thread)."""
    import numpy as np
    import onnx
    import onnxruntime as ort
    from onnx import numpy_helper

    g = model.graph
    inits = {i.name: i for i in g.initializer}
    (x,) = [i for i in g.input if i.name not in inits]
    shape = [d.dim_value for d in x.type.tensor_type.shape.dim]
    data = {x.name: np.random.default_rng([seed, 1]).standard_normal(shape).astype(np.float32)}
    options = ort.SessionOptions()
    options.intra_op_num_threads = 1
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL  # each Conv's own output
    for node in [n for n in g.node if n.op_type == "Conv"]:
        probe = onnx.ModelProto()
        probe.CopyFrom(model)
        del probe.graph.output[:]
        out = onnx.helper.make_tensor_value_info(node.output[0], onnx.TensorProto.FLOAT, None)
        probe.graph.output.append(out)
        sess = ort.InferenceSession(probe.SerializeToString(), options, providers=["CPUExecutionProvider"])
        z = sess.run(None, data)[0].astype(np.float64)
        axes = tuple(a for a in range(z.ndim) if a != 1)
        mean, std = z.mean(axis=axes), z.std(axis=axes) + 1e-6
        w = numpy_helper.to_array(inits[node.input[1]]).astype(np.float64)
        w /= std.reshape((-1,) + (1,) * (w.ndim - 1))
        inits[node.input[1]].CopyFrom(numpy_helper.from_array(w.astype(np.float32), node.input[1]))
        if len(node.input) > 2 and node.input[2] in inits:
            b = (numpy_helper.to_array(inits[node.input[2]]).astype(np.float64) - mean) / std
            inits[node.input[2]].CopyFrom(numpy_helper.from_array(b.astype(np.float32), node.input[2]))


def write_random_weights(source: str, path: str, seed: int = SEED) -> str:
    """Write :func:`randomize_weights` of the ONNX file ``source`` to ``path`` atomically."""
    import onnx

    data = randomize_weights(onnx.load(source), seed).SerializeToString()
    os.makedirs(os.path.dirname(path), exist_ok=True)
    tmp = f"{path}.tmp{os.getpid()}"
    try:
        with open(tmp, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.remove(tmp)
    return path
