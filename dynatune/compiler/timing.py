"""Side-by-side timing: the compiled model and ONNX Runtime, interleaved in the same process.

Absolute times on a shared machine drift by tens of percent from minute to minute; two timings taken
minutes apart cannot be compared. Here each round times one block of TVM runs and one block of ONNX
Runtime runs back to back (each block at least ``block_ms`` long, the order swapped every round), so both
sides of a round see the same machine. The ratio of each round holds even when the machine drifts
between rounds. The report gives the ratio of each side's fastest block (:func:`best_ratio`: a busy
neighbour slows ONNX Runtime's side more, so the rounds' median flatters TVM), the rounds' median ratio
and their min-max spread.

Both sides are called as a user calls them, in a Python loop: the compiled model's ``main`` with numpy
inputs copied to the device and its outputs copied back to numpy (:class:`dynatune.runtime.VMCall`, what
``dynatune.runtime.load(...).predict`` does), ONNX Runtime's ``sess.run`` with numpy inputs. (Until
session 36 the TVM side ran ``invoke_stateful`` in TVM's ``time_evaluator``, inputs set once and
outputs left on the device: it left out what a user's call pays and ONNX Runtime's side paid.)

Blocks are ``pause_s`` apart: ONNX Runtime's pool threads keep spinning after a run (its default,
``session.intra_op.allow_spinning``), and on 2 cores a TVM block right after an ONNX Runtime block ran
20-30% slower than one after a 10-50 ms pause. Both sides get the same pause.

The load on the timing's cores during the rounds (:class:`dynatune.machine.load.LoadProbe`: other work,
steal time; this process's own threads excluded) comes with the result, so a caller can tell a timing
taken on a busy machine (:mod:`dynatune.compiler.fresh_timing` retries it, then flags it).
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np

from dynatune.machine.load import LoadProbe


@dataclass
class SideBySide:
    """Per-round latencies (ms) of both sides and their ratio TVM / ONNX Runtime (< 1: TVM is faster)."""

    tvm_ms: list[float]
    ort_ms: list[float]
    load: dict | None = None  # Load.as_dict() of the machine during the rounds
    load_before: dict | None = None  # ... just before them (fresh_timing)
    under_load: bool = False  # the machine stayed busy: the ratio is not a fair one (fresh_timing)
    attempts: int = 1  # timings tried to get one on a quiet machine
    # each fresh process's median ratio, when the rounds come from several processes (:func:`pooled`)
    process_ratios: list[float] | None = None
    # ONNX Runtime's fastest block alone before tuning (fresh_timing.onnxruntime_reference_ms), and whether
    # this timing's (every process's) was over QuietPolicy.slow_onnxruntime times it: a slow spell, unfair
    onnxruntime_reference_ms: float | None = None
    onnxruntime_slow: bool = False

    @property
    def load_cores(self) -> float | None:
        """The cores other work took from the timing: the larger of the loads before and during it."""
        return max((d["busy_cores"] for d in (self.load, self.load_before) if d), default=None)

    @property
    def ratios(self) -> list[float]:
        return [t / o for t, o in zip(self.tvm_ms, self.ort_ms)]

    @property
    def tvm_median_ms(self) -> float:
        return float(np.median(self.tvm_ms))

    @property
    def ort_median_ms(self) -> float:
        return float(np.median(self.ort_ms))

    @property
    def ratio_median(self) -> float:
        """The median of the per-round ratios."""
        return float(np.median(self.ratios))

    @property
    def ratio(self) -> float:
        """The ratio a run reports: each side's fastest block against the other's (:func:`best_ratio`), over
        every round of every process it pooled (a neighbour can keep one process's ONNX Runtime slow for its
        whole few seconds, as it did for two of three in a run that read 1.254, 0.979 and 1.053)."""
        return best_ratio(self.tvm_ms, self.ort_ms)

    @property
    def per_process_ratios(self) -> list[float]:
        """Each timing process's own :attr:`ratio` (one process: the ratio itself)."""
        return self.process_ratios or [self.ratio]

    @property
    def ratio_min(self) -> float:
        return float(min(self.ratios))

    @property
    def ratio_max(self) -> float:
        return float(max(self.ratios))

    def as_dict(self) -> dict:
        return {
            "rounds": len(self.tvm_ms),
            "tvm_ms": self.tvm_ms,
            "ort_ms": self.ort_ms,
            "ratios": self.ratios,
            "tvm_median_ms": self.tvm_median_ms,
            "ort_median_ms": self.ort_median_ms,
            "ratio_median": self.ratio_median,
            "ratio": self.ratio,
            "ratio_min": self.ratio_min,
            "ratio_max": self.ratio_max,
            "load": self.load,
            "load_before": self.load_before,
            "under_load": self.under_load,
            "attempts": self.attempts,
            "load_cores": self.load_cores,
            "process_ratios": self.process_ratios,
            "onnxruntime_reference_ms": self.onnxruntime_reference_ms,
            "onnxruntime_slow": self.onnxruntime_slow,
        }

    @classmethod
    def from_dict(cls, d: dict) -> "SideBySide":
        """The inverse of :meth:`as_dict` (the fresh timing process prints that)."""
        keys = ("tvm_ms", "ort_ms", "load", "load_before", "under_load", "attempts", "process_ratios")
        keys += ("onnxruntime_reference_ms", "onnxruntime_slow")
        return cls(**{k: d[k] for k in keys if k in d})


