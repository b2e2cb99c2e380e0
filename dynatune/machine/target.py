"""Compilation targets: the local CPU by default, any TVM target on request."""

from __future__ import annotations

import os

from dynatune.errors import DynatuneError
from dynatune.runtime import DEFAULTED_VARS_MARK, cpu_features, usable_cores

__all__ = ["usable_cores"]  # (re-exported: the runtime counts the cores the same way)


# TVM's pool threads spin this many sched_yield()s for the next job after one (TVM's default: 300,000,
# about 0.3 s): enough for back-to-back runs, short enough not to take the cores from ONNX Runtime
TVM_SPIN_COUNT = 1000


def planned_cores(target) -> int:
    """The cores a target's kernels are planned for: its ``num-cores``, else this machine's usable ones."""
    return int(target.attrs.get("num-cores", 0)) or usable_cores()


def set_tvm_thread_pool() -> None:
    """TVM's thread pool as dynatune runs it, set in the environment (``TVM_NUM_THREADS``,
    ``TVM_THREAD_POOL_SPIN_COUNT``, ``TVM_BIND_THREADS``, and OpenMP's ``OMP_WAIT_POLICY``), each unless the
    user set it (those it set are named in ``DYNATUNE_DEFAULTED_THREAD_POOL_VARS``, so that
    :func:`dynatune.runtime.load` can tell them from the user's); called when dynatune is imported,
    before TVM's pool starts, so every process inherits it: the tuning's workers, the fresh timing
    process.

    - Every usable core. Left alone, TVM takes an x86 machine's cores for hyper-threads and uses half of
      them: one thread on a 2-core machine, where ONNX Runtime runs two (a 3x3 convolution of SqueezeNet:
      111 GFLOP/s on TVM's default, 221 with both cores).
    - A short spin. After a job, TVM's workers spin for the next one for about 0.3 s; in the process that
      times the model side by side with ONNX Runtime, that took ONNX Runtime's cores in the block after
      TVM's (its time 3.6 -> 4.5-6.5 ms, erratic). With :data:`TVM_SPIN_COUNT`, both run as fast as
      alone: TVM 3.84 ms (3.89 with the long spin), ONNX Runtime 3.65 ms (BENCHMARKS.md, session 13).
    - Threads the OS may move. TVM pins each worker to a core; with another process busy on one core, the
      pinned worker got that core's time slices and every parallel kernel waited for it: the README job's
      model took 154 ms instead of 4 (ONNX Runtime 14 ms). Unpinned: 7.7 ms; on quiet cores no
      difference was measurable (BENCHMARKS.md, session 13).
    """
    defaults = {
        "TVM_NUM_THREADS": str(usable_cores()),
        "TVM_THREAD_POOL_SPIN_COUNT": str(TVM_SPIN_COUNT),
        "TVM_BIND_THREADS": "0",
    }
    defaulted = set(filter(None, os.environ.get(DEFAULTED_VARS_MARK, "").split(",")))
    for var, value in defaults.items():
        if var not in os.environ:
            os.environ[var] = value
            defaulted.add(var)
    # what dynatune chose, not the user: the runtime's loader sets a model's own thread pool over these
    os.environ[DEFAULTED_VARS_MARK] = ",".join(sorted(defaulted))
    # OpenMP (XGBoost's cost models) waits passively: its spinning threads made each boosting round 1.7x
    # slower with one core busy, and 12-27x slower beside a tuning's workers (BENCHMARKS.md, session 14)
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")


def make_target(spec: str | dict | None = None, num_cores: int | None = None):
    """Build a ``tvm.target.Target``.

    ``None`` or ``"llvm"``/``"cpu"``: the local CPU, with the detected ``mcpu`` and ``num-cores`` set to
    the usable cores (TVM 0.27 rejects the CLI string form ``"llvm -num-cores 2"``).
    ``"cuda"`` (or any other kind name) or a dict: passed to TVM, a dict as-is; CUDA gets the host set to
    the local CPU.
    """
    import tvm

    cores = num_cores or usable_cores()
    if spec is None or spec in ("llvm", "cpu", "local"):
        return tvm.target.Target(_local_cpu(cores))
    try:
        if isinstance(spec, dict):
            spec = dict(spec)
            if spec.get("kind") == "llvm":
                spec = {**_local_cpu(cores), **spec}
            return tvm.target.Target(spec)
        if " " in spec.strip():
            raise DynatuneError(
                f"target {spec!r} uses the CLI string form, which TVM 0.27 rejects",
                "give a kind name like 'llvm' or 'cuda', or a mapping such as {kind: llvm, mcpu: ...}",
            )
        if spec == "cuda":
            # MetaSchedule's GPU rules need the launch limits on the target
            return tvm.target.Target(
                {
                    "kind": "cuda",
                    "arch": _cuda_arch(),
                    "max_threads_per_block": 1024,
                    "max_shared_memory_per_block": 49152,
                    "thread_warp_size": 32,
                },
                host=_local_cpu(cores),
            )
        return tvm.target.Target(spec)
    except DynatuneError:
        raise
    except Exception as exc:  # TVM raises its own error types with long messages
        raise DynatuneError(f"invalid target {spec!r}: {str(exc).strip().splitlines()[-1]}") from None


def _local_cpu(cores: int) -> dict:
    import tvm

    return {"kind": "llvm", "mcpu": tvm.target.codegen.llvm_get_system_cpu(), "num-cores": cores}


def _cuda_arch() -> str:
    import tvm

    dev = tvm.cuda(0)
    if not dev.exist:
        raise DynatuneError("target 'cuda' was asked for but no CUDA device is visible")
    return "sm_" + dev.compute_version.replace(".", "")


def gpu_default_schedule():
    """DLight's rules: how functions without a tuned record are scheduled on a GPU (also the default
    latency the session measures for GPU tasks)."""
    from tvm.s_tir import dlight as dl

    return dl.ApplyDefaultSchedule(
        dl.gpu.Matmul(), dl.gpu.GEMV(), dl.gpu.Reduction(), dl.gpu.GeneralReduction(), dl.gpu.Fallback()
    )


def target_device(target) -> str:
    """The runtime device type name ('cpu', 'cuda', ...) of a target."""
    kind = target.kind.name
    return "cpu" if kind == "llvm" else kind


def describe(target) -> str:
    kind = target.kind.name
    if kind == "llvm":
        return f"llvm/{target.attrs.get('mcpu', 'generic')}/{target.attrs.get('num-cores', '?')}c"
    return str(kind) + (f"/{target.attrs['arch']}" if "arch" in target.attrs else "")


ISA_FLAGS = (
    "sse4_2",
    "avx",
    "avx2",
    "fma",
    "avx512f",
    "avx512bw",
    "avx512vl",
    "avx512_vnni",
    "avx512_bf16",
    "amx_tile",
    "asimd",
    "sve",
)


def cpu_model_and_isa() -> tuple[str, list[str]]:
    """This CPU's model name and its ISA features that change code generation (from /proc/cpuinfo)."""
    import platform

    name = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                key, _, value = line.partition(":")
                if key.strip() == "model name":
                    name = value.strip()
                    break
    except OSError:
        pass
    flags = cpu_features() or set()
    return name, [f for f in ISA_FLAGS if f in flags]


def machine_fingerprint(target) -> str:
    """What a measured latency is valid for: the target (kind, mcpu, cores), the CPU model and its ISA."""
    name, isa = cpu_model_and_isa()
    return f"{describe(target)}|{name}|{'+'.join(isa)}"
