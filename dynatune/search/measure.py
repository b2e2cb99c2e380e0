"""Measuring candidates: a fixed protocol, or AdaTune's adaptive one.

Fixed: ``repeat`` repeats of at least ``min_repeat_ms`` each, every candidate alike.

Adaptive (AdaTune): repeats run in small batches; after ``min_repeats`` the evaluator stops as soon as
the 95% Student-t confidence interval of the mean is narrower than ``rel_tol`` of the mean (settled), or
its lower bound is above ``race_factor`` x the task's incumbent latency (raced out: clearly slower, so
further precision is wasted). A candidate whose very first repeat is already ``quick_race_factor`` x the
incumbent or slower is raced out after that one repeat. Repeats are capped at ``max_repeats``. Each
adaptive repeat lasts at least ``adaptive_repeat_ms`` (shorter than the fixed protocol's: the confidence
interval, not a long loop, decides when a timing is precise enough), and the kernel's loop count is
calibrated once per candidate, not in every batch (TVM's ``time_evaluator`` re-calibrates from one run
in every call, which would cost more than the repeats it saves). Outliers (beyond 3 scaled MADs of
the median, e.g. a batch hit by a context switch) are trimmed before every decision. The evaluator runs
inside MetaSchedule's runner worker (local or RPC); why it stopped is recomputed from the returned
timings with :func:`stop_reason`, so nothing beyond the timings has to cross the process boundary.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import lru_cache, partial
from statistics import NormalDist
from typing import Annotated

import numpy as np
from pydantic import ConfigDict, Field, ValidationInfo, field_validator
from typing_extensions import Required, TypedDict

from dynatune.search.index_args import args_key
from dynatune.search.section import Section, Text, problem


class RpcConfig(TypedDict, total=False):
    """A device farm (``measure.rpc``): TVM's RPC tracker and the key its devices register under."""

    __pydantic_config__ = ConfigDict(extra="forbid", strict=True, allow_inf_nan=False)
    tracker_host: Required[Text]
    tracker_port: Required[Annotated[int, Field(ge=1, le=65535)]]
    tracker_key: Required[Text]
    session_timeout_s: Annotated[float, Field(gt=0)]  # default: max(10, timeout_s)
    max_workers: Annotated[int, Field(ge=1)]  # default 1


class MeasureConfig(Section):
    """How candidates are measured (the config's ``measure:``)."""

    # adaptive by default: 0.60-0.77x the tuning seconds per candidate of the fixed protocol, estimates
    # 0.96-1.05x at 240 s (squeezenet1_1, mnasnet0_5, two seeds; BENCHMARKS.md, session 16)
    adaptive: bool = True
    repeat: int = Field(5, ge=1)  # fixed protocol: repeats per candidate
    min_repeat_ms: int = Field(10, ge=0)  # each repeat loops the kernel for at least this long
    number: int = Field(1, ge=1)
    min_repeats: int = Field(3, ge=2)  # adaptive protocol: at least this many repeats ...
    max_repeats: int = Field(10, ge=1, validate_default=True)  # ... and at most this many
    batch: int = Field(2, ge=1)
    rel_tol: float = Field(0.02, gt=0, lt=1)
    race_factor: float = Field(1.5, gt=1)
    quick_race_factor: float = Field(3.0, gt=1)  # raced after one repeat when that repeat is this much slower
    adaptive_repeat_ms: int = Field(4, ge=0)  # each adaptive repeat loops the kernel for at least this long
    timeout_s: float = Field(30.0, gt=0)
    # each repeat one run, every argument but the input flushed from the CPU caches before it: candidates
    # timed cold, as the model runs them (cold_evaluator); false: repeats loop the kernel on data in cache.
    # Tried as the search's measure on two models (5 min each, one seed): 0.948x the warm search's model on
    # the EfficientNet-like one, 1.047x on mnasnet0_5 (BENCHMARKS.md, #55): not the default
    cpu_cache_flush: bool = False
    rpc: RpcConfig | None = None  # a device farm; a plain dict of the keys given

    @field_validator("max_repeats")
    @classmethod
    def _not_below_min_repeats(cls, v: int, info: ValidationInfo) -> int:
        lo = info.data.get("min_repeats")  # absent when it failed its own checks
        if lo is not None and v < lo:
            raise problem(f"must be >= measure.min_repeats ({lo}), got {v}")
        return v

    @property
    def repeat_cap(self) -> int:
        """The most repeats a candidate can get under the protocol in use."""
        return self.max_repeats if self.adaptive else self.repeat


