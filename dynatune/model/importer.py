"""Model import: an ONNX file becomes a TVM Relax IRModule with its weights as parameters.

Everything the user can get wrong here (missing file, not ONNX, truncated file, dynamic dims with no
shape, a shape for an input that does not exist, an operator TVM cannot import) becomes a one-line
:class:`DynatuneError` naming the file, input, dim, op or node.
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import os
import warnings
from dataclasses import dataclass, field

import numpy as np

from dynatune.errors import DynatuneError

_DTYPES = {
    1: "float32",
    2: "uint8",
    3: "int8",
    5: "int16",
    6: "int32",
    7: "int64",
    9: "bool",
    10: "float16",
    11: "float64",
    16: "bfloat16",
}


@dataclass
class ModelInput:
    name: str
    shape: tuple[int, ...]
    dtype: str


@dataclass
class Model:
    """An imported model: the Relax module (weights as parameters) and what we know about it."""

    name: str
    path: str
    sha256: str
    inputs: list[ModelInput]
    output_names: list[str]
    onnx_model: object = field(repr=False)
    mod: object = field(repr=False)  # tvm.IRModule, weights as trailing parameters of main
    params: list = field(repr=False)  # tvm.runtime.Tensor per weight parameter

    @property
    def shapes(self) -> dict[str, tuple[int, ...]]:
        return {i.name: i.shape for i in self.inputs}

    def bound_module(self):
        """``main`` with the weights bound as constants (so weight-only ops fold away)."""
        from tvm import relax

        main = self.mod["main"]
        weights = list(main.params)[len(main.params) - len(self.params) :] if self.params else []
        return relax.transform.BindParams("main", dict(zip(weights, self.params)))(self.mod)

    def random_inputs(self, seed: int = 0) -> dict[str, np.ndarray]:
        return random_inputs(self.inputs, seed)


def random_inputs(inputs: list[ModelInput], seed: int = 0) -> dict[str, np.ndarray]:
    """Reproducible inputs: normal floats, indices in [0, 8)."""
    rng = np.random.default_rng(seed)
    out = {}
    for i in inputs:
        if i.dtype.startswith("float"):
            out[i.name] = rng.standard_normal(i.shape).astype(i.dtype)
        elif i.dtype == "bool":
            out[i.name] = rng.integers(0, 2, i.shape).astype(bool)
        else:
            out[i.name] = rng.integers(0, 8, i.shape).astype(i.dtype)
    return out


def file_sha256(path: str) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def parse_shape(text: str) -> tuple[str, tuple[int, ...]]:
    """``NAME=1x3x224x224`` -> ``("NAME", (1, 3, 224, 224))``."""
    name, sep, dims = text.rpartition("=")
    try:
        if not sep or not name:
            raise ValueError
        shape = tuple(int(d) for d in dims.lower().replace(",", "x").split("x"))
        if any(d <= 0 for d in shape):
            raise ValueError
    except ValueError:
        raise DynatuneError(
            f"bad shape {text!r}", "write it as NAME=1x3x224x224 with positive dims"
        ) from None
    return name, shape


def load_onnx_proto(path: str):
    import onnx

    if not os.path.exists(path):
        raise DynatuneError(f"model file not found: {path}", "check the path")
    if os.path.isdir(path):
        raise DynatuneError(f"model path is a directory, not an ONNX file: {path}")
    try:
        proto = onnx.load(path)
    except Exception as exc:  # DecodeError, truncated files, permission errors...
        raise DynatuneError(
            f"{path} is not a readable ONNX model "
            f"({type(exc).__name__}: {str(exc).strip()[:120] or 'parse failed'})",
            "is the file complete and really ONNX?",
        ) from None
    if not proto.graph.node:
        raise DynatuneError(
            f"{path} is not an ONNX model (its graph has no nodes)", "is the file really ONNX?"
        )
    return proto


def _real_inputs(graph):
    """Graph inputs that are real inputs: legacy files (IR < 4) also list every weight as an input."""
    inits = {i.name for i in graph.initializer}
    produced = {o for n in graph.node for o in n.output}
    return [i for i in graph.input if i.name not in inits and i.name not in produced]


# (path, size, mtime, shapes, name) -> Model: the CLI's preflight and the run share one import
_IMPORTED: dict = {}


def load_model(path: str, shapes: dict[str, tuple[int, ...]] | None = None, name: str | None = None) -> Model:
    """Import an ONNX file into Relax. ``shapes`` binds symbolic input dims (and may change a static batch
    dim, dim 0; another static dim it contradicts is an error).

    A file imported before in this process (same path, size, mtime, shapes and name) is not imported
    again."""
    try:
        st = os.stat(path)
        key = (
            os.path.abspath(path),
            st.st_size,
            st.st_mtime_ns,
            tuple(sorted((k, tuple(v)) for k, v in (shapes or {}).items())),
            name,
        )
    except (OSError, TypeError):
        key = None
    if key is not None and key in _IMPORTED:
        return _IMPORTED[key]
    model = _import_model(path, shapes, name)
    if key is not None:
        _IMPORTED.clear()  # keep one: a long-lived process (dynatune serve) tunes many models
        _IMPORTED[key] = model
    return model


def runtime_proto(path: str, inputs: list[ModelInput] | None = None):
    """The ONNX file as ONNX Runtime and the importer get it: weights listed as inputs (legacy ONNX) dropped,
    and the shapes of ``inputs`` (a model's, ``--shape`` included) written into it."""
    proto = load_onnx_proto(path)
    graph = proto.graph
    real = _real_inputs(graph)
    if len(real) != len(graph.input):
        del graph.input[:]
        graph.input.extend(real)
    if inputs is not None:
        _pin_input_shapes(graph, inputs)
    return proto


def _import_model(path: str, shapes, name) -> Model:
    proto = runtime_proto(path)
    shapes = dict(shapes or {})
    graph = proto.graph
    real = list(graph.input)
    known = [i.name for i in real]
    unknown = [n for n in shapes if n not in known]
    if unknown:
        raise DynatuneError(
            f"shape given for input {unknown[0]!r}, which {os.path.basename(path)} does not have",
            f"its inputs are: {', '.join(known)}",
        )
    inputs = []
    for vi in real:
        tt = vi.type.tensor_type
        dtype = _DTYPES.get(tt.elem_type, "float32")
        if vi.name in shapes:
            shape = shapes[vi.name]
            if tt.HasField("shape"):
                _check_given_shape(vi.name, shape, [d.dim_value for d in tt.shape.dim])
        else:
            if not tt.HasField("shape"):
                raise DynatuneError(
                    f"input {vi.name!r} has unknown rank",
                    f"give its shape with --shape {vi.name}=1x3x224x224",
                )
            dims = []
            for k, d in enumerate(tt.shape.dim):
                if d.HasField("dim_value") and d.dim_value > 0:
                    dims.append(d.dim_value)
                else:
                    label = d.dim_param or "?"
                    model_dims = [dd.dim_value for dd in tt.shape.dim]
                    dynamic = ", ".join(str(j) for j, x in enumerate(model_dims) if x <= 0)
                    raise DynatuneError(
                        f"input {vi.name!r} has dynamic dim {k} ({label!r}) and no shape was given",
                        f"bind it with --shape {vi.name}="
                        + "x".join(str(x) if x > 0 else "1" for x in model_dims)
                        + f", any positive size for dim {dynamic}",
                    )
            shape = tuple(dims)
        inputs.append(ModelInput(vi.name, tuple(int(s) for s in shape), dtype))
    _pin_input_shapes(graph, inputs)
    mod = _to_relax(proto, {i.name: list(i.shape) for i in inputs}, {i.name: i.dtype for i in inputs}, path)
    from tvm import relax

    mod, params = relax.frontend.detach_params(mod)
    return Model(
        name=name or os.path.splitext(os.path.basename(path))[0],
        path=os.path.abspath(path),
        sha256=file_sha256(path),
        inputs=inputs,
        output_names=[o.name for o in graph.output],
        onnx_model=proto,
        mod=mod,
        params=list(params.get("main", [])),
    )


def _check_given_shape(name: str, shape, model_dims: list[int]) -> None:
    """A ``--shape`` fits the model: as many dims as it has, and its static dims kept, but for dim 0 (the
    batch, which a model exported with batch 1 often runs at any size)."""
    if len(model_dims) != len(shape):
        raise DynatuneError(
            f"shape for input {name!r} has {len(shape)} dims, the model says {len(model_dims)}"
        )
    fits = [shape[0], *(f if f > 0 else w for w, f in zip(shape[1:], model_dims[1:]))]
    for k, (want, fixed) in enumerate(zip(shape, model_dims)):
        if want != fits[k]:
            raise DynatuneError(
                f"shape for input {name!r} gives dim {k} as {want}, but the model fixes it at {fixed} "
                "(only the batch dim, dim 0, may differ from the model's)",
                f"use --shape {name}={'x'.join(map(str, fits))}",
            )


def _pin_input_shapes(graph, inputs) -> None:
    """Write the inputs' shapes into the graph, so that ONNX Runtime (the reference) runs the model at the
    shapes TVM tunes. Where that changes a static dim, the recorded intermediate and output shapes may no
    longer hold: they are dropped, and ONNX Runtime infers them again."""
    changed = False
    for vi, given in zip(graph.input, inputs):
        dims = vi.type.tensor_type.shape.dim
        if len(dims) != len(given.shape):  # no shape recorded: only possible when it was given
            for _ in given.shape:
                dims.add()
        for d, want in zip(dims, given.shape):
            if d.HasField("dim_value") and d.dim_value > 0 and d.dim_value != want:
                changed = True
            d.dim_value = int(want)
    if changed:
        del graph.value_info[:]
        for out in graph.output:
            out.type.tensor_type.ClearField("shape")


def _to_relax(proto, shape_dict, dtype_dict, path):
    import tvm
    from tvm.relax.frontend.onnx import from_onnx
    from tvm.relax.frontend.onnx.onnx_frontend import _get_convert_map

    supported = set(_get_convert_map()) | {"If", "Constant"}
    for node in proto.graph.node:
        if node.op_type not in supported:
            raise DynatuneError(
                f"TVM cannot import op {node.op_type!r} (node {node.name or node.output[0]!r}) "
                f"in {os.path.basename(path)}",
                "replace the op or export the model with other ops",
            )
    from tvm.relax.frontend.onnx.onnx_frontend import ONNXGraphImporter

    current: dict = {}
    original = ONNXGraphImporter._convert_operator

    def tracking(self, op_name, inputs, attrs, opset):  # remembers which node is being converted
        current.update(op=op_name, node=attrs.get("tvm_custom", {}).get("name"))
        return original(self, op_name, inputs, attrs, opset)

    ONNXGraphImporter._convert_operator = tracking
    failure = saved_fd2 = None
    try:
        with warnings.catch_warnings(), contextlib.redirect_stdout(io.StringIO()):
            warnings.simplefilter("ignore")
            mod = from_onnx(proto, shape_dict=shape_dict, dtype_dict=dtype_dict, keep_params_in_input=True)
            mod = tvm.relax.transform.Normalize()(mod)
    except Exception as exc:
        where = f" at op {current['op']!r} (node {current['node']!r})" if current else ""
        failure = f"TVM could not import {os.path.basename(path)}{where}: {_node_hint(exc)}"
        # the failed import's half-built BlockBuilder dies with `exc`, and its C++ destructor prints a warning
        # straight to stderr ("BlockBuilder destroyed with remaining blocks"): let it die now, unheard
        saved_fd2 = _mute_stderr()
    finally:
        ONNXGraphImporter._convert_operator = original
    if failure is not None:
        import gc

        gc.collect()
        _restore_stderr(saved_fd2)
        raise DynatuneError(failure, "check the model's shapes with onnx.shape_inference or give --shape")
    return mod


def _mute_stderr():
    import sys

    sys.stderr.flush()
    saved = os.dup(2)
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, 2)
    os.close(devnull)
    return saved


def _restore_stderr(saved) -> None:
    os.dup2(saved, 2)
    os.close(saved)


def _node_hint(exc: Exception) -> str:
    lines = [ln.strip() for ln in str(exc).strip().splitlines() if ln.strip()]
    last = lines[-1] if lines else type(exc).__name__
    return f"{type(exc).__name__}: {last[:200]}"
