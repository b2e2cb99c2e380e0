"""Live scheduler benchmark: real tuning, same budget, several schedulers and seeds, one run at a time.

    dynatune bench live --model M.onnx [--model M2.onnx] --seeds 0 1 --budget 600 --slot 20 \
        --measure-every 150 --schedulers dynatune gradient round_robin --out bench/results/live

Each (model, seed, scheduler) run tunes from scratch in its own work directory, through the library's
pipeline (:func:`dynatune.run.pipeline.run`), with the same budget, slot and search settings; the seed is both
the scheduler's and the search's, so a pair of seeds puts search luck into the comparison. Every run
compiles the model and times it against ONNX Runtime in a fresh process at the end, and every
``--measure-every`` tuning seconds on the way (:mod:`dynatune.compiler.periodic`).

Per run: the estimated-latency curve (every round), the *measured* curve (periodic points and the final
compiled model) and the compiled model's latency. Per (model, seed): the time each scheduler needed to
reach the gradient rule's final quality within ``--rtol`` (TTQ), on the estimate and on the measured
latency, and the ratios ``TTQ_other / TTQ_dynatune`` (> 1: DynaTune sooner; a target never reached counts
as the budget; "sooner" in the counts means a ratio above ``SOONER``, 1.05). A measured TTQ can only be one
of the measurement points.

Resumable: each finished run is saved as ``<out>/runs/<model>-s<seed>-<scheduler>.json`` and skipped when
the benchmark is run again with the same arguments, so the runs can be done in chunks; a run killed
half-way resumes in its work directory (``<out>/work/...``), as any run does.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import time

from dynatune.bench.replay import time_to_quality, ttq_ratio
from dynatune.files import WorkDir, atomic_write_json
from dynatune.machine.target import usable_cores
from dynatune.model.importer import parse_shape


def live_config(
    path: str,
    shapes: dict,
    scheduler: str,
    budget: float,
    slot: float,
    work: str,
    trials_per_iter: int,
    seed: int = 0,
    measure_every_s: float = 0.0,
    base_config: str | None = None,
):
    """One live run's config: ``base_config`` (default: the defaults) with the run's scheduler, seeds, budget,
    slot, batch size and measurement interval."""
    from dynatune.run.config import load_config

    return load_config(
        base_config,
        [
            f"slot_s={slot}",
            f"search.trials_per_iter={trials_per_iter}",
            f"scheduler.seed={seed}",
            f"search.seed={seed}",
            f"measure_every_s={measure_every_s}",
            "compile.measure_untuned=false",
            "compile.profile=false",
            "library.enabled=false",
            "stopping.enabled=false",  # the schedulers compared at the same budget, spent
        ],
        model=path,
        shapes=shapes or None,
        budget=budget,
        scheduler=scheduler,
        work_dir=work,
    )


def run_one(cfg) -> dict:
    """Tune, compile and time one run with the library's pipeline; its estimated and measured curves."""
    from dynatune.run.pipeline import run
    from dynatune.search.database import read_jsonl

    summary = run(cfg)
    rounds = read_jsonl(WorkDir(cfg.work_dir).rounds)
    curve = [(0.0, summary.initial_estimated_latency_ms / 1e3)]
    curve += [(r["elapsed_s"], r["estimated_latency_s"]) for r in rounds]
    measured = [(p["elapsed_s"], p["latency_ms"] / 1e3) for p in summary.measurements]
    measured.append((summary.elapsed_s, summary.latency_ms / 1e3))
    return {
        "scheduler": cfg.scheduler.name,
        "seed": cfg.scheduler.seed,
        "curve": curve,
        "measured": measured,
        "rounds": summary.rounds,
        "trials": summary.trials,
        "tuning_wall_s": summary.elapsed_s,
        "estimated_ms": curve[-1][1] * 1e3,
        "latency_ms": summary.latency_ms,
        "onnxruntime_ms": summary.onnxruntime_latency_ms,
        "ratio_vs_onnxruntime": summary.ratio_vs_onnxruntime,
        "numerics_ok": summary.numerics_ok,
    }


SOONER = 1.05  # "sooner" needs a TTQ ratio above this: two runs that both reach the target at their last
# point end a second apart by the slot timings, which is no evidence either way