# -- statistics (pure functions, unit-tested on synthetic timings) ----------------------------------
@lru_cache(maxsize=None)
def t95(df: int) -> float:
    """Two-sided 95% Student-t quantile for ``df`` degrees of freedom (``inf`` for ``df <= 0``): exact, from
    SciPy, cached per ``df`` (it is asked for every candidate's every repeat)."""
    if df <= 0:
        return math.inf
    from scipy.stats import t

    return float(t.ppf(0.975, df))


# the median absolute deviation times this estimates a normal sample's standard deviation: 1 / Phi^-1(3/4)
MAD_TO_SD = 1.0 / NormalDist().inv_cdf(0.75)


def trim_outliers(xs) -> list[float]:
    xs = [float(x) for x in xs]
    if len(xs) < 4:
        return xs
    med = float(np.median(xs))
    mad = float(np.median([abs(x - med) for x in xs])) * MAD_TO_SD
    if mad == 0:
        return xs
    kept = [x for x in xs if abs(x - med) <= 3 * mad]
    return kept if len(kept) >= 2 else xs


def interval(xs) -> tuple[float, float]:
    """(mean, half-width of the 95% confidence interval) after trimming outliers."""
    xs = trim_outliers(xs)
    n = len(xs)
    mean = sum(xs) / n
    if n < 2:
        return mean, math.inf
    sd = math.sqrt(sum((x - mean) ** 2 for x in xs) / (n - 1))
    return mean, t95(n - 1) * sd / math.sqrt(n)


def stop_reason(
    xs,
    min_repeats: int,
    max_repeats: int,
    rel_tol: float,
    race_factor: float,
    incumbent: float | None,
    quick_race_factor: float = math.inf,
) -> str | None:
    """Why an adaptive measurement of timings ``xs`` should stop now, or None to keep measuring."""
    n = len(xs)
    if n and incumbent and incumbent > 0 and min(xs) > quick_race_factor * incumbent:
        return "raced"
    if n >= min_repeats:
        mean, half = interval(xs)
        if mean > 0 and half / mean <= rel_tol:
            return "settled"
        if incumbent and incumbent > 0 and mean - half > race_factor * incumbent:
            return "raced"
    if n >= max_repeats:
        return "max_repeats"
    return None


def adaptive_repeats(
    measure_batch,
    min_repeats: int,
    max_repeats: int,
    batch: int,
    rel_tol: float,
    race_factor: float,
    incumbent: float | None,
    quick_race_factor: float = math.inf,
) -> list[float]:
    """Call ``measure_batch(k)`` (returns k timings) until :func:`stop_reason` says stop.

    With an incumbent and a finite ``quick_race_factor`` the first batch is a single repeat, so that a
    clearly slower candidate costs one repeat; otherwise the first batch brings it to ``min_repeats``.
    """
    xs: list[float] = []
    quick = bool(incumbent) and math.isfinite(quick_race_factor)
    while True:
        if not xs and quick:
            need = 1
        else:
            need = min_repeats - len(xs) if len(xs) < min_repeats else batch
        need = max(1, min(need, max_repeats - len(xs)))
        xs.extend(float(x) for x in measure_batch(need))
        if stop_reason(xs, min_repeats, max_repeats, rel_tol, race_factor, incumbent, quick_race_factor):
            return xs


# -- runner-side evaluators ---------------------------------------------------------------------
def evaluator_timings(f, device, repeated_args) -> list[float]:
    """Every timing of a ``time_evaluator`` ``f`` over each set of arguments, the device synced first."""
    out = []
    for args in repeated_args:
        device.sync()
        out.extend(f(*args).results)
    return out


