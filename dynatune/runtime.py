"""The tuned model as its user runs it: load a compiled artifact and predict, at the speed its run measured.

A run's compiled model is two files side by side: the shared library (``model.so``) and its metadata
(``model.json``, plain JSON, written at compile time by :mod:`dynatune.compiler.artifact_metadata`): the
TVM target and the CPU features the library needs, the TVM version, the inputs' and outputs' names, shapes
and dtypes (the ONNX model's), the threads its kernels were planned and timed with, TVM's thread pool as
it was timed, and the latency and ratio to ONNX Runtime that were measured, with their spread::

    from dynatune.runtime import load

    model = load("runs/quickstart/model.so")               # or the directory that holds it
    outputs = model.predict({"data": x})                   # {"squeezenet0_flatten0_reshape0": array}

:func:`load`, before TVM's thread pool starts, sets the thread pool the model was timed with
(``TVM_NUM_THREADS`` and the rest of :data:`THREAD_POOL_VARS`, each unless the user set it: left alone,
TVM uses half of an x86 machine's cores). It refuses, with one line (:class:`ArtifactError`), a CPU that
lacks a feature the library was built for (checked against the running CPU before the library is loaded:
loading it anyway would end the process with an illegal instruction), and :meth:`TunedModel.predict`
refuses inputs whose names, shapes or dtypes are not the model's. Its inputs and outputs are tensors made
once (:class:`VMCall`: the library's ``main_into`` writes the outputs), so a run allocates nothing.

This module is self-contained: it imports the standard library, numpy and TVM's runtime, never the rest
of dynatune, Prefect or MLflow. The MLflow model of a run (:mod:`dynatune.tasks.tuned_model`) ships it as its
loader, so a model served from the registry needs only TVM and numpy.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping

import numpy as np

METADATA_FORMAT = 1
LIBRARY_FILE = "model.so"
# TVM's thread pool as the model was timed: the number of threads, how long idle workers spin for the next
# job, and whether workers are pinned to cores (dynatune.machine.target.set_tvm_thread_pool)
THREAD_POOL_VARS = ("TVM_NUM_THREADS", "TVM_THREAD_POOL_SPIN_COUNT", "TVM_BIND_THREADS")
# the entry that runs the model into output tensors its caller passes (dynatune.model.destination_entry): a
# run that allocates nothing. Where a library has it, a caller makes its outputs once, with a run of ``main``
INTO_ENTRY = "main_into"
# set by dynatune's own import: which of THREAD_POOL_VARS it defaulted (they are not the user's choice)
DEFAULTED_VARS_MARK = "DYNATUNE_DEFAULTED_THREAD_POOL_VARS"

# LLVM's name of a CPU feature that changes the code generated for kernels -> the name Linux gives it in
# /proc/cpuinfo (x86 "flags", Arm "Features"); a library built for a CPU with the feature may use it
LLVM_TO_CPUINFO = {
    "ssse3": "ssse3",
    "sse4.1": "sse4_1",
    "sse4.2": "sse4_2",
    "popcnt": "popcnt",
    "avx": "avx",
    "avx2": "avx2",
    "fma": "fma",
    "f16c": "f16c",
    "bmi": "bmi1",
    "bmi2": "bmi2",
    "movbe": "movbe",
    "avx512f": "avx512f",
    "avx512cd": "avx512cd",
    "avx512dq": "avx512dq",
    "avx512bw": "avx512bw",
    "avx512vl": "avx512vl",
    "avx512ifma": "avx512ifma",
    "avx512vbmi": "avx512vbmi",
    "avx512vbmi2": "avx512_vbmi2",
    "avx512vnni": "avx512_vnni",
    "avx512bitalg": "avx512_bitalg",
    "avx512vpopcntdq": "avx512_vpopcntdq",
    "avx512bf16": "avx512_bf16",
    "avx512fp16": "avx512_fp16",
    "amx-tile": "amx_tile",
    "amx-bf16": "amx_bf16",
    "amx-int8": "amx_int8",
    "neon": "asimd",
    "fullfp16": "asimdhp",
    "dotprod": "asimddp",
    "i8mm": "i8mm",
    "bf16": "bf16",
    "sve": "sve",
    "sve2": "sve2",
}


class ArtifactError(Exception):
    """A compiled model that cannot run here, or inputs it cannot take: one line saying which and why."""


def metadata_path(library: str) -> str:
    """The metadata file of a library: ``model.so`` -> ``model.json``, beside it."""
    return os.path.splitext(library)[0] + ".json"


def read_metadata(path: str) -> dict:
    """The metadata of a compiled model (``path``: the library, its metadata file, or their directory)."""
    meta_file = path if path.endswith(".json") else metadata_path(_library_path(path))
    try:
        with open(meta_file) as f:
            meta = json.load(f)
    except FileNotFoundError:
        raise ArtifactError(
            f"no metadata file {meta_file}: a dynatune model is its library and the metadata beside it"
        ) from None
    except (OSError, ValueError) as exc:
        raise ArtifactError(f"cannot read {meta_file}: {exc}") from None
    if not isinstance(meta, dict) or meta.get("format") != METADATA_FORMAT:
        found = meta.get("format") if isinstance(meta, dict) else None
        raise ArtifactError(f"{meta_file} is not metadata of format {METADATA_FORMAT} (format {found!r})")
    return meta


def _library_path(path: str) -> str:
    return os.path.join(path, LIBRARY_FILE) if os.path.isdir(path) else path


def cpu_features(cpuinfo: str = "/proc/cpuinfo") -> set[str] | None:
    """The running CPU's features as Linux names them (None where they cannot be read: not Linux)."""
    try:
        with open(cpuinfo) as f:
            for line in f:
                key, _, value = line.partition(":")
                if key.strip() in ("flags", "Features"):
                    return set(value.split())
    except OSError:
        return None
    return None


