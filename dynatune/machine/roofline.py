"""Roofline: the machine's peak compute and memory bandwidth, and the latency bound of each task.

A task cannot run faster than its FLOPs at the machine's peak compute, nor than its compulsory memory
traffic (every input read once, every output written once) at the machine's memory bandwidth::

    bound_s = max(flops / peak_flops, bytes / bandwidth)

Both machine figures come from a short micro-benchmark (a couple of seconds, on the usable cores). Peak
compute is the rate at which the cores issue the target's vector FMAs (``fma``): a register-only FMA
loop built by TVM for the target (:mod:`dynatune.machine.fma_loop`), the ceiling of every float32
kernel, so no kernel reads above 100 % of it. What a well-tuned GEMM attains is measured beside it as a
cross-check, the best of a few 1024x1024x1024 matrix products by each of two libraries: ONNX Runtime's
MLAS (``onnxruntime-mlas``, a one-node MatMul model with as many intra-op threads as usable cores) and
the BLAS library numpy ships (``numpy-blas``). The best GEMM was the peak before; it is no roof (two
runs on one machine read their kernels at 97 % and 147 % of theirs), and depends on the library (MLAS
reaches about 2.4x what numpy's OpenBLAS does on an AVX-512 machine; both about 75 % of the FMA loop on
a 2-core Zen 3 one). All three are kept (``peaks``). The roof holds for FLOPs as TVM counts them, an
FMA's multiply and add: a kernel counted mostly in other operations (adds, maxima) that a core runs on
pipes of their own (Zen's FADD pipes) could still pass it. Bandwidth is the best of a few copies of an
array far larger than the caches, counted as bytes read plus written. The result is cached per machine
fingerprint (:func:`dynatune.machine.target.machine_fingerprint`) in ``~/.cache/dynatune/roofline/``
(or under ``$DYNATUNE_CACHE_DIR``): measured on quiet cores once, every run after reads it. An entry
measured another way (another ``method``: a GEMM's peak, the numpy-only figures written before MLAS was
measured, or those measured without a look at the load) is measured again.

A shared machine: the load on the cores is probed while the figures are measured
(:mod:`dynatune.machine.load`). Other work on the cores only lowers them, and a peak cached low would
tell every later run's beliefs that its kernels had no headroom left (a peak measured at 07:19 beside
other work read 105 GFLOP/s where the quiet figure is 206, BENCHMARKS.md session 35). Figures measured
on busy cores (:meth:`~dynatune.machine.load.QuietPolicy.busy`) are used by the run that measured them
and cached as ``under_load``: the next run measures again, and keeps the best of each figure (load
cannot raise one), until a measurement on quiet cores makes the entry final. So are figures whose FMA
loop read below a GEMM (:func:`gemm_passes_fma`): the loop lost time to work the probe cannot see, as
another VM on the same physical cores (on a 2-core VM, the FMA loop's rate halved for seconds at a time
with the cores' time all this process's and none stolen). Only CPU targets have one here (``None``
otherwise).

The belief model that uses it is :mod:`dynatune.beliefs.headroom`.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import time
from dataclasses import asdict, dataclass, field, replace
from functools import partial

from dynatune.files import atomic_write_json, cache_root
from dynatune.machine.fma_loop import fma_peak

log = logging.getLogger(__name__)

# How the figures are measured; a cached entry measured otherwise is measured again.
METHOD = "peak=fma-loop|cross-checks=onnxruntime-mlas,numpy-blas@sgemm1024|bandwidth=copy64MiB|load-probed"
FMA_PEAK = "fma"  # the peak's name in `peaks`; the others are the GEMM cross-checks
GEMM_N = 1024
MIN_LOAD_WINDOW_S = 0.25  # a shorter measurement's load is not read: /proc/stat counts in 10 ms ticks


@dataclass(frozen=True)
class Roofline:
    peak_flops: float  # float32 FLOP/s of the FMA loop on the usable cores (peaks["fma"])
    bandwidth: float  # bytes/s of a large copy (read + write)
    fingerprint: str = ""
    measured: str = ""  # date and time of the measurement
    method: str = ""  # how it was measured (METHOD; "" before MLAS was measured)
    peaks: dict = field(default_factory=dict)  # FLOP/s of the FMA loop and each GEMM: {"fma": ...}
    load: dict | None = None  # the load on the cores while they were measured (dynatune.machine.load.Load)
    under_load: bool = False  # measured on busy cores: the next run measures again

    def bound_s(self, flops: float, bytes_moved: float) -> float:
        """The least latency a kernel with this work and traffic can have here (0 when both are unknown)."""
        return max(max(flops, 0.0) / self.peak_flops, max(bytes_moved, 0.0) / self.bandwidth)

    def limit(self, flops: float, bytes_moved: float) -> str:
        """Which roof bounds such a kernel here: ``"memory"`` when its bytes take longer to move at the
        bandwidth than its FLOPs to compute at the peak (a depthwise convolution, a pooling, a batch-1
        classifier), else ``"compute"``."""
        memory = max(bytes_moved, 0.0) / self.bandwidth
        return "memory" if memory > max(flops, 0.0) / self.peak_flops else "compute"

    def share_of_roof(self, flops: float, bytes_moved: float, seconds: float) -> float | None:
        """How close a kernel that takes ``seconds`` comes to its roof (:meth:`bound_s`): 1.0 at the roof.
        A memory-bound kernel whose data stays in the caches can pass 1.0: the bandwidth is DRAM's."""
        bound = self.bound_s(flops, bytes_moved)
        return bound / seconds if bound > 0 and seconds > 0 else None

    def as_dict(self) -> dict:
        return asdict(self)

    def at_least(self, other: "Roofline") -> "Roofline":
        """These figures, each raised to ``other``'s where that is higher (load only ever lowers one)."""
        peaks = {k: max(v, other.peaks.get(k, 0.0)) for k, v in self.peaks.items()}
        return replace(
            self,
            peak_flops=max(self.peak_flops, other.peak_flops),
            bandwidth=max(self.bandwidth, other.bandwidth),
            peaks={**other.peaks, **peaks},
        )


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


