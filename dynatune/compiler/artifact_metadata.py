"""What a compiled model needs to run as it was measured, written beside it at compile time (``model.json``).

:func:`describe` gathers it when the library is exported and checked: the TVM target, the CPU it was built
on with the features the library needs (the target's, as :func:`dynatune.runtime.required_features` names
them), the TVM and dynatune versions, the inputs' and outputs' names, shapes and dtypes (the ONNX model's),
the threads the kernels were planned for (the target's ``num-cores``) and timed with, and TVM's thread pool
as the timing ran it. :func:`record_timing` adds the side-by-side timing against ONNX Runtime once it is
taken (latency and ratio, with their spread over the rounds). Plain JSON, no pickle; read back by
:func:`dynatune.runtime.read_metadata`, and by :func:`dynatune.runtime.load` before the library is loaded.
"""

from __future__ import annotations

import datetime
import os

from dynatune.files import atomic_write_json
from dynatune.runtime import (
    METADATA_FORMAT,
    THREAD_POOL_VARS,
    metadata_path,
    read_metadata,
    required_features,
)


def describe(library: str, model, target, outputs, threads: int) -> dict:
    """The metadata of ``library``, compiled from ``model`` for ``target``. ``outputs``: the model's
    outputs for one input (ONNX Runtime's: their names are the model's), which give their shapes and
    dtypes; ``threads``: the threads the model is timed with."""
    import tvm

    from dynatune import __version__
    from dynatune.machine.target import cpu_model_and_isa, planned_cores, target_device

    name, isa = cpu_model_and_isa()
    llvm = target if target.kind.name == "llvm" else target.host
    features = tvm.target.codegen.llvm_get_cpu_features(llvm) if llvm is not None else []
    return {
        "format": METADATA_FORMAT,
        "library": os.path.basename(library),
        "created": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "model": {"name": model.name, "sha256": model.sha256},
        "target": str(target),
        "device": target_device(target),
        "cpu": {"name": name, "isa": isa, "required_features": required_features(features)},
        "tvm_version": tvm.__version__,
        "dynatune_version": __version__,
        "inputs": [{"name": i.name, "shape": list(i.shape), "dtype": i.dtype} for i in model.inputs],
        "outputs": [
            {"name": n, "shape": list(o.shape), "dtype": str(o.dtype)}
            for n, o in zip(model.output_names, outputs)
        ],
        "threads": {"planned": planned_cores(target), "timed": threads},
        "thread_pool": {k: os.environ[k] for k in THREAD_POOL_VARS if k in os.environ}
        | {"TVM_NUM_THREADS": str(threads)},
        "measured": None,
    }


def write(library: str, meta: dict) -> str:
    """Write ``meta`` beside ``library``; returns the metadata file's path."""
    path = metadata_path(library)
    atomic_write_json(path, meta)
    return path


def record_timing(library: str, sbs) -> dict:
    """Add the side-by-side timing ``sbs`` (:class:`dynatune.compiler.timing.SideBySide`) to the metadata
    of ``library``; returns the metadata."""
    meta = read_metadata(library)
    meta["measured"] = {
        "latency_ms": sbs.tvm_median_ms,
        "latency_min_ms": min(sbs.tvm_ms),
        "latency_max_ms": max(sbs.tvm_ms),
        "onnxruntime_ms": sbs.ort_median_ms,
        "ratio_vs_onnxruntime": sbs.ratio,
        "ratio_vs_onnxruntime_min": sbs.ratio_min,
        "ratio_vs_onnxruntime_max": sbs.ratio_max,
        "ratio_vs_onnxruntime_per_process": sbs.per_process_ratios,
        "rounds": len(sbs.tvm_ms),
        "under_load": bool(sbs.under_load),
        "load_cores": sbs.load_cores,
        "onnxruntime_slow": bool(sbs.onnxruntime_slow),
        "onnxruntime_reference_ms": sbs.onnxruntime_reference_ms,
        "measured_at": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
    }
    write(library, meta)
    return meta
