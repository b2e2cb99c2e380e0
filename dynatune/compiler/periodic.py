"""Periodic whole-model measurement: every few minutes of tuning, compile the model with the best
schedules so far and time it beside ONNX Runtime in a fresh process
(:mod:`dynatune.compiler.fresh_timing`), so a run shows what its users would get at that point (the estimate,
Σ weight × task latency, leaves out what runs between kernels). Each task's best schedule
is also timed alone in the same rounds as the model, which gives the residual the estimate misses
(:mod:`dynatune.compiler.residual`); the rounds after it report the estimate plus that residual.

Interval: ``measure_every_s`` (null: every 300 s for budgets of 600 s or more, else off; 0: off). The
measurement's seconds are not tuning time (the budget is not charged), and are reported on their own.
The points are kept in the run's state, so a resumed run goes on from its last one.

The worker pools stay up between rounds (a restart costs seconds), idle: a worker blocks on its pipe and
takes no CPU. The timing's load probe (:mod:`dynatune.machine.load`) runs in the timing process, so it
counts anything else, dynatune's own pools and threads included, as load: a point that stays busy is kept
with ``under_load`` and never gives the time to parity.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass, field

AUTO_EVERY_S = 300.0
AUTO_MIN_BUDGET_S = 600.0


@dataclass
class ModelMeasurement:
    """The whole model compiled with the best schedules so far and timed beside ONNX Runtime."""

    round: int  # the last round before the measurement (its MLflow step)
    elapsed_s: float  # tuning seconds spent when measured
    latency_ms: float
    onnxruntime_ms: float | None
    ratio: float | None  # latency / ONNX Runtime's (median over alternating rounds)
    ratio_spread: list = field(default_factory=list)  # [min, max] of the per-round ratios
    estimated_ms: float = 0.0
    seconds: float = 0.0  # what the measurement cost (compile + timing); not counted as tuning time
    # the model and each task's best schedule alone, timed in the same rounds (dynatune.compiler.residual)
    same_time_model_ms: float | None = None
    kernels_alone_ms: float | None = None  # Σ weight × latency alone
    residual_ms: float | None = None  # what the estimate misses: same_time_model_ms - kernels_alone_ms
    # the machine stayed busy through the timing's retries (dynatune.machine.load): no parity from it
    under_load: bool = False
    load_cores: float | None = None  # the cores other work took from the timing

    @property
    def estimated_model_ms(self) -> float | None:
        """The estimate counting what the kernels alone miss."""
        return None if self.residual_ms is None else self.estimated_ms + self.residual_ms


def interval_s(every_s: float | None, budget_s: float) -> float:
    """The measurement interval in tuning seconds; 0 means off."""
    if every_s is None:
        return AUTO_EVERY_S if budget_s >= AUTO_MIN_BUDGET_S else 0.0
    return max(0.0, float(every_s))


class PeriodicMeasurement:
    def __init__(self, cfg, model, target, tuner, rounds: int = 3):
        self.every_s = interval_s(cfg.measure_every_s, cfg.budget_s)
        self.lowering = cfg.compile.lowering()
        self.quiet = cfg.compile.quiet()
        self.model = model
        self.target = target
        self.tuner = tuner
        self.rounds = rounds
        self.points: list[dict] = tuner.run_state.setdefault("measurements", [])
        self._timers = None

    def due(self) -> bool:
        """A measurement is due: the interval has passed since the last one, and tuning goes on (the end
        of the run is measured by the final compile anyway)."""
        if self.every_s <= 0 or self.tuner.done():
            return False
        last = self.points[-1]["elapsed_s"] if self.points else 0.0
        return self.tuner.elapsed_s - last >= self.every_s

    def measure(self) -> ModelMeasurement:
        import tempfile

        import tvm

        from dynatune.compiler.compile import build, export
        from dynatune.compiler.execution import relax_vm
        from dynatune.compiler.fresh_timing import time_in_fresh_process
        from dynatune.compiler.residual import TaskTimers, measure_residual
        from dynatune.compiler.timing import vm_block_timer
        from dynatune.machine.target import target_device

        t0 = time.perf_counter()
        session = self.tuner.session
        device = target_device(self.target)
        dev = tvm.device(device, 0)
        database = session.compile_database()
        executable = build(self.model, self.target, database, self.lowering)
        with tempfile.TemporaryDirectory(prefix="dynatune-periodic-") as tmp:
            timing = time_in_fresh_process(
                export(executable, os.path.join(tmp, "model.so")),
                self.model,
                device=device,
                rounds=self.rounds,
                quiet=self.quiet,
            )
        if self._timers is None:
            self._timers = TaskTimers(self.target, dev)
        vm = relax_vm(
            executable, dev
        )  # the residual: the model and its tasks alone, both TVM, in this process
        residual = measure_residual(
            vm_block_timer(vm, self.model.random_inputs(0), dev, 200.0),
            self._timers.timers(session.tasks, database, cold=session.measure.cpu_cache_flush),
            session.tasks,
            self.rounds,
        )
        m = ModelMeasurement(
            round=max(0, self.tuner.rounds_done - 1),
            elapsed_s=self.tuner.elapsed_s,
            latency_ms=timing.tvm_median_ms,
            onnxruntime_ms=timing.ort_median_ms,
            ratio=timing.ratio,
            ratio_spread=[timing.ratio_min, timing.ratio_max],
            estimated_ms=session.estimated_latency() * 1e3,
            seconds=time.perf_counter() - t0,
            under_load=timing.under_load,
            load_cores=timing.load_cores,
            **residual.as_dict(),
        )
        self.points.append(m.__dict__.copy())
        self.tuner.save_run_state()
        return m

    def parity_s(
        self, final_elapsed_s: float | None = None, final_ratio: float | None = None
    ) -> float | None:
        """See :func:`parity_s`; the final measurement (at the end of tuning) is the last point."""
        return parity_s(self.points, final_elapsed_s, final_ratio)


def latest_residual_ms(points: list[dict]) -> float | None:
    """The residual of the last measurement that has one; None before the first."""
    return next((p["residual_ms"] for p in reversed(points) if p.get("residual_ms") is not None), None)


def parity_s(
    points: list[dict], final_elapsed_s: float | None = None, final_ratio: float | None = None
) -> float | None:
    """The first tuning second at which the measured model beat ONNX Runtime (ratio < 1): a periodic point,
    else the final measurement at ``final_elapsed_s``; None if no measurement did. A point timed on a busy
    machine (``under_load``) never counts: load flatters dynatune (ONNX Runtime suffers more from it)."""
    final = [{"elapsed_s": final_elapsed_s, "ratio": final_ratio}] if final_elapsed_s is not None else []
    return next(
        (
            p["elapsed_s"]
            for p in [*points, *final]
            if p.get("ratio") is not None and p["ratio"] < 1.0 and not p.get("under_load")
        ),
        None,
    )