def best_ratio(a_ms, b_ms) -> float:
    """``a``'s fastest block over ``b``'s: the speed each side reaches when the shared machine leaves it
    alone. It lies between the smallest and the largest per-round ratio. On this project's shared 2-core
    machines a neighbour's work (another guest on the same physical cores: no steal time, no load the
    probe sees) slows some blocks of a process, and ONNX Runtime's spinning pool far more than TVM's: the
    median of the rounds' ratios read 1.00-1.26 for one artifact over 8 processes in a row, bimodally, its
    lower mode where ONNX Runtime's median block was 1.5x its fastest; the ratio of the fastest blocks
    read 1.12-1.31, six of eight within 1.25 +- 0.03 (mnasnet0_5, Zen 3, 2026-11-29). Medians flatter
    dynatune whenever a neighbour is busy; the fastest blocks do not."""
    return float(min(a_ms) / min(b_ms))


def pooled(timings: list[SideBySide]) -> SideBySide:
    """Several processes' timings as one: their rounds together (:attr:`SideBySide.ratio` takes each
    side's fastest block among them all), each process's own best-block ratio (``process_ratios``), the
    load of the busiest, under load if any was, and every attempt counted."""
    if len(timings) == 1:
        return timings[0]
    busiest = max(timings, key=lambda t: t.load_cores or 0.0)
    return SideBySide(
        tvm_ms=[ms for t in timings for ms in t.tvm_ms],
        ort_ms=[ms for t in timings for ms in t.ort_ms],
        load=busiest.load,
        load_before=busiest.load_before,
        under_load=any(t.under_load for t in timings),
        attempts=sum(t.attempts for t in timings),
        process_ratios=[t.ratio for t in timings],
    )


def block_timer(make_evaluator, args, block_ms: float):
    """A callable timing one block of runs of a TVM ``time_evaluator``: the mean latency (ms) of a block.

    ``make_evaluator(number, min_repeat_ms)`` returns the evaluator (``repeat=1``), called with ``args``.
    The loop count is sized once, from one calibrating block (TVM's ``min_repeat_ms`` would otherwise
    re-calibrate, and throw runs away, in every block)."""
    import math

    once_s = max(float(make_evaluator(1, int(block_ms))(*args).results[0]), 1e-7)
    f = make_evaluator(max(1, math.ceil(block_ms * 1e-3 / once_s)), 0)
    return lambda: float(f(*args).results[0]) * 1e3


def vm_block_timer(vm, inputs, device, block_ms: float):
    """A callable timing one block of model runs (``invoke_stateful``, inputs set once); ``inputs``: name ->
    array, in the model's input order (as ``Model.random_inputs`` makes them)."""
    entry = set_entry_input(vm, inputs, device)
    return block_timer(
        lambda number, min_ms: vm.time_evaluator(
            "invoke_stateful", device, number=number, repeat=1, min_repeat_ms=min_ms
        ),
        (entry,),
        block_ms,
    )


