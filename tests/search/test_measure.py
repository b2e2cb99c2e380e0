"""The adaptive evaluator (AdaTune) on synthetic noisy timings, and inside MetaSchedule's runner."""

import json
import math

import numpy as np
import pytest

from dynatune.search.measure import (
    MAD_TO_SD,
    MeasureConfig,
    adaptive_evaluator,
    adaptive_repeats,
    interval,
    stop_reason,
    t95,
    trim_outliers,
    why_stopped,
)

ARGS = dict(min_repeats=3, max_repeats=20, batch=2, rel_tol=0.02, race_factor=1.5)


def timings(noise: float, mean: float = 1e-3, seed: int = 0, outlier_at: int | None = None):
    rng = np.random.default_rng(seed)

    def measure(k):
        out = list(mean * (1 + noise * rng.standard_normal(k)))
        if outlier_at is not None and measure.n <= outlier_at < measure.n + k:
            out[outlier_at - measure.n] = mean * 5
        measure.n += k
        return out

    measure.n = 0
    return measure


def test_low_noise_stops_at_min_repeats():
    xs = adaptive_repeats(timings(0.001), incumbent=None, **ARGS)
    assert len(xs) == 3
    assert stop_reason(xs, 3, 20, 0.02, 1.5, None) == "settled"


def test_high_noise_needs_more_repeats():
    low = [len(adaptive_repeats(timings(0.005, seed=s), incumbent=None, **ARGS)) for s in range(20)]
    high = [len(adaptive_repeats(timings(0.03, seed=s), incumbent=None, **ARGS)) for s in range(20)]
    assert np.mean(high) > np.mean(low) + 2
    assert max(high) <= 20


def test_very_noisy_stops_at_max_repeats():
    xs = adaptive_repeats(timings(0.5), incumbent=None, **ARGS)
    assert len(xs) == 20 and stop_reason(xs, 3, 20, 0.02, 1.5, None) == "max_repeats"


def test_clearly_slow_candidate_is_raced_out():
    # noisy enough never to settle in 3 repeats, but 3x slower than the incumbent
    xs = adaptive_repeats(timings(0.1, mean=3e-3), incumbent=1e-3, **ARGS)
    assert len(xs) <= 4
    assert stop_reason(xs, 3, 20, 0.02, 1.5, 1e-3) in ("raced", "settled")
    mean, half = interval(xs)
    assert mean - half > 1.5e-3


def test_competitive_candidate_is_not_raced():
    xs = adaptive_repeats(timings(0.1, mean=1.05e-3), incumbent=1e-3, **ARGS)
    assert stop_reason(xs, 3, 20, 0.02, 1.5, 1e-3) != "raced"


def test_never_empty_and_outliers_trimmed():
    for k in range(1, 5):
        xs = adaptive_repeats(
            lambda n: [1e-3] * n,
            min_repeats=k,
            max_repeats=k,
            batch=1,
            rel_tol=0.02,
            race_factor=1.5,
            incumbent=None,
        )
        assert len(xs) >= 1
    xs = [1e-3, 1.001e-3, 0.999e-3, 1.0005e-3, 5e-3]  # one batch hit by a context switch
    assert len(trim_outliers(xs)) == 4
    mean, half = interval(xs)
    assert mean == pytest.approx(1e-3, rel=1e-2) and half / mean < 0.02


def test_clearly_slow_first_repeat_is_raced_after_one():
    xs = adaptive_repeats(timings(0.05, mean=5e-3), incumbent=1e-3, quick_race_factor=3.0, **ARGS)
    assert len(xs) == 1 and stop_reason(xs, 3, 20, 0.02, 1.5, 1e-3, 3.0) == "raced"
    # a competitive one still gets its minimum repeats and a real decision
    xs = adaptive_repeats(timings(0.001, mean=1.1e-3), incumbent=1e-3, quick_race_factor=3.0, **ARGS)
    assert len(xs) == 3 and stop_reason(xs, 3, 20, 0.02, 1.5, 1e-3, 3.0) == "settled"
    cfg = MeasureConfig(adaptive=True)
    assert (
        why_stopped(cfg, [5e-3], 1e-3) == "raced"
        and why_stopped(MeasureConfig(adaptive=False), [1e-3] * 5, None) == "fixed"
    )


