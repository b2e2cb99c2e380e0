"""The roofline's peak is a register-only FMA loop built for the target's vector unit (AVX-512, AVX2,
NEON: checked in its assembly, built for each without running the ones this machine cannot run), timed
as the fastest of many short calls."""

import platform

import pytest
import tvm

from dynatune.machine import fma_loop
from dynatune.machine.fma_loop import (
    FMA_FORM,
    FmaLoop,
    accumulators,
    build_fma_loop,
    check_fma_loop,
    fma_peak,
    inner_loop,
)
from dynatune.machine.vector import vector_unit

AARCH64 = {"kind": "llvm", "mtriple": "aarch64-linux-gnu", "mcpu": "neoverse-n1"}
X86_AVX512 = {"kind": "llvm", "mtriple": "x86_64-linux-gnu", "mcpu": "skylake-avx512"}


@pytest.mark.parametrize(
    "spec, isa, lanes, regs",
    [
        (X86_AVX512, "avx512", 16, 15),  # 16 zmm accumulators would be 1 KiB: TVM puts that on the heap
        ({"kind": "llvm", "mtriple": "x86_64-linux-gnu", "mcpu": "haswell"}, "avx2", 8, 12),
        (AARCH64, "neon", 4, 28),
    ],
)
def test_the_loop_is_built_for_the_targets_vector_unit(spec, isa, lanes, regs):
    loop = build_fma_loop(tvm.target.Target(spec), cores=3)
    assert (loop.unit.isa, loop.unit.lanes, loop.accumulators) == (isa, lanes, regs)
    mnemonic, register = FMA_FORM[isa]
    body = inner_loop(loop.lib.inspect_source("asm"), mnemonic)
    fmas = [ins for ins in body if ins.startswith(mnemonic)]
    assert fmas and len(fmas) % regs == 0  # one FMA per accumulator, however often LLVM unrolled
    assert all(ins.count(register) == 3 for ins in fmas)  # the unit's full-width registers
    assert not [ins for ins in body if "(" in ins or "[" in ins]  # no memory traffic in the loop
    assert loop.flops == 2 * lanes * regs * loop.iterations * 3


def test_a_loop_that_touches_memory_or_has_no_fma_is_refused():
    unit = vector_unit(tvm.target.Target({"kind": "llvm", "mcpu": "haswell"}))
    spilled = ".LBB3_4:\n\tvmovaps\t(%r15), %ymm12\n" + "\tvfmadd213ps\t(%rax), %ymm12, %ymm13\n" * 12
    with pytest.raises(RuntimeError, match="memory operands"):
        check_fma_loop(spilled + "\tjne\t.LBB3_4\n", unit)
    with pytest.raises(RuntimeError, match="0 FMAs"):  # AVX without FMA3: LLVM calls fmaf
        build_fma_loop(tvm.target.Target({"kind": "llvm", "mcpu": "sandybridge"}), cores=1)
    with pytest.raises(RuntimeError, match="no vector FMA loop for sse"):
        build_fma_loop(tvm.target.Target({"kind": "llvm", "mcpu": "westmere"}), cores=1)


def test_a_target_this_cpu_cannot_run_is_not_run():
    spec = AARCH64 if platform.machine() in ("x86_64", "AMD64") else X86_AVX512
    with pytest.raises(RuntimeError, match="cannot run"):
        fma_peak(tvm.target.Target(spec), threads=1)


def test_the_peak_is_the_fastest_of_calls_that_fill_the_window(monkeypatch, cpu_target):
    """A call that lost time to other work does not lower the figure; the calls fill ``seconds``."""
    timed = []

    class Lib:
        def time_evaluator(self, name, dev, number, repeat):
            timed.append(repeat)
            calls = [4e-3, 1e-3, 9e-3] * repeat  # interrupted calls around the clean one

            return lambda *args: type("Result", (), {"results": calls[:repeat]})

    unit = vector_unit(cpu_target)
    loop = FmaLoop(Lib(), unit, cores=2, accumulators=accumulators(unit), iterations=1000)
    monkeypatch.setattr(fma_loop, "build_fma_loop", lambda target, cores: loop)
    assert fma_peak(cpu_target, threads=2, seconds=0.5) == loop.flops / 1e-3
    assert timed == [fma_loop.WARM_UP_CALLS, 500]  # the fastest warm-up call: 1 ms, 500 of them in 0.5 s