def required_features(llvm_features) -> list[str]:
    """The CPU features (Linux names) a library built with ``llvm_features`` (its target's, as LLVM names
    them) may use in its kernels: what :func:`load` checks the running CPU for."""
    return sorted({LLVM_TO_CPUINFO[f] for f in llvm_features if f in LLVM_TO_CPUINFO})


def missing_features(meta: dict, available) -> list[str]:
    """The features the library needs (``meta``'s) that ``available`` lacks ([] when ``available`` is
    None: nothing to check against)."""
    if available is None:
        return []
    have = set(available)
    return [f for f in meta.get("cpu", {}).get("required_features", []) if f not in have]


def usable_cores() -> int:
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # pragma: no cover - not Linux
        return max(1, os.cpu_count() or 1)


def user_set(var: str, environ: Mapping[str, str] = os.environ) -> bool:
    """Whether ``var`` was set by the user (not defaulted by dynatune's own import)."""
    return var in environ and var not in environ.get(DEFAULTED_VARS_MARK, "").split(",")


def apply_thread_pool(meta: dict, environ=os.environ) -> dict[str, str]:
    """Set TVM's thread pool as the model was timed, in ``environ``, for each variable the user did not
    set; the thread count at most this machine's usable cores. Returns what was set."""
    wanted = dict(meta.get("thread_pool") or {})
    if "TVM_NUM_THREADS" in wanted:
        wanted["TVM_NUM_THREADS"] = str(min(int(wanted["TVM_NUM_THREADS"]), usable_cores()))
    applied = {k: str(v) for k, v in wanted.items() if k in THREAD_POOL_VARS and not user_set(k, environ)}
    environ.update(applied)
    return applied


def flatten_outputs(out) -> list:
    """A VM's result (a tensor, or nested tuples of them) as a flat list of tensors."""
    import tvm

    if isinstance(out, (list, tuple)) or hasattr(out, "__len__") and not isinstance(out, tvm.runtime.Tensor):
        flat = []
        for o in out:
            flat.extend(flatten_outputs(o))
        return flat
    return [out]


