"""Synthetic tuning traces in the format of ``dynatune/data/traces/<model>.json`` (for tests and benches).

Each task's best latency follows a learning curve ``c + (d - c) * g(t)`` (power law or exponential, a
random family per task), sampled with multiplicative noise every ``step_s`` seconds and turned into a
monotone best-so-far staircase, starting from its untuned ``default_s``.
"""

from __future__ import annotations

import numpy as np


def synthetic_curve(rng, default_s: float, seconds: float, step_s: float, first_drop=(0.2, 0.7),
                    final_frac=(0.3, 0.8), noise: float = 0.05) -> list:
    """[[seconds, trials, best_s], ...] with trace[0] = [0, 0, default_s]."""
    start = default_s * rng.uniform(*first_drop)  # best after the first batch
    floor = start * rng.uniform(*final_frac)  # asymptote
    kind, speed = rng.integers(2), rng.uniform(0.3, 1.5)
    trace, best, t, trials = [[0.0, 0, default_s]], default_s, 0.0, 0
    while t < seconds - 1e-9:
        t = round(t + step_s * rng.uniform(0.8, 1.2), 3)
        trials += 8
        x = t / step_s
        g = x ** -speed if kind == 0 else np.exp(-(x - 1) * speed / 4)
        sample = (floor + (start - floor) * min(g, 1.0)) * (1 + noise * abs(rng.standard_normal()))
        best = min(best, float(sample))
        trace.append([t, trials, best])
    return trace


def synthetic_traces(n_tasks: int = 20, n_heavy: int = 3, seed: int = 0, seconds: float = 30.0,
                     step_s: float = 3.0, model: str = "synthetic") -> dict:
    """A trace document: ``n_heavy`` heavy tasks (most of the latency), the rest light (tiny gains)."""
    rng = np.random.default_rng(seed)
    tasks = []
    for i in range(n_tasks):
        heavy = i % max(n_tasks // max(n_heavy, 1), 1) == 0 and sum(t["heavy"] for t in tasks) < n_heavy
        if heavy:
            default, weight = rng.uniform(2e-3, 1e-2), int(rng.integers(1, 4))
            trace = synthetic_curve(rng, default, seconds, step_s)
        else:
            default, weight = rng.uniform(1e-6, 5e-5), int(rng.integers(1, 6))
            trace = synthetic_curve(rng, default, seconds, step_s, first_drop=(0.7, 1.0), final_frac=(0.85, 1.0))
        name = f"fused_nn_conv2d_{i}" if heavy else f"fused_reshape_{i}"
        tasks.append({"index": i, "name": name, "key": f"k{i}", "weight": weight, "flops": 1e6,
                      "default_s": default, "trace": trace, "heavy": heavy})
    return {"model": model, "seconds_per_task": seconds, "tasks": tasks}