def compare(runs: dict, budget: float, rtol: float) -> dict:
    """TTQ of each run to gradient's final quality, on the estimate and on the measured latency, and
    ratios."""
    out = {}
    for kind, key in (("estimate", "curve"), ("measured", "measured")):
        target = runs["gradient"][key][-1][1] if "gradient" in runs else next(iter(runs.values()))[key][-1][1]
        ttq = {k: time_to_quality(r[key], target, rtol) for k, r in runs.items()}
        row = {"target_ms": target * 1e3, "ttq_s": {k: None if math.isinf(v) else v for k, v in ttq.items()}}
        if "dynatune" in runs:
            for other in ("gradient", "round_robin"):
                if other in runs:
                    row[f"ttq_vs_{other}"] = ttq_ratio(ttq[other], ttq["dynatune"], budget)
            row["dynatune_sooner_than_gradient"] = (
                "gradient" in runs and row["ttq_vs_gradient"] is not None and row["ttq_vs_gradient"] > SOONER
            )
        out[kind] = row
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="dynatune bench live")
    ap.add_argument("--model", action="append", required=True)
    ap.add_argument("--shape", action="append", default=[])
    ap.add_argument("--config", default=None, help="base run config (default: the defaults)")
    ap.add_argument("--seeds", type=int, nargs="+", default=[0])
    ap.add_argument("--budget", type=float, default=900)
    ap.add_argument("--slot", type=float, default=20)
    ap.add_argument("--measure-every", type=float, default=0.0, help="tuning seconds between measured points")
    ap.add_argument("--rtol", type=float, default=0.02, help="TTQ target: gradient's final x (1 + rtol)")
    ap.add_argument("--schedulers", nargs="+", default=["dynatune", "gradient", "round_robin"])
    ap.add_argument("--trials-per-iter", type=int, default=8)
    ap.add_argument("--out", default="bench/results/live")
    args = ap.parse_args(argv)
    shapes = dict(parse_shape(x) for x in args.shape)
    os.makedirs(os.path.join(args.out, "runs"), exist_ok=True)
    pairs = []
    for path in args.model:
        name = os.path.splitext(os.path.basename(path))[0]
        for seed in args.seeds:
            runs = {sch: _run_or_load(args, path, shapes, name, seed, sch) for sch in args.schedulers}
            pairs.append({"model": name, "seed": seed, "runs": runs, **compare(runs, args.budget, args.rtol)})
    doc = {
        "budget_s": args.budget,
        "slot_s": args.slot,
        "measure_every_s": args.measure_every,
        "rtol": args.rtol,
        "seeds": args.seeds,
        "pairs": pairs,
        "date": time.strftime("%Y-%m-%d"),
        "cores": usable_cores(),
        "dynatune_sooner_measured": sum(
            bool(p["measured"].get("dynatune_sooner_than_gradient")) for p in pairs
        ),
        "dynatune_sooner_estimate": sum(
            bool(p["estimate"].get("dynatune_sooner_than_gradient")) for p in pairs
        ),
    }
    atomic_write_json(os.path.join(args.out, "live.json"), doc)
    for p in pairs:
        print(
            f"{p['model']} seed {p['seed']}: measured TTQ {p['measured']['ttq_s']}, "
            f"estimate TTQ {p['estimate']['ttq_s']}",
            flush=True,
        )
    print(
        f"DynaTune reached gradient's final measured quality sooner in {doc['dynatune_sooner_measured']} of "
        f"{len(pairs)} (model, seed) pairs",
        flush=True,
    )
    return 0


def _run_or_load(args, path, shapes, name, seed, sch) -> dict:
    saved = os.path.join(args.out, "runs", f"{name}-s{seed}-{sch}.json")
    if os.path.exists(saved):
        with open(saved) as f:
            return json.load(f)
    work = os.path.join(args.out, "work", f"{name}-s{seed}-{sch}")  # a run killed half-way resumes there
    res = run_one(
        live_config(
            path,
            shapes,
            sch,
            args.budget,
            args.slot,
            work,
            args.trials_per_iter,
            seed,
            args.measure_every,
            args.config,
        )
    )
    atomic_write_json(saved, res)
    print(
        f"{name} seed {seed} {sch}: {res['estimated_ms']:.3f} ms estimated, "
        f"{res['latency_ms']:.3f} ms measured, "
        f"{res['rounds']} rounds",
        flush=True,
    )
    return res