class TunedModel:
    """A loaded compiled model: ``predict({input name: array}) -> {output name: array}``."""

    def __init__(self, library: str, meta: dict, vm, device):
        self.library = library
        self.metadata = meta
        self.vm = vm  # tvm.relax.VirtualMachine
        self.device = device
        self.inputs = [(i["name"], tuple(i["shape"]), i["dtype"]) for i in meta["inputs"]]
        self.outputs = [(o["name"], tuple(o["shape"]), o["dtype"]) for o in meta["outputs"]]
        self._names = [n for n, _, _ in self.inputs]
        self._expected = [(n, shape, np.dtype(dtype)) for n, shape, dtype in self.inputs]
        self._call = VMCall(vm, device, [(shape, dtype) for _, shape, dtype in self.inputs])

    @property
    def threads(self) -> int:
        """The threads TVM's pool runs the model on in this process."""
        import tvm

        return int(tvm.get_global_func("runtime.NumThreads")())

    def check_inputs(self, inputs: Mapping[str, np.ndarray]) -> None:
        """One line naming what is wrong with ``inputs`` (names, shapes, dtypes), or nothing."""
        if isinstance(inputs, Mapping) and len(inputs) == len(self._expected):
            for name, shape, dtype in self._expected:  # the common case, in a few microseconds
                x = inputs.get(name)
                if not isinstance(x, np.ndarray) or x.dtype != dtype or x.shape != shape:
                    break
            else:
                return
        self._explain(inputs)

    def _explain(self, inputs) -> None:
        if not isinstance(inputs, Mapping):
            raise ArtifactError(
                f"inputs must be a mapping of input name to array, not {type(inputs).__name__}"
            )
        names = [n for n, _, _ in self.inputs]
        unknown = [k for k in inputs if k not in names]
        missing = [n for n in names if n not in inputs]
        if unknown or missing:
            said = f"unknown input {unknown[0]!r}" if unknown else f"missing input {missing[0]!r}"
            raise ArtifactError(f"{said}: the model's inputs are {', '.join(names)}")
        for name, shape, dtype in self.inputs:
            x = inputs[name]
            if getattr(x, "dtype", None) is None or np.dtype(x.dtype).name != dtype:
                got = np.dtype(x.dtype).name if getattr(x, "dtype", None) is not None else type(x).__name__
                raise ArtifactError(f"input {name!r} is {got}: the model takes {dtype}")
            if tuple(x.shape) != shape:
                raise ArtifactError(
                    f"input {name!r} has shape {'x'.join(map(str, x.shape))}: "
                    f"the model takes {'x'.join(map(str, shape))}"
                )

    def predict(self, inputs: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        """The model's outputs for ``inputs``, named and shaped as in the ONNX model."""
        self.check_inputs(inputs)
        outs = self._call([inputs[n] for n in self._names])
        return {name: o.reshape(shape) for (name, shape, _), o in zip(self.outputs, outs)}


def has_entry(vm, name: str) -> bool:
    """Whether a Relax VM's library has the function ``name``."""
    return bool(vm.module.implements_function(name))


def entry_arguments(vm, inputs: list) -> tuple[str, list]:
    """The entry a run calls and its arguments, for callers that set them once (``set_input``,
    ``invoke_stateful``, TVM's evaluator): :data:`INTO_ENTRY` with ``inputs`` (device tensors) and the
    outputs of one run of ``main`` to write into, where the library has it; else ``main`` and ``inputs``."""
    if not has_entry(vm, INTO_ENTRY):
        return "main", list(inputs)
    return INTO_ENTRY, [*inputs, *flatten_outputs(vm["main"](*inputs))]


class VMCall:
    """A VM's ``main`` called as a user calls a model: numpy arrays in, numpy arrays out.

    The inputs are copied into device tensors allocated once: a tensor allocated per call
    (``tvm.runtime.tensor(array)``) made the README job's SqueezeNet 10.8 ms a call instead of 8.6 (its
    0.6 MB input mapped and faulted in afresh each time). On a CPU the copies in and out go through numpy
    views of the tensors (DLPack): 1 us each, where TVM's ``copyfrom`` and ``numpy()`` took 20 us each in
    Python (a third of a 0.2 ms model's call). The outputs too are made once where the library has
    :data:`INTO_ENTRY`: the first call runs ``main``, and its outputs are the tensors every later call's
    ``main_into`` writes, so a run allocates nothing. One call at a time (a lock): the VM and the tensors
    are shared."""

    def __init__(self, vm, device, specs):
        """``specs``: each input's (shape, dtype), in the model's order."""
        import threading

        import tvm

        self._main = vm["main"]
        self._into = vm[INTO_ENTRY] if has_entry(vm, INTO_ENTRY) else None
        self._args = [tvm.runtime.empty(tuple(shape), dtype, device) for shape, dtype in specs]
        self._cpu = device.dlpack_device_type() == 1  # kDLCPU
        self._views = [np.from_dlpack(t) for t in self._args] if self._cpu else None
        self._outputs = None  # (tensors, their numpy views) that main_into writes, after the first call
        self._lock = threading.Lock()

    def __call__(self, arrays) -> list[np.ndarray]:
        """The outputs for ``arrays`` (the inputs in order, of the specs' shapes and dtypes)."""
        with self._lock:
            if self._cpu:
                for view, a in zip(self._views, arrays):
                    np.copyto(view, a)
            else:
                for tensor, a in zip(self._args, arrays):
                    tensor.copyfrom(np.ascontiguousarray(a))
            if self._outputs is not None:
                outs, views = self._outputs
                self._into(*self._args, *outs)
            else:
                outs = flatten_outputs(self._main(*self._args))
                views = [np.from_dlpack(o) for o in outs] if self._cpu else None
                if self._into is not None:
                    self._outputs = outs, views
            return [v.copy() for v in views] if self._cpu else [o.numpy() for o in outs]


def load(path: str, *, cpu_features_available=None) -> TunedModel:
    """Load a compiled model (``path``: its library, or the directory that holds ``model.so``) to run at
    the speed its run measured. ``cpu_features_available``: the features to check the library's against
    (default: the running CPU's)."""
    library = _library_path(path)
    if not os.path.isfile(library):
        raise ArtifactError(f"no compiled model at {path}")
    meta = read_metadata(library)
    available = cpu_features() if cpu_features_available is None else cpu_features_available
    missing = missing_features(meta, available)
    if missing:
        built = meta.get("cpu", {}).get("name") or "another CPU"
        raise ArtifactError(
            f"this CPU lacks {', '.join(missing)}, which {os.path.basename(library)} was built for "
            f"({built}, target {meta.get('target')}): tune the model on this kind of machine"
        )
    apply_thread_pool(meta)  # before TVM's pool starts (its first parallel kernel)
    import tvm
    from tvm import relax

    device = tvm.device(meta.get("device", "cpu"), 0)
    vm = relax.VirtualMachine(tvm.runtime.load_module(library), device)
    return TunedModel(library, meta, vm, device)