def adaptive_evaluator(
    rt_mod,
    device,
    evaluator_config,
    repeated_args,
    *,
    min_repeats,
    max_repeats,
    batch,
    rel_tol,
    race_factor,
    incumbent,
    quick_race_factor=math.inf,
    repeat_ms=None,
):
    """``f_run_evaluator`` for MetaSchedule runners (runs in the runner worker).

    ``repeat_ms=None``: one ``time_evaluator`` call per batch with the evaluator config's
    ``min_repeat_ms`` (the fixed protocol is one batch: exactly what MetaSchedule's default does).
    ``repeat_ms`` given (adaptive): one probe run sizes the loop count so that a repeat lasts about
    ``repeat_ms``; every batch reuses that count and skips TVM's per-call calibration (which grows the
    count from 1 by x1.6 steps and throws those runs away: ~1.6 repeats' worth per call).
    With the config's ``enable_cpu_cache_flush`` every repeat is the config's ``number`` of runs (1 by
    default) after the flush, whatever ``repeat_ms`` and ``min_repeat_ms`` say: the kernel cold.
    """
    evaluators = {}
    calibrated = {"number": None}
    preproc = FLUSH_ALL_BUT_INPUT if evaluator_config.enable_cpu_cache_flush else ""

    def evaluator(k, number, min_ms):
        if (k, number, min_ms) not in evaluators:
            evaluators[k, number, min_ms] = rt_mod.time_evaluator(
                func_name=rt_mod.entry_name,
                dev=device,
                number=number,
                repeat=k,
                min_repeat_ms=min_ms,
                f_preproc=preproc,
            )
        return evaluators[k, number, min_ms]

    def run(f):
        return evaluator_timings(f, device, repeated_args)

    def measure_batch(k):
        if preproc:  # cold: no loop to size, each repeat starts from flushed caches
            return run(evaluator(k, evaluator_config.number, 0))
        if repeat_ms is None:
            return run(evaluator(k, evaluator_config.number, evaluator_config.min_repeat_ms))
        if calibrated["number"] is None:  # one probe run (after TVM's warm-up run) sizes every repeat
            probe = [x for x in run(evaluator(1, 1, 0)) if x > 0]
            calibrated["number"] = (
                max(evaluator_config.number, math.ceil(repeat_ms * 1e-3 / min(probe)))
                if probe
                else evaluator_config.number
            )
        return run(evaluator(k, calibrated["number"], 0))

    return adaptive_repeats(
        measure_batch, min_repeats, max_repeats, batch, rel_tol, race_factor, incumbent, quick_race_factor
    )


FLUSH_ALL_BUT_INPUT = "cache_flush_cpu_non_first_arg"  # TVM's preprocessor: every argument but the first


COLD_REPEATS = 10  # single cold runs per cold timing: their median is its time


@dataclass(frozen=True)
class ColdProtocol:
    """Candidates timed cold (:func:`cold_evaluator`): ``passes`` passes over the batch, its order reversed
    every other pass (a busy minute falls on every candidate alike, not on the first few), ``repeats``
    single runs per candidate in each."""

    repeats: int = COLD_REPEATS
    passes: int = 3

    @staticmethod
    def seconds(result) -> float:
        """A candidate's time cold, from its RunnerResult: the median of its single runs (``inf``: it
        failed)."""
        return float(np.median(result.run_secs)) if result.error_msg is None and result.run_secs else math.inf


def merged_results(results: list):
    """One RunnerResult of a candidate's results from several passes: every pass's timings, or the first
    error."""
    from tvm.s_tir.meta_schedule.runner import RunnerResult

    if len(results) == 1:
        return results[0]
    failed = next((r for r in results if r.error_msg is not None), None)
    if failed is not None:
        return failed
    return RunnerResult([float(x) for r in results for x in r.run_secs], None)


def cold_time_evaluator(rt_mod, device, repeats: int = COLD_REPEATS):
    """TVM's ``time_evaluator`` timing a kernel as the model runs it (issue #55): one run per repeat,
    every argument but the first (the input the previous kernel just wrote) flushed from the CPU caches
    before it, so its weights come from memory."""
    return rt_mod.time_evaluator(
        func_name=rt_mod.entry_name,
        dev=device,
        number=1,
        repeat=repeats,
        min_repeat_ms=0,
        f_preproc=FLUSH_ALL_BUT_INPUT,
    )


def cold_evaluator(rt_mod, device, evaluator_config, repeated_args, *, repeats):
    """``f_run_evaluator`` timing each candidate cold (:func:`cold_time_evaluator`), ``repeats`` runs."""
    del evaluator_config
    return evaluator_timings(cold_time_evaluator(rt_mod, device, repeats), device, repeated_args)


def rpc_cold_evaluator(session, rt_mod, device, evaluator_config, repeated_args, **kwargs):
    """:func:`cold_evaluator` for MetaSchedule's ``RPCRunner``."""
    del session
    return cold_evaluator(rt_mod, device, evaluator_config, repeated_args, **kwargs)