def set_entry_input(vm, inputs, device) -> str:
    """Set the inputs (name -> array) of the entry a run calls (:func:`dynatune.runtime.entry_arguments`:
    ``main_into`` and its outputs, where the library has it), for ``invoke_stateful``; returns its name."""
    import tvm

    from dynatune.runtime import entry_arguments

    entry, args = entry_arguments(vm, [tvm.runtime.tensor(a, device) for a in inputs.values()])
    vm.set_input(entry, *args)
    return entry


def vm_run_timer(vm, inputs, device, block_ms: float):
    """A callable timing a block of single model runs (``invoke_stateful``, inputs set once): each run's
    time (ms), as TVM's evaluator takes it (``number=1``, in C++). A run's median is robust to the
    interruptions of a shared machine that a block's mean takes in; ``inputs`` as for
    :func:`vm_block_timer`."""
    import math

    entry = set_entry_input(vm, inputs, device)
    once_s = max(float(vm.time_evaluator("invoke_stateful", device, number=1, repeat=1)(entry).mean), 1e-7)
    runs = max(3, math.ceil(block_ms * 1e-3 / once_s))
    f = vm.time_evaluator("invoke_stateful", device, number=1, repeat=runs)
    return lambda: [float(r) * 1e3 for r in f(entry).results]


def call_block_timer(call, block_ms: float):
    """A callable timing one block of ``call()``s, as a user's loop makes them: the mean latency (ms)."""

    def block() -> float:
        n, t0 = 0, time.perf_counter()
        while True:
            call()
            n += 1
            elapsed = time.perf_counter() - t0
            if elapsed * 1e3 >= block_ms:
                return elapsed / n * 1e3

    return block


def ort_block_timer(sess, inputs, block_ms: float):
    """A callable timing one block of ``sess.run`` calls: returns the mean latency (ms) over the block."""
    return call_block_timer(lambda: sess.run(None, inputs), block_ms)


def predict_block_timer(vm, inputs, device, block_ms: float):
    """A callable timing one block of the compiled model's calls as its user makes them
    (:class:`dynatune.runtime.VMCall`: numpy arrays in, copied to the device, numpy arrays out), as ONNX
    Runtime's side is timed; ``inputs``: name -> array, in the model's input order."""
    from dynatune.runtime import VMCall

    arrays = list(inputs.values())
    call = VMCall(vm, device, [(a.shape, str(a.dtype)) for a in arrays])
    return call_block_timer(lambda: call(arrays), block_ms)


def interleave(timers, rounds: int, pause_s: float = 0.0) -> list[list[float]]:
    """Run every block timer in ``timers`` ``rounds`` times, their order reversed every other round, after
    one warm-up run of each, ``pause_s`` between blocks; returns each timer's list of results."""

    def paused(f):
        time.sleep(pause_s)
        return f()

    for f in timers:
        paused(f)
    results: list[list[float]] = [[] for _ in timers]
    for r in range(rounds):
        order = range(len(timers)) if r % 2 == 0 else reversed(range(len(timers)))
        for k in order:
            results[k].append(paused(timers[k]))
    return results


def alternate(first, second, rounds: int, pause_s: float = 0.0) -> tuple[list[float], list[float]]:
    """:func:`interleave` of two block timers: the order swapped every round."""
    a, b = interleave([first, second], rounds, pause_s)
    return a, b


def time_side_by_side(
    vm, sess, inputs, device, rounds: int = 7, block_ms: float = 200.0, pause_s: float = 0.05
) -> SideBySide:
    """Time the compiled model (``vm``) and ONNX Runtime (``sess``) in alternating blocks on ``inputs``
    (in the model's input order), each called as its user calls it: numpy arrays in and out. The tuning
    process should time in a fresh process instead (:mod:`dynatune.compiler.fresh_timing`)."""
    tvm_timer = predict_block_timer(vm, inputs, device, block_ms)
    load = LoadProbe()
    tvm_ms, ort_ms = alternate(tvm_timer, ort_block_timer(sess, inputs, block_ms), rounds, pause_s)
    return SideBySide(tvm_ms, ort_ms, load=load.stop().as_dict())
