"""Synthetic tuning traces in the format of ``dynatune/bench/data/traces/<model>.json`` (for tests and
benches).

Each task's best latency follows a learning curve ``c + (d - c) * g(t)`` (power law or exponential, a
random family per task), sampled with multiplicative noise every ``step_s`` seconds and turned into a
monotone best-so-far staircase, starting from its untuned ``default_s``.
"""

from __future__ import annotations

import numpy as np


def synthetic_curve(
    rng,
    default_s: float,
    seconds: float,
    step_s: float,
    first_drop=(0.2, 0.7),
    final_frac=(0.3, 0.8),
    noise: float = 0.05,
) -> list:
    """[[seconds, trials, best_s], ...] with trace[0] = [0, 0, default_s]."""
    start = default_s * rng.uniform(*first_drop)  # best after the first batch
    floor = start * rng.uniform(*final_frac)  # asymptote
    kind, speed = rng.integers(2), rng.uniform(0.3, 1.5)
    trace, best, t, trials = [[0.0, 0, default_s]], default_s, 0.0, 0
    while t < seconds - 1e-9:
        t = round(t + step_s * rng.uniform(0.8, 1.2), 3)
        trials += 8
        x = t / step_s
        g = x**-speed if kind == 0 else np.exp(-(x - 1) * speed / 4)
        sample = (floor + (start - floor) * min(g, 1.0)) * (1 + noise * abs(rng.standard_normal()))
        best = min(best, float(sample))
        trace.append([t, trials, best])
    return trace


def synthetic_traces(
    n_tasks: int = 20,
    n_heavy: int = 3,
    seed: int = 0,
    seconds: float = 30.0,
    step_s: float = 3.0,
    model: str = "synthetic",
) -> dict:
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
            trace = synthetic_curve(
                rng, default, seconds, step_s, first_drop=(0.7, 1.0), final_frac=(0.85, 1.0)
            )
        name = f"fused_nn_conv2d_{i}" if heavy else f"fused_reshape_{i}"
        tasks.append(
            {
                "index": i,
                "name": name,
                "key": f"k{i}",
                "weight": weight,
                "flops": 1e6,
                "default_s": default,
                "trace": trace,
                "heavy": heavy,
            }
        )
    return {"model": model, "seconds_per_task": seconds, "tasks": tasks}


def staircase_traces(
    n_tasks: int = 24,
    seed: int = 0,
    slots: int = 12,
    step_s: float = 3.0,
    p0: float = 0.6,
    gamma: float = 0.6,
    u=(2.0, 3.0),
    kinds=None,
) -> dict:
    """Staircase curves with KNOWN headroom: the model :mod:`dynatune.beliefs.headroom` assumes.

    Each task has a roofline ``bound_s``; its kind's attainable fraction ``phi`` sets its floor
    ``bound / phi``. The first batch takes it from its default (20-60x the floor) to 1.5-4x the floor;
    after that its k-th slot jumps with probability ``p0 k^-gamma`` by a ``Beta(*u)`` fraction of the
    headroom left. Every task is traced for ``slots`` slots.
    """
    rng = np.random.default_rng(seed)
    kinds = kinds or {"conv2d": 0.6, "matmul": 0.4, "max": 0.15}
    names = list(kinds)
    tasks = []
    for i in range(n_tasks):
        kind = names[i % len(names)]
        bound = float(rng.uniform(1e-5, 1e-3))
        floor = bound / kinds[kind]
        default = floor * rng.uniform(20, 60)
        best = floor * rng.uniform(1.5, 4.0)
        trace = [[0.0, 0, default], [step_s, 8, best]]
        for k in range(2, slots + 1):
            if rng.random() < min(p0 * k**-gamma, 1.0):
                best -= rng.beta(*u) * (best - floor)
            trace.append([k * step_s, 8 * k, best])
        tasks.append(
            {
                "index": i,
                "name": f"fused_{kind}{i}_add{i}",
                "key": f"k{i}",
                "weight": int(rng.integers(1, 4)),
                "flops": 0.0,
                "bound_s": bound,
                "floor_s": floor,
                "default_s": default,
                "trace": trace,
            }
        )
    return {"model": f"staircase{seed}", "seconds_per_task": slots * step_s, "tasks": tasks}


def multi_seed(doc_seeds, model="syn"):
    """One document with a trace per seed for each task (the recorder's format 2)."""
    docs = [synthetic_traces(n_tasks=10, n_heavy=2, seed=s, model=model) for s in doc_seeds]
    tasks = []
    for k, row in enumerate(docs[0]["tasks"]):
        meta = {x: row[x] for x in ("index", "name", "key", "weight", "flops")}
        tasks.append(
            {
                **meta,
                "traces": [
                    {"seed": s, "default_s": d["tasks"][k]["default_s"], "trace": d["tasks"][k]["trace"]}
                    for s, d in zip(doc_seeds, docs)
                ],
            }
        )
    return {"model": model, "format": 2, "seeds": list(doc_seeds), "tasks": tasks}