def rpc_adaptive_evaluator(session, rt_mod, device, evaluator_config, repeated_args, **kwargs):
    """``f_run_evaluator`` for MetaSchedule's ``RPCRunner``, whose evaluators also get the RPC session.

    It runs in the local runner worker; ``rt_mod`` and ``device`` are remote handles, so every timing
    batch runs on the device server and only the timings come back.
    """
    del session
    return adaptive_evaluator(rt_mod, device, evaluator_config, repeated_args, **kwargs)


_ARGS_CACHE: dict = {}  # in the runner worker: (device, arg shapes, index bounds) -> allocated arguments


def cached_alloc_argument(device, args_info, alloc_repeat, index_bounds=None):
    """``f_alloc_argument`` for the local runner: candidates of one task share their argument tensors.

    MetaSchedule's default allocates and random-fills every argument of every candidate (~4 ms for a
    mid-sized convolution, a third of the per-candidate overhead); all candidates of a task have the
    same argument shapes, and a kernel's timing does not depend on the values. Kept per worker process,
    a few tasks' worth. Index arguments named in ``index_bounds`` (see :func:`fill_index_args`) hold
    valid indices instead of random integers.
    """
    from tvm.s_tir.meta_schedule.runner.local_runner import default_alloc_argument

    bounds = (index_bounds or {}).get(args_key(args_info), ())
    key = (str(device), repr(args_info), alloc_repeat, bounds)
    hit = _ARGS_CACHE.get(key)
    if hit is None:
        if len(_ARGS_CACHE) >= 4:
            _ARGS_CACHE.pop(next(iter(_ARGS_CACHE)))
        hit = default_alloc_argument(device, args_info, alloc_repeat)
        fill_index_args(hit, bounds)
        _ARGS_CACHE[key] = hit
    return hit


def rpc_alloc_argument(session, device, args_info, alloc_repeat, index_bounds=None):
    """``f_alloc_argument`` for the RPC runner: MetaSchedule's (a new session per candidate, nothing to
    share), with valid indices in the index arguments named in ``index_bounds``."""
    from tvm.s_tir.meta_schedule.runner.rpc_runner import default_alloc_argument

    repeated_args = default_alloc_argument(session, device, args_info, alloc_repeat)
    fill_index_args(repeated_args, (index_bounds or {}).get(args_key(args_info), ()))
    return repeated_args


def fill_index_args(repeated_args, bounds) -> None:
    """Overwrite each index argument ``(position, high)`` of ``bounds`` with integers uniform in
    ``[0, high)`` (random integers would address memory outside the indexed buffer)."""
    rng = np.random.default_rng(0)
    for args in repeated_args:
        for pos, high in bounds:
            arg = args[pos]
            dtype = np.dtype(str(arg.dtype))
            high = min(int(high), int(np.iinfo(dtype).max) + 1)
            arg.copyfrom(rng.integers(0, high, size=tuple(int(d) for d in arg.shape)).astype(dtype))


def evaluator_for(cfg: MeasureConfig, incumbent: float | None, rpc: bool = False, f=None):
    """The runner's ``f_run_evaluator``: ``f`` (the adaptive evaluator by default) bound to the protocol."""
    f = f or (rpc_adaptive_evaluator if rpc else adaptive_evaluator)
    if cfg.adaptive:
        return partial(
            f,
            min_repeats=cfg.min_repeats,
            max_repeats=cfg.max_repeats,
            batch=cfg.batch,
            rel_tol=cfg.rel_tol,
            race_factor=cfg.race_factor,
            incumbent=incumbent if incumbent and math.isfinite(incumbent) else None,
            quick_race_factor=cfg.quick_race_factor,
            repeat_ms=cfg.adaptive_repeat_ms,
        )
    # the fixed protocol is the adaptive one that never settles early: exactly `repeat` repeats
    return partial(
        f,
        min_repeats=cfg.repeat,
        max_repeats=cfg.repeat,
        batch=cfg.repeat,
        rel_tol=-1.0,
        race_factor=math.inf,
        incumbent=None,
    )


def why_stopped(cfg: MeasureConfig, secs, incumbent: float | None) -> str:
    """Why the evaluator stopped measuring a candidate (recomputed from its timings)."""
    if not cfg.adaptive:
        return "fixed"
    inc = incumbent if incumbent and math.isfinite(incumbent) else None
    return (
        stop_reason(
            secs, cfg.min_repeats, cfg.max_repeats, cfg.rel_tol, cfg.race_factor, inc, cfg.quick_race_factor
        )
        or "max_repeats"
    )


