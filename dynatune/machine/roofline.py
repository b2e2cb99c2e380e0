"""Roofline: the machine's peak compute and memory bandwidth, and the latency bound of each task.

A task cannot run faster than its FLOPs at the machine's peak compute, nor than its compulsory memory
traffic (every input read once, every output written once) at the machine's memory bandwidth::

    bound_s = max(flops / peak_flops, bytes / bandwidth)

Both machine figures come from a short micro-benchmark (about a second, on the usable cores): peak
compute is the best of a few float32 matrix products through the BLAS library numpy ships (what a
well-tuned kernel attains here, not the datasheet's figure), bandwidth the best of a few copies of an
array far larger than the caches, counted as bytes read plus written. The result is cached per machine
fingerprint (:func:`dynatune.machine.target.machine_fingerprint`) in ``~/.cache/dynatune/roofline/`` (or under
``$DYNATUNE_CACHE_DIR``): measure it on quiet cores once, every run after reads it. Only CPU targets have one here (``None`` otherwise).

The belief model that uses it is :mod:`dynatune.beliefs.headroom`.
"""

from __future__ import annotations

import hashlib
import json
import os
import time
from dataclasses import asdict, dataclass

from dynatune.files import atomic_write_json, cache_root


@dataclass(frozen=True)
class Roofline:
    peak_flops: float  # FLOP/s attained by a tuned float32 GEMM on the usable cores
    bandwidth: float  # bytes/s of a large copy (read + write)
    fingerprint: str = ""
    measured: str = ""  # date and time of the measurement

    def bound_s(self, flops: float, bytes_moved: float) -> float:
        """The least latency a kernel with this work and traffic can have here (0 when both are unknown)."""
        return max(max(flops, 0.0) / self.peak_flops, max(bytes_moved, 0.0) / self.bandwidth)

    def as_dict(self) -> dict:
        return asdict(self)


def compulsory_bytes(mod) -> float:
    """Bytes a task's PrimFunc must move at least: each of its buffer arguments once (0: unknown)."""
    import numpy as np

    func = mod["main"] if hasattr(mod, "functions") else mod
    total = 0.0
    for param in func.params:
        ty = getattr(param, "ty", None)
        shape = getattr(ty, "shape", None)
        if shape is None:
            continue  # a scalar argument
        n = 1
        for dim in shape:
            if not hasattr(dim, "value"):
                return 0.0  # a symbolic shape
            n *= int(dim.value)
        total += n * np.dtype(str(ty.dtype)).itemsize
    return total


def measure_roofline(threads: int, seconds: float = 0.5) -> tuple[float, float]:
    """(peak FLOP/s, bandwidth bytes/s) measured here, each the best over about ``seconds``."""
    import numpy as np
    from threadpoolctl import threadpool_limits

    n = 1024
    a = np.random.default_rng(0).standard_normal((n, n), dtype=np.float32)
    b, c = a.T.copy(), np.empty((n, n), dtype=np.float32)
    src = np.ones(16 * 1024 * 1024, dtype=np.float32)  # 64 MiB: far beyond any cache
    dst = np.ones_like(src)  # touched: no page faults inside the timing
    with threadpool_limits(limits=threads):
        np.matmul(a, b, out=c)  # warm up the BLAS threads
        peak = _best_rate(lambda: np.matmul(a, b, out=c), 2.0 * n**3, seconds)
    bandwidth = _best_rate(lambda: np.copyto(dst, src), 2.0 * src.nbytes, seconds)
    return peak, bandwidth


def _best_rate(fn, work: float, seconds: float) -> float:
    best, end = 0.0, time.perf_counter() + seconds
    while True:
        t0 = time.perf_counter()
        fn()
        best = max(best, work / (time.perf_counter() - t0))
        if time.perf_counter() > end:
            return best


def machine_roofline(target, cache_dir: str | None = None, remeasure: bool = False) -> Roofline | None:
    """This machine's roofline for ``target``: from the cache, else measured now and cached. None off CPU."""
    from dynatune.machine.target import machine_fingerprint, usable_cores

    if target.kind.name != "llvm":
        return None
    fp = machine_fingerprint(target)
    path = os.path.join(
        cache_dir or cache_root("roofline"), hashlib.sha256(fp.encode()).hexdigest()[:16] + ".json"
    )
    if not remeasure and os.path.exists(path):
        try:
            with open(path) as f:
                return Roofline(**json.load(f))
        except (OSError, ValueError, TypeError):
            pass  # damaged: measure again
    peak, bandwidth = measure_roofline(usable_cores())
    roof = Roofline(peak, bandwidth, fp, time.strftime("%Y-%m-%dT%H:%M:%S"))
    os.makedirs(os.path.dirname(path), exist_ok=True)
    atomic_write_json(path, roof.as_dict())
    return roof
