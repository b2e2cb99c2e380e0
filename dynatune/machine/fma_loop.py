"""The peak float32 FLOP/s of a target's vector unit: a register-only FMA loop on every usable core.

No kernel does float32 arithmetic faster than its cores issue fused multiply-adds (2 FLOPs a lane), so
that rate is the roofline's peak (:mod:`dynatune.machine.roofline`), not what a GEMM library attains: a
GEMM's figure differs between libraries and between runs, and a well-tuned kernel passed one by 47 %.

The loop is a TIR kernel that TVM builds for the target the tuning uses, so it follows the target's
``-mcpu`` (its vector unit, :func:`dynatune.machine.vector.vector_unit`), not this machine. One task a
core (``T.parallel``) runs independent vector accumulators through ``acc = fma(x, y, acc)``: as many as
the unit has registers for, within what TVM keeps off the heap (:func:`accumulators`: 12 on AVX2, 15 on
AVX-512, 28 on NEON; an FMA's latency times the FMAs a core issues a cycle needs 8 on most x86 cores, 16
on Apple's). ``x`` and ``y`` are the kernel's arguments (nothing folds at compile time) and every
accumulator is stored at the end (nothing is removed). The assembly is checked (:func:`check_fma_loop`):
the inner loop holds a vector FMA per accumulator, on the unit's vector registers, and no memory
operand; a target without vector FMAs (SSE only) has no loop. Timed with TVM's ``time_evaluator``: the
fastest of many short calls over about half a second, so time slices lost to other work on shared cores
do not lower the figure.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from dynatune.machine.vector import FP32_BYTES, VectorUnit, runs_here, vector_unit

FUNC = "fma_loop"
# vector FMAs per core per call: 0.7 ms at 2 FMAs per cycle at 3 GHz. Short calls find the gaps between
# other work's time slices on shared cores (a 2-core VM: the best of calls of 0.2-0.7 ms read 187 GFLOP/s
# where calls of 6 ms read 77 beside other work), long enough that a parallel launch costs under 1 %
FMAS_PER_CORE = 1 << 22
# TVM allocates a CPU buffer of 1024 bytes or more on the heap (kMaxStackAlloca), where LLVM cannot keep it
# in registers: the accumulators stay below
STACK_BYTES = 1024
WARM_UP_CALLS = 5  # and the least number of calls timed
# an ISA's vector FMA instruction, and what each of its operands shows (AT&T syntax on x86); SSE has none,
# nor has AVX without FMA3 (built, its loop holds no vfmadd: refused)
FMA_FORM = {"avx512": ("vfmadd", "%zmm"), "avx2": ("vfmadd", "%ymm"), "neon": ("fmla", ".4s")}
MEMORY_OPERAND = re.compile(r"[(\[]")  # x86 (AT&T) and AArch64 address operands
LABEL = re.compile(r"^(\.?[\w.$]+):")


@dataclass(frozen=True)
class FmaLoop:
    """The FMA loop built for one target: its library, and the work of one call."""

    lib: object  # the built tvm.runtime.Module
    unit: VectorUnit
    cores: int
    accumulators: int  # vector registers each core accumulates in
    iterations: int  # of the inner loop, each one FMA per accumulator

    @property
    def flops(self) -> float:
        """float32 FLOPs of one call: 2 per lane of every FMA on every core."""
        return 2.0 * self.unit.lanes * self.accumulators * self.iterations * self.cores


def accumulators(unit: VectorUnit) -> int:
    """The loop's independent accumulators on ``unit``: its registers left by the two operands, as few as
    keep them under :data:`STACK_BYTES`."""
    return min(unit.accumulators, (STACK_BYTES - 1) // (unit.lanes * FP32_BYTES))


def fma_loop_func(unit: VectorUnit, cores: int, iterations: int):
    """The loop as a TIR PrimFunc: ``cores`` parallel tasks, each running :func:`accumulators` vector
    accumulators through ``iterations`` FMAs, then storing them to ``out``."""
    from tvm.script import tirx as T

    lanes, regs = unit.lanes, accumulators(unit)
    vec = f"float32x{lanes}"

    @T.prim_func
    def fma_loop(
        x: T.Buffer((lanes,), "float32"),
        y: T.Buffer((lanes,), "float32"),
        out: T.Buffer((cores, regs * lanes), "float32"),
    ):
        T.func_attr({"global_symbol": FUNC, "tir.noalias": True})
        for c in T.parallel(cores):
            acc = T.decl_buffer((regs,), vec, scope="global")  # small: on the stack, then in registers
            for r in T.unroll(regs):
                acc[r] = y[T.Ramp(0, 1, lanes)]
            for _ in range(iterations):
                for r in T.unroll(regs):
                    acc[r] = T.fma(x[T.Ramp(0, 1, lanes)], y[T.Ramp(0, 1, lanes)], acc[r])
            for r in T.unroll(regs):
                out[c, T.Ramp(r * lanes, 1, lanes)] = acc[r]

    return fma_loop


def build_fma_loop(target, cores: int, fmas_per_core: int = FMAS_PER_CORE) -> FmaLoop:
    """The loop built for ``target`` on ``cores`` cores, its assembly checked (:func:`check_fma_loop`).
    Raises RuntimeError for a target without a vector FMA this can build."""
    import tvm

    unit = vector_unit(target)
    if unit is None or unit.isa not in FMA_FORM:
        raise RuntimeError(f"no vector FMA loop for {unit.isa if unit else target.kind.name} targets")
    regs = accumulators(unit)
    iterations = max(1, fmas_per_core // regs)
    lib = tvm.build(tvm.IRModule({FUNC: fma_loop_func(unit, cores, iterations)}), target=target)
    check_fma_loop(lib.inspect_source("asm"), unit)
    return FmaLoop(lib, unit, cores, regs, iterations)


def inner_loop(asm: str, mnemonic: str) -> list[str]:
    """The instructions of the innermost loop that holds ``mnemonic``: the shortest stretch from a label
    to a branch back to it (labels, directives and comments left out); ``[]`` when no loop holds it."""
    lines = [line.split("//")[0].split("#")[0].strip() for line in asm.splitlines()]
    lines = [line for line in lines if line and not line.startswith(".") or LABEL.match(line)]
    labels = {m.group(1): i for i, line in enumerate(lines) if (m := LABEL.match(line))}
    loops = []
    for end, line in enumerate(lines):
        start = labels.get(line.replace(",", " ").split()[-1], end)
        body = [ins for ins in lines[start + 1 : end + 1] if not LABEL.match(ins)]
        if start < end and any(ins.startswith(mnemonic) for ins in body):
            loops.append(body)
    return min(loops, key=len, default=[])


def check_fma_loop(asm: str, unit: VectorUnit) -> None:
    """Raise RuntimeError unless the inner loop of ``asm`` holds at least one vector FMA per accumulator
    on ``unit``'s registers, and no memory operand."""
    mnemonic, register, regs = *FMA_FORM[unit.isa], accumulators(unit)
    body = inner_loop(asm, mnemonic)
    fmas = [line for line in body if line.startswith(mnemonic)]
    memory = [line for line in body if MEMORY_OPERAND.search(line)]
    wrong = [line for line in fmas if line.count(register) != 3]
    if len(fmas) < regs or memory or wrong:
        raise RuntimeError(
            f"the {unit.isa} FMA loop is not {regs} register-only {mnemonic} on {register}: "
            f"{len(fmas)} FMAs, memory operands {memory[:3]}, other registers {wrong[:3]}"
        )