def _worker_ready() -> None:
    """In the runner worker: what the first candidate's measuring would load (TVM, SciPy's t quantiles)."""
    import tvm  # noqa: F401

    t95(2)


class Runner:
    """A MetaSchedule runner (local, or RPC to a device farm) with the configured protocol."""

    def __init__(self, cfg: MeasureConfig, target, evaluator=None):
        """``evaluator``: the function timing one candidate in the runner worker (default: the adaptive
        evaluator, local or RPC); tests pass ones that crash or hang."""
        from tvm.s_tir.meta_schedule.runner import EvaluatorConfig, RPCConfig, RPCRunner

        self.cfg = cfg
        self.evaluator = evaluator
        self.evaluator_config = EvaluatorConfig(
            number=cfg.number,
            repeat=1,
            min_repeat_ms=cfg.min_repeat_ms,
            enable_cpu_cache_flush=cfg.cpu_cache_flush,
        )
        self.rpc = bool(cfg.rpc)
        f = evaluator_for(cfg, None, rpc=self.rpc, f=evaluator)
        self._alloc = rpc_alloc_argument if self.rpc else cached_alloc_argument
        if cfg.rpc:
            rpc = RPCConfig(
                tracker_host=cfg.rpc["tracker_host"],
                tracker_port=int(cfg.rpc["tracker_port"]),
                tracker_key=cfg.rpc["tracker_key"],
                session_timeout_sec=int(cfg.rpc.get("session_timeout_s", max(10, cfg.timeout_s))),
            )
            workers = int(cfg.rpc.get("max_workers", 1))
            self.inner = RPCRunner(
                rpc_config=rpc,
                evaluator_config=self.evaluator_config,
                max_workers=workers,
                f_run_evaluator=f,
                f_alloc_argument=self._alloc,
            )
            # RPCRunner's own pool has no time limit: a device server that hangs mid-measurement would
            # block the round forever. Give each candidate the session timeout (plus time to connect).
            from tvm.support.popen_pool import PopenPoolExecutor

            self.inner.pool.shutdown(wait=False)
            self.inner.pool = PopenPoolExecutor(max_workers=workers, timeout=rpc.session_timeout_sec + 10)
        else:
            from dynatune.search.local_runner import BatchLocalRunner

            self.inner = BatchLocalRunner(
                timeout_sec=cfg.timeout_s,
                evaluator_config=self.evaluator_config,
                f_run_evaluator=f,
                f_alloc_argument=self._alloc,
            )

    def set_incumbent(self, incumbent_s: float | None) -> None:
        """Racing compares each candidate with the task's best latency so far."""
        self.inner.f_run_evaluator = evaluator_for(self.cfg, incumbent_s, rpc=self.rpc, f=self.evaluator)

    def time_cold(self, repeats: int) -> None:
        """The next run times each candidate cold (:func:`cold_evaluator`), ``repeats`` single runs; the
        next :meth:`set_incumbent` restores the configured protocol."""
        f = rpc_cold_evaluator if self.rpc else cold_evaluator
        self.inner.f_run_evaluator = partial(f, repeats=repeats)

    def set_index_bounds(self, index_bounds: dict | None) -> None:
        """Valid indices for the next run's index arguments: ``{args_key: ((position, high), ...)}``
        (:func:`dynatune.search.index_args.bounds_by_args`); the allocator runs in the runner worker."""
        self.inner.f_alloc_argument = (
            partial(self._alloc, index_bounds=index_bounds) if index_bounds else self._alloc
        )

    def run(self, runner_inputs):
        if not runner_inputs:
            return []
        return self.inner.run(runner_inputs)

    def warm_up(self) -> None:
        """Start the local runner's worker now (a device farm's sessions start per candidate)."""
        if not self.rpc:
            self.inner.warm_up(_worker_ready)

    def close(self) -> None:
        if not self.rpc:
            self.inner.shutdown()
            return
        pool = getattr(self.inner, "pool", None)
        if pool is not None:
            try:
                pool.shutdown(wait=False)
            except Exception:
                pass


def make_runner(cfg: MeasureConfig, target, evaluator=None) -> Runner:
    return Runner(cfg, target, evaluator)