def measure_peaks(target, threads: int, seconds: float = 0.5) -> dict[str, float]:
    """float32 FLOP/s of the FMA loop built for ``target`` (:data:`FMA_PEAK`) and of a GEMM by each library
    here (one that fails is left out, with a warning)."""
    peaks = {}
    for name, fn in (
        (FMA_PEAK, partial(fma_peak, target)),
        ("onnxruntime-mlas", mlas_peak),
        ("numpy-blas", numpy_peak),
    ):
        try:
            peaks[name] = float(fn(threads, seconds))
        except Exception as exc:  # a library missing or broken here: the others still give a figure
            log.warning("roofline: the %s peak could not be measured: %s", name, exc)
    return peaks


def peak_of(peaks: dict[str, float]) -> float:
    """The roofline's peak among measured ``peaks``: the FMA loop's, else (a target it cannot be built or
    run for here, with a warning: kernels may read above 100 % of it) the best GEMM's."""
    if FMA_PEAK in peaks:
        return peaks[FMA_PEAK]
    log.warning("roofline: no FMA loop measured; the peak is a GEMM's, which a kernel may pass")
    return max(peaks.values())


def gemm_passes_fma(peaks: dict[str, float]) -> bool:
    """Whether a GEMM cross-check read faster than the FMA loop, which no kernel can: the loop lost time."""
    gemms = [v for k, v in peaks.items() if k != FMA_PEAK]
    return FMA_PEAK in peaks and max(gemms, default=0.0) > peaks[FMA_PEAK]


def mlas_peak(threads: int, seconds: float = 0.5, n: int = GEMM_N) -> float:
    """FLOP/s of ONNX Runtime's MLAS SGEMM: a one-node ``MatMul`` model (its ``n x n`` weight an
    initializer, prepacked as a model's weights are) run on ``threads`` intra-op threads."""
    import numpy as np
    import onnxruntime as ort
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(0)
    weight = numpy_helper.from_array(rng.standard_normal((n, n), dtype=np.float32), "b")
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["a", "b"], ["c"])],
        "peak",
        [helper.make_tensor_value_info("a", TensorProto.FLOAT, [n, n])],
        [helper.make_tensor_value_info("c", TensorProto.FLOAT, [n, n])],
        [weight],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    options.inter_op_num_threads = 1
    session = ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])
    feed = {"a": rng.standard_normal((n, n), dtype=np.float32)}
    session.run(None, feed)  # warm up the threads and the packed weight
    return _best_rate(lambda: session.run(None, feed), 2.0 * n**3, seconds)