def fma_peak(target, threads: int, seconds: float = 0.5) -> float:
    """FLOP/s of the FMA loop built for ``target`` on ``threads`` cores: the fastest of as many calls as
    fill about ``seconds``. Raises RuntimeError when this machine cannot run the target's vector code."""
    import numpy as np
    import tvm

    unit = vector_unit(target)
    if unit is not None and not runs_here(unit):
        raise RuntimeError(f"this CPU cannot run the target's {unit.isa} code")
    loop = build_fma_loop(target, threads)
    dev = tvm.cpu()
    operand = np.full(loop.unit.lanes, 1e-3, dtype=np.float32)  # acc grows by 1e-6 a step: no denormals
    args = [
        tvm.runtime.tensor(operand, dev),
        tvm.runtime.tensor(operand, dev),
        tvm.runtime.tensor(np.zeros((threads, loop.accumulators * loop.unit.lanes), "float32"), dev),
    ]
    warm_up = loop.lib.time_evaluator(FUNC, dev, number=1, repeat=WARM_UP_CALLS)
    call_s = min(warm_up(*args).results)  # the thread pool started, the clocks up
    calls = max(WARM_UP_CALLS, int(seconds / call_s))
    timer = loop.lib.time_evaluator(FUNC, dev, number=1, repeat=calls)
    return loop.flops / min(timer(*args).results)
