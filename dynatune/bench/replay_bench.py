"""The replay benchmark: time-to-quality of every scheduler, over draws of recorded traces.

For each model, each draw ``d`` (a replay seed) picks one recorded trace per task (:func:`traces.draw`),
so the schedulers meet search luck as a live run would. On a draw and a budget fraction ``f`` of the
model's recorded time ``T``, the gradient scheduler (MetaSchedule's default) runs for ``B = f T``; its final
objective ``Q`` is the quality target. Every scheduler then runs (up to ``horizon x B``) and its
time-to-quality at tolerance ``rtol`` is the first elapsed time with objective ``<= Q (1 + rtol)``.
``rtol`` 0 asks for gradient's last micro-gain; 0.02 is the adaptive measurement's own tolerance, below
which a gain is not real.

The ratios ``TTQ_gradient / TTQ_dynatune`` and ``TTQ_round_robin / TTQ_dynatune`` (> 1: DynaTune is faster;
a target never reached counts as ``horizon x B``) are summarised per budget and rtol by their median and
interquartile range over every (model, draw), and by per-model medians.
"""

from __future__ import annotations

import random
import statistics

from dynatune.bench.replay import (
    default_slot,
    objective_at,
    replay,
    time_to_quality,
    total_trace_seconds,
    ttq_ratio,
)
from dynatune.bench.traces import available_traces, draw, load_traces, traces_per_task
from dynatune.errors import DynatuneError
from dynatune.schedulers import make_scheduler

BENCH_SCHEDULERS = ("dynatune", "gradient", "round_robin", "greedy", "random")
RATIOS = {"ttq_vs_gradient": "gradient", "ttq_vs_round_robin": "round_robin"}


def spread(xs) -> dict:
    """Median, quartiles and count of the defined values of ``xs``."""
    xs = sorted(x for x in xs if x is not None)
    if not xs:
        return {"median": None, "q1": None, "q3": None, "n": 0}
    q = statistics.quantiles(xs, n=4, method="inclusive") if len(xs) > 1 else [xs[0]] * 3
    return {"median": statistics.median(xs), "q1": q[0], "q3": q[2], "n": len(xs)}


def draw_rng(seed: int, d: int) -> random.Random:
    """The replay seed ``d``'s draw of traces (the same for every scheduler and budget)."""
    return random.Random(seed * 1_000_003 + d)


def replay_draw(
    doc,
    d: int,
    budgets,
    slot: float,
    total: float,
    schedulers,
    *,
    seed: int = 0,
    horizon: float = 3.0,
    rtols=(0.0,),
    params: dict | None = None,
    factories: dict | None = None,
) -> list[dict]:
    """Every scheduler on draw ``d`` of ``doc``, one row per budget fraction: TTQ per rtol, objective at
    the budget.

    ``factories``: extra schedulers, ``{name: f(drawn_doc, slot) -> Scheduler}`` (the oracle's clairvoyant).
    """
    params, factories = params or {}, factories or {}
    drawn = draw(doc, draw_rng(seed, d))
    rows = []
    for frac in budgets:
        budget = frac * total
        target = replay(
            drawn, make_scheduler("gradient", d, **params.get("gradient", {})), budget, slot
        ).final
        ttq = {str(r): {} for r in rtols}
        at_budget = {}
        for name in [*schedulers, *factories]:
            sch = (
                factories[name](drawn, slot)
                if name in factories
                else make_scheduler(name, d, **params.get(name, {}))
            )
            curve = replay(
                drawn, sch, horizon * budget, slot, stop_at=target * (1 + min(rtols)), stop_after_s=budget
            ).curve
            for r in rtols:
                ttq[str(r)][name] = min(time_to_quality(curve, target, r), horizon * budget)
            at_budget[name] = objective_at(curve, budget)
        rows.append(
            {
                "fraction": frac,
                "budget_s": budget,
                "target_s": target,
                "ttq_s": ttq,
                "objective_at_budget_s": at_budget,
            }
        )
    return rows


