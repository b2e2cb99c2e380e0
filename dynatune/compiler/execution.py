"""Running a compiled model and its ONNX Runtime reference: what both the compiler and the fresh timing
process need (load an artifact, run it, time it; an ONNX Runtime session with a given thread count).
A user of the artifact runs it with :mod:`dynatune.runtime` instead."""

from __future__ import annotations

import numpy as np

from dynatune.runtime import VMCall


def load(path: str, device):
    """The artifact in plain TVM (the compiler's check, before its metadata is written)."""
    import tvm
    from tvm import relax

    return relax.VirtualMachine(tvm.runtime.load_module(path), device)


def run(vm, model, inputs: dict[str, np.ndarray], device) -> list[np.ndarray]:
    call = VMCall(vm, device, [(i.shape, i.dtype) for i in model.inputs])
    return call([inputs[i.name] for i in model.inputs])


def time_vm(vm, model, inputs, device, repeat: int = 10, block_ms: float = 200.0) -> tuple[float, float]:
    """(mean, std) end-to-end latency in ms over ``repeat`` blocks of runs, each at least ``block_ms`` long
    (:func:`dynatune.compiler.timing.vm_block_timer`: the loop count sized once, not in every block)."""
    from dynatune.compiler.timing import vm_block_timer

    block = vm_block_timer(vm, {i.name: inputs[i.name] for i in model.inputs}, device, block_ms)
    vals = np.array([block() for _ in range(repeat)])
    return float(vals.mean()), float(vals.std())


def onnxruntime_session(model, threads: int, options=None):
    """ONNX Runtime on the CPU with ``threads`` intra-op threads (the same count TVM gets); ``model``: a
    :class:`~dynatune.model.importer.Model` or an ONNX proto; ``options``: session options to start from
    (the profiler's, say).

    Otherwise ONNX Runtime runs as a user runs it in production: its defaults, which its documentation
    ("Thread management") gives as the settings "to get fast inference performance": sequential
    execution, all graph optimizations, and ``session.intra_op.allow_spinning`` = 1 (pool threads spin
    after a run, waiting for the next). Turning spinning off saves CPU between requests but slows
    back-to-back runs; it would slow ONNX Runtime's side on a quiet machine and flatter dynatune.
    Spinning is also why a busy core hurts ONNX Runtime far more than TVM: the answer to that is to
    time on a quiet machine (:mod:`dynatune.machine.load`), not to time ONNX Runtime as nobody runs it."""
    import onnxruntime as ort

    so = options or ort.SessionOptions()
    so.intra_op_num_threads = threads
    so.inter_op_num_threads = 1
    proto = getattr(model, "onnx_model", model)
    return ort.InferenceSession(proto.SerializeToString(), so, providers=["CPUExecutionProvider"])


def onnxruntime_outputs(model, inputs, threads: int):
    sess = onnxruntime_session(model, threads)
    return sess, sess.run(None, inputs)


def relax_vm(executable, device):
    from tvm import relax

    return relax.VirtualMachine(executable, device)
