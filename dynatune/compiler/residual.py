"""What the estimate misses, measured: the model's time that its tasks, timed alone, do not account for.

The estimate (Σ weight × task latency) adds up each task's best latency as tuning measures it: the
kernel alone, run again and again on the same buffers, its weights and inputs in cache. In the model a
kernel runs after others have evicted them, and the model also runs calls no task stands for
(allocation, reshape views) and the VM's own work between calls. The per-kernel profile
(:mod:`dynatune.compiler.profile`) splits that difference; here it is one number, the **residual**,
measured in rounds of one block of the model and one block of each task's best schedule alone, back to back,
so both see the same machine (absolute times drift by tens of percent from minute to minute here):

    residual = median model time - Σ weight × median task time alone

The run's **estimated model latency** is the estimate plus the latest residual: the objective, counting
what the kernels alone miss. The residual is counted as a constant, not as a factor on each task: a
kernel's excess in the model is mostly waiting for memory the kernels before it evicted, which a faster
schedule of that kernel does not remove. Across two mnasnet0_5 runs (5 and 15 minutes), the kernels whose
latency alone changed changed by the same amount in the model (least-squares slope 1.00; a per-task
factor fit 4x worse; BENCHMARKS.md). A constant also leaves the scheduler's decisions, which compare
gains of weighted latency, as they are.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from dynatune.compiler.timing import block_timer


def task_args(mod, device, seed: int = 0) -> list:
    """Arguments for a task's scheduled PrimFunc, as the kernel sees them (weights in the layout its
    schedule chose): floats random, integers (indices) zero so they stay in range."""
    import tvm
    from tvm.s_tir.meta_schedule.arg_info import ArgInfo

    rng = np.random.default_rng(seed)
    out = []
    for info in ArgInfo.from_entry_func(mod, remove_preproc=True):
        shape, dtype = [int(d) for d in info.shape], str(info.dtype)
        arr = (rng.uniform(-1, 1, shape) if np.dtype(dtype).kind == "f" else np.zeros(shape)).astype(dtype)
        out.append(tvm.runtime.tensor(arr, device))
    return out


def best_schedule(task, database, target):
    """The task's best schedule as the compiler picks it: the record ``database`` holds, else the
    default schedule."""
    from dynatune.search.session import default_schedule

    sch = database.query_schedule(task.mod, target, "main") if database is not None else None
    return sch.mod if sch is not None else default_schedule(task.mod, target)


class KernelAlone:
    """A task's scheduled kernel, compiled once and timed alone: warm, as tuning measures candidates (a
    block of runs on the same buffers, its data in cache), or cold, as the model runs it (single runs,
    every argument but the input flushed from the caches before each:
    :func:`dynatune.search.measure.cold_evaluator`)."""

    def __init__(self, mod, target, device, block_ms: float):
        from dynatune.search.builder import compile_scheduled
        from dynatune.search.measure import cold_time_evaluator

        rt = compile_scheduled(mod, target)
        self._args = task_args(mod, device)
        self.warm = block_timer(
            lambda number, min_ms: rt.time_evaluator(
                rt.entry_name, device, number=number, repeat=1, min_repeat_ms=min_ms
            ),
            self._args,
            block_ms,
        )
        self._cold = cold_time_evaluator(rt, device)

    def cold(self) -> float:
        """The median of a cold timing's runs (ms)."""
        return float(np.median(self._cold(*self._args).results)) * 1e3


class TaskTimers:
    """Every task's best schedule alone (:class:`KernelAlone`), kept between calls: a task is compiled again
    only when its best schedule changed (a periodic measurement rebuilds the few tasks tuned since the
    last)."""

    def __init__(self, target, device, block_ms: float = 20.0):
        self.target, self.device, self.block_ms = target, device, block_ms
        self._built: dict[int, tuple[int, KernelAlone]] = {}  # task index -> (schedule hash, kernel)
        self.compiled = 0  # schedules compiled so far

    def kernels(self, tasks, database) -> dict[int, KernelAlone]:
        from tvm_ffi import structural_hash

        out = {}
        for t in tasks:
            mod = best_schedule(t, database, self.target)
            key = structural_hash(mod)
            if t.index not in self._built or self._built[t.index][0] != key:
                self._built[t.index] = (key, KernelAlone(mod, self.target, self.device, self.block_ms))
                self.compiled += 1
            out[t.index] = self._built[t.index][1]
        return out

    def timers(self, tasks, database, cold: bool = False) -> dict[int, object]:
        """Each task's timer (ms per run): warm, or ``cold`` (as the session times candidates with
        ``measure.cpu_cache_flush``, so that the residual is what its estimate misses)."""
        return {i: k.cold if cold else k.warm for i, k in self.kernels(tasks, database).items()}


@dataclass
class Residual:
    """The model and its tasks alone, timed in the same rounds (ms)."""

    model_ms: float  # median over rounds
    kernels_alone_ms: float  # Σ weight × median latency alone

    @property
    def residual_ms(self) -> float:
        return self.model_ms - self.kernels_alone_ms

    def as_dict(self) -> dict:
        return {
            "same_time_model_ms": self.model_ms,
            "kernels_alone_ms": self.kernels_alone_ms,
            "residual_ms": self.residual_ms,
        }


def kernels_alone_ms(tasks, alone_ms: dict[int, float]) -> float:
    """Σ weight × latency alone (ms) over ``tasks``."""
    return sum(t.weight * alone_ms[t.index] for t in tasks)


def measure_residual(model_block, timers: dict, tasks, rounds: int = 3) -> Residual:
    """``rounds`` rounds of one model block (``model_block()``: ms per run) and one block of each task
    alone (``timers``: task index -> block timer)."""
    model_ms, alone = [], {i: [] for i in timers}
    for _ in range(rounds):
        model_ms.append(model_block())
        for i, f in timers.items():
            alone[i].append(f())
    medians = {i: float(np.median(v)) for i, v in alone.items()}
    return Residual(float(np.median(model_ms)), kernels_alone_ms(tasks, medians))