def run_replay_benchmark(
    models=None,
    budgets=(0.25, 0.5, 1.0),
    slot_s: float | None = None,
    schedulers=BENCH_SCHEDULERS,
    horizon: float = 3.0,
    seed: int = 0,
    params: dict | None = None,
    rtols=(0.0, 0.02),
    draws: int = 20,
    factories: dict | None = None,
) -> dict:
    """TTQ of every scheduler to the gradient scheduler's final quality, over ``draws`` draws per model.

    ``models``: names, paths or already-loaded trace documents (default: every recorded trace).
    ``slot_s``: slot length (default: per model, the median spacing of its trace points).
    ``params``: optional ``{scheduler: {param: value}}``. Returns a JSON-able dict.
    """
    if models is None:
        models = available_traces()
        if not models:
            raise DynatuneError("no recorded traces", "record some with python -m bench.record_traces")
    if draws < 1 or not rtols or min(rtols) < 0:
        raise DynatuneError(
            "the replay needs at least one draw and rtol >= 0", "e.g. --draws 20 --rtol 0 0.02"
        )
    schedulers = list(dict.fromkeys(["gradient", "dynatune", "round_robin", *schedulers]))
    out_models = []
    for m in models:
        doc = m if isinstance(m, dict) else load_traces(m)
        slot, total = slot_s or default_slot(doc), total_trace_seconds(doc)
        per_draw = [
            replay_draw(
                doc,
                d,
                budgets,
                slot,
                total,
                schedulers,
                seed=seed,
                horizon=horizon,
                rtols=rtols,
                params=params,
                factories=factories,
            )
            for d in range(draws)
        ]
        out_models.append(
            {
                "model": doc.get("model", "?"),
                "n_tasks": len(doc["tasks"]),
                "traces_per_task": traces_per_task(doc),
                "total_s": total,
                "slot_s": slot,
                "draws": per_draw,
                "summary": _summary([per_draw], budgets, rtols, horizon),
            }
        )
    summary = _summary([m["draws"] for m in out_models], budgets, rtols, horizon)
    for key in RATIOS:  # per-model medians beside the pooled ones
        for r in summary:
            for f in summary[r]:
                summary[r][f][key]["model_medians"] = [m["summary"][r][f][key]["median"] for m in out_models]
    head_rtol, full = str(rtols[-1]), str(max(budgets))
    return {
        "schedulers": schedulers + list(factories or {}),
        "budgets": list(budgets),
        "horizon": horizon,
        "seed": seed,
        "draws": draws,
        "rtols": list(rtols),
        "traces_per_task": min(m["traces_per_task"] for m in out_models),
        "models": out_models,
        "summary": summary,
        **{k: summary[head_rtol][full][k]["median"] for k in RATIOS},
    }


def _summary(model_draws: list, budgets, rtols, horizon: float) -> dict:
    """``{rtol: {fraction: {ratio: spread over (model, draw)}}}``."""
    out = {}
    for r in rtols:
        out[str(r)] = {}
        for j, frac in enumerate(budgets):
            rows = [draws[j] for per_model in model_draws for draws in per_model]
            out[str(r)][str(frac)] = {
                key: spread(
                    ttq_ratio(
                        row["ttq_s"][str(r)][ref], row["ttq_s"][str(r)]["dynatune"], horizon * row["budget_s"]
                    )
                    for row in rows
                )
                for key, ref in RATIOS.items()
            }
            out[str(r)][str(frac)]["censored_dynatune"] = sum(
                row["ttq_s"][str(r)]["dynatune"] >= horizon * row["budget_s"] - 1e-9 for row in rows
            )
    return out


def summary_lines(res: dict) -> list[str]:
    """The benchmark's headline as text: per rtol and budget, each ratio's median and IQR over the draws."""
    lines = [
        f"traces_per_task {res['traces_per_task']}, draws {res['draws']}, models "
        + ", ".join(m["model"] for m in res["models"])
    ]
    for r, by_budget in res["summary"].items():
        for f, row in by_budget.items():
            parts = [f"{key.removeprefix('ttq_vs_')} {_fmt(row[key])}" for key in RATIOS]
            lines.append(f"rtol {r} budget {f}: DynaTune sooner than " + ", ".join(parts))
    return lines


def _fmt(s: dict) -> str:
    if s["median"] is None:
        return "n/a"
    return f"{s['median']:.2f}x [{s['q1']:.2f}, {s['q3']:.2f}]"
