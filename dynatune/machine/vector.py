"""The vector unit and caches a target's kernels are built for: what an analytic schedule is derived from.

Everything here follows the *target* (its ``-mcpu`` and the features LLVM gives it), not the machine this
runs on, so a schedule for an AVX2 target is the same wherever it is planned. Only the cache sizes are read
from this machine (``/sys``), and only when the target is this machine's CPU: a cross target gets the sizes
its class of CPU usually has.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import partial

FP32_BYTES = 4
# a typical x86 core of today, for a target that is not this machine
DEFAULT_L1D = 32 * 1024
DEFAULT_L2 = 1024 * 1024
# the LLVM feature a CPU needs to run each ISA's vector code
ISA_FEATURE = {"avx512": "avx512f", "avx2": "avx2", "sse": "sse2", "neon": "neon"}


@dataclass(frozen=True)
class VectorUnit:
    """One core's fp32 vector unit and its private caches."""

    isa: str  # avx512 | avx2 | sse | neon | scalar
    lanes: int  # fp32 lanes in one vector register
    registers: int  # architectural vector registers
    l1d_bytes: int = DEFAULT_L1D
    l2_bytes: int = DEFAULT_L2

    @property
    def accumulators(self) -> int:
        """Vector registers a register-blocked micro-kernel may fill with accumulators: the rest hold the
        weights' vectors of one reduction step and a broadcast input."""
        return self.registers - 4

    def as_dict(self) -> dict:
        return {
            "isa": self.isa,
            "lanes": self.lanes,
            "registers": self.registers,
            "l1d_bytes": self.l1d_bytes,
            "l2_bytes": self.l2_bytes,
        }


def vector_unit(target) -> VectorUnit | None:
    """The fp32 vector unit of ``target`` (an LLVM CPU target), from the features LLVM derives from its
    ``-mcpu``/``-mattr``; ``None`` for other kinds of target."""
    if target.kind.name != "llvm":
        return None
    l1d, l2 = cache_sizes(target)
    has = partial(has_feature, target)
    if has("avx512f"):
        return VectorUnit("avx512", 16, 32, l1d, l2)
    if has("avx2") or has("avx"):
        return VectorUnit("avx2", 8, 16, l1d, l2)
    if has("neon"):
        return VectorUnit("neon", 4, 32, l1d, l2)
    if has("sse2"):
        return VectorUnit("sse", 4, 16, l1d, l2)
    return VectorUnit("scalar", 1, 16, l1d, l2)


def has_feature(target, feature: str) -> bool:
    """Whether LLVM gives ``target`` the CPU feature ``feature`` (``avx512f``, ``neon``, ...)."""
    from tvm.target.codegen import target_has_features

    try:
        return bool(target_has_features(feature, target))
    except Exception:  # a feature the target's architecture does not know
        return False


def runs_here(unit: VectorUnit) -> bool:
    """Whether this machine's CPU can run code built for ``unit``: it has the feature that ``unit``'s ISA
    needs (a target for another CPU, or another architecture, may not)."""
    import tvm
    from tvm.target.codegen import llvm_get_system_cpu

    if unit.isa not in ISA_FEATURE:
        return True  # scalar code
    host = tvm.target.Target({"kind": "llvm", "mcpu": str(llvm_get_system_cpu())})
    return has_feature(host, ISA_FEATURE[unit.isa])


def cache_sizes(target) -> tuple[int, int]:
    """(L1d, L2) bytes of one core: read from ``/sys`` when ``target`` is this machine's CPU, the usual
    sizes otherwise."""
    from tvm.target.codegen import llvm_get_system_cpu

    mcpu = str(target.attrs.get("mcpu", ""))
    if mcpu and mcpu != str(llvm_get_system_cpu()):
        return DEFAULT_L1D, DEFAULT_L2
    return _sys_cache("1", "Data") or DEFAULT_L1D, _sys_cache("2", "Unified") or DEFAULT_L2


def _sys_cache(level: str, kind: str, cpu: int = 0) -> int | None:
    import glob

    for index in sorted(glob.glob(f"/sys/devices/system/cpu/cpu{cpu}/cache/index*")):
        try:
            with open(f"{index}/level") as f1, open(f"{index}/type") as f2, open(f"{index}/size") as f3:
                if f1.read().strip() == level and f2.read().strip() == kind:
                    return _parse_size(f3.read().strip())
        except OSError:
            continue
    return None


def _parse_size(text: str) -> int | None:
    units = {"K": 1024, "M": 1024 * 1024, "G": 1024**3}
    try:
        if text and text[-1] in units:
            return int(text[:-1]) * units[text[-1]]
        return int(text)
    except ValueError:
        return None