def numpy_peak(threads: int, seconds: float = 0.5, n: int = GEMM_N) -> float:
    """FLOP/s of the BLAS library numpy ships (OpenBLAS), limited to ``threads`` threads."""
    import numpy as np
    from threadpoolctl import threadpool_limits

    a = np.random.default_rng(0).standard_normal((n, n), dtype=np.float32)
    b, c = a.T.copy(), np.empty((n, n), dtype=np.float32)
    with threadpool_limits(limits=threads):
        np.matmul(a, b, out=c)  # warm up the BLAS threads
        return _best_rate(lambda: np.matmul(a, b, out=c), 2.0 * n**3, seconds)


def measure_bandwidth(seconds: float = 0.5) -> float:
    """Bytes/s (read + written) of copying an array far larger than the caches."""
    import numpy as np

    src = np.ones(16 * 1024 * 1024, dtype=np.float32)  # 64 MiB: far beyond any cache
    dst = np.ones_like(src)  # touched: no page faults inside the timing
    return _best_rate(lambda: np.copyto(dst, src), 2.0 * src.nbytes, seconds)


def _best_rate(fn, work: float, seconds: float) -> float:
    best, end = 0.0, time.perf_counter() + seconds
    while True:
        t0 = time.perf_counter()
        fn()
        best = max(best, work / (time.perf_counter() - t0))
        if time.perf_counter() > end:
            return best


def machine_roofline(
    target, cache_dir: str | None = None, remeasure: bool = False, quiet=None
) -> Roofline | None:
    """This machine's roofline for ``target``: from the cache, else measured now and cached. None off CPU.

    ``quiet`` (a :class:`~dynatune.machine.load.QuietPolicy`, the default one if None) says when the cores
    were too busy for the figures to be final. ``remeasure`` measures again and replaces the entry."""
    from dynatune.machine.load import QuietPolicy
    from dynatune.machine.target import machine_fingerprint

    if target.kind.name != "llvm":
        return None
    fp = machine_fingerprint(target)
    path = os.path.join(
        cache_dir or cache_root("roofline"), hashlib.sha256(fp.encode()).hexdigest()[:16] + ".json"
    )
    cached = None if remeasure else _cached(path)
    if cached is not None and not cached.under_load:
        return cached
    roof = _measure(fp, target, quiet or QuietPolicy())
    why = _why_not_final(roof) if roof.under_load else ""
    if cached is not None:
        roof = roof.at_least(cached)
    if roof.under_load:
        log.warning(
            "roofline: %s; this run uses the figures (peak %.0f GFLOP/s), the next one measures them again",
            why,
            roof.peak_flops / 1e9,
        )
    os.makedirs(os.path.dirname(path), exist_ok=True)
    atomic_write_json(path, roof.as_dict())
    return roof


def _cached(path: str) -> Roofline | None:
    """The entry at ``path`` if it was measured the current way (None: none, damaged, or another way)."""
    if not os.path.exists(path):
        return None
    try:
        with open(path) as f:
            cached = Roofline(**json.load(f))
    except (OSError, ValueError, TypeError):
        return None  # damaged: measure again
    if cached.method != METHOD:
        log.info("roofline: the cached figures were measured another way (%r): again", cached.method)
        return None
    return cached


def _why_not_final(roof: Roofline) -> str:
    """Why a fresh measurement is cached as ``under_load``: the load on the cores, or its cross-check."""
    from dynatune.machine.load import Load

    if gemm_passes_fma(roof.peaks):
        gemm = max(v for k, v in roof.peaks.items() if k != FMA_PEAK)
        return (
            f"the FMA loop read {roof.peaks[FMA_PEAK] / 1e9:.0f} GFLOP/s, below a GEMM's {gemm / 1e9:.0f} "
            "(other work took time the load probe cannot see)"
        )
    return "measured while " + Load.from_dict(roof.load).describe()  # busy: its load was read


def _measure(fingerprint: str, target, quiet) -> Roofline:
    """The figures measured now, with the load on the cores meanwhile."""
    from dynatune.machine.load import LoadProbe
    from dynatune.machine.target import usable_cores

    threads = usable_cores()
    probe = LoadProbe()
    peaks = measure_peaks(target, threads)
    if not peaks:
        raise RuntimeError("roofline: neither the FMA loop nor a GEMM library could measure the peak here")
    bandwidth = measure_bandwidth()
    load = probe.stop()
    if load.seconds < MIN_LOAD_WINDOW_S:
        load = None
    return Roofline(
        peak_of(peaks),
        bandwidth,
        fingerprint,
        time.strftime("%Y-%m-%dT%H:%M:%S"),
        method=METHOD,
        peaks=peaks,
        load=load.as_dict() if load is not None else None,
        under_load=quiet.busy(load, threads) or gemm_passes_fma(peaks),
    )