def test_adaptive_evaluator_calibrates_the_loop_count_once():
    """TVM's time_evaluator re-calibrates in every call; the adaptive evaluator calibrates once."""
    calls, preprocs = [], set()

    class Result:
        def __init__(self, k):
            self.results = [2e-4 * (1 + 0.001 * i) for i in range(k)]

    class Mod:
        entry_name = "main"

        def time_evaluator(self, func_name, dev, number, repeat, min_repeat_ms, f_preproc):
            calls.append((number, repeat, min_repeat_ms))
            preprocs.add(f_preproc)
            return lambda *args: Result(repeat)

    class Dev:
        def sync(self):
            pass

    class Cfg:
        number, min_repeat_ms, enable_cpu_cache_flush = 1, 10, False

    adaptive = dict(min_repeats=3, max_repeats=7, batch=2, rel_tol=1e-9, race_factor=1.5, repeat_ms=4.0)
    xs = adaptive_evaluator(Mod(), Dev(), Cfg(), [()], incumbent=None, **adaptive)
    assert len(xs) == 7
    # one probe run of 0.2 ms sizes the repeats: 4 ms per repeat -> 20 runs, no calibration inside TVM
    assert calls == [(1, 1, 0), (20, 3, 0), (20, 2, 0)]  # each evaluator made once, reused by later batches
    calls.clear()  # the fixed protocol: one call, TVM's own calibration, exactly `repeat` repeats
    fixed = dict(min_repeats=5, max_repeats=5, batch=5, rel_tol=-1, race_factor=math.inf)
    xs = adaptive_evaluator(Mod(), Dev(), Cfg(), [()], incumbent=None, **fixed)
    assert len(xs) == 5 and calls == [(1, 5, 10)]
    calls.clear()  # cold (measure.cpu_cache_flush): every repeat one run after the flush, nothing to size
    preprocs.clear()
    Cfg.enable_cpu_cache_flush = True
    xs = adaptive_evaluator(Mod(), Dev(), Cfg(), [()], incumbent=None, **adaptive)
    assert len(xs) == 7 and calls == [(1, 3, 0), (1, 2, 0)]
    assert preprocs == {"cache_flush_cpu_non_first_arg"}


def test_t_quantiles():
    # exact (scipy.stats.t.ppf(0.975, df)), not the next entry of a table: df 11 is not rounded up to 12
    assert t95(11) == pytest.approx(2.200985160091639, abs=1e-12) and round(t95(11), 4) == 2.2010
    assert t95(1) == pytest.approx(12.706, abs=1e-3) and t95(4) == pytest.approx(2.776, abs=1e-3)
    assert t95(31) == pytest.approx(2.0395, abs=1e-4) and t95(10**6) == pytest.approx(1.96, abs=1e-4)
    assert math.isinf(t95(0)) and math.isinf(t95(-1))
    assert t95(11) is t95(11)  # cached per df
    assert MAD_TO_SD == pytest.approx(1.482602218505602)  # 1 / Phi^-1(3/4)


@pytest.mark.slow
def test_fixed_protocol_uses_exactly_repeat(cpu_target, tmp_path):
    """Both protocols run inside MetaSchedule's real runner worker; adaptive stops early on a kernel."""
    from helpers import make_tiny_onnx

    from dynatune.model.extract import extract_tasks
    from dynatune.model.importer import load_model
    from dynatune.search.session import SearchConfig, TuningSession

    model = load_model(make_tiny_onnx(str(tmp_path / "t.onnx"), batch=1, channels=16))
    tasks = extract_tasks(model, cpu_target)
    small = SearchConfig(trials_per_iter=4, population_size=32, init_min_unmeasured=16, genetic_num_iters=1)
    out = {}
    for adaptive in (False, True):
        cfg = MeasureConfig(
            adaptive=adaptive, repeat=6, min_repeats=3, max_repeats=12, min_repeat_ms=5, rel_tol=0.05
        )
        sess = TuningSession(tasks, cpu_target, str(tmp_path / f"w{adaptive}"), search=small, measure=cfg)
        r = sess.tune(0, trials=4)
        sess.close()
        # every measured candidate: its repeats and why the evaluator stopped, in the round and on disk
        assert sum(r.stops.values()) == r.trials - r.build_errors - r.run_errors
        assert set(r.stops) <= ({"settled", "raced", "max_repeats"} if adaptive else {"fixed"})
        lines = [json.loads(x) for x in open(tmp_path / f"w{adaptive}" / "db" / "measurements.jsonl")]
        cands = [c for line in lines for c in line["candidates"]]
        assert sum(c["repeats"] for c in cands) == r.repeats and {c["stop"] for c in cands} == set(r.stops)
        ok = r.trials - r.build_errors - r.run_errors
        assert ok >= 1, (adaptive, r.errors)
        out[adaptive] = (r.repeats, ok, r.repeats_saved)
    reps, ok, saved = out[False]
    assert reps == 6 * ok and saved == 0
    reps, ok, saved = out[True]
    assert ok <= reps <= 12 * ok and saved == 12 * ok - reps


def test_passes_of_a_cold_timing_merge_into_one_result():
    from tvm.s_tir.meta_schedule.runner import RunnerResult

    from dynatune.search.measure import merged_results

    a, b = RunnerResult([1.0, 2.0], None), RunnerResult([3.0], None)
    assert [float(x) for x in merged_results([a, b]).run_secs] == [1.0, 2.0, 3.0]
    assert merged_results([a]) is a
    failed = RunnerResult(None, "crashed")
    assert merged_results([a, failed, b]).error_msg == "crashed"  # a pass that failed fails the candidate
