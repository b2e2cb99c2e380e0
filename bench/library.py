"""What the schedule library saves (issue #15): tune model A cold into a fresh library, then tune model B
three ways with the same budget: cold (no library), with A's library, and with A's library but key
matching off (transfer only).

    python bench/library.py --pair ../shared/models/squeezenet1_1.onnx ../shared/models/squeezenet1_1.onnx \
        --pair ../shared/models/squeezenet1_1.onnx ../shared/models/squeezenet1_1.onnx@input=1x3x160x160 \
        --pair ../shared/models/squeezenet1_1.onnx ../shared/models/mnasnet0_5.onnx \
        --budget 600 --out bench/results/library --skip squeezenet1_1--squeezenet1_1-transfer

A model is ``PATH[@INPUT=DIMS]`` (another input resolution: every task has a new key). A is tuned once for
all pairs that start from it. Each B run starts from its own copy of A's library, so the three see the same
library. A pair whose B is A itself (the nightly retune of an unchanged model: every key matches) takes A's
run as B's cold run: the same config, seed and budget. The library's seeding time (before the tuning clock
starts) is added to its runs' curves. Per B run: the time to reach B-cold's final
estimate (TTQ, x (1 + rtol)), the ratio TTQ(cold) / TTQ(run), the compiled model's latency at equal budget,
the matched and transferred tasks, and the transferred first batches against the search's own.

Resumable: each finished run is ``<out>/runs/A-<A>.json`` or
``<out>/runs/<pair>-<cold|library|transfer>.json``; ``--skip PAIR-VARIANT`` leaves a B run out (where the
machine time is short).
"""

import argparse
import json
import os
import sqlite3
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
from dynatune.bench.livebench import run_one  # noqa: E402
from dynatune.bench.replay import time_to_quality, ttq_ratio  # noqa: E402
from dynatune.files import WorkDir, atomic_write_json  # noqa: E402
from dynatune.model.importer import parse_shape  # noqa: E402
from dynatune.run.config import load_config  # noqa: E402
from dynatune.run.summary import RunSummary  # noqa: E402

LEVELS = (0.1, 0.5, 1.0)  # extra quality levels: within 10 %, 50 %, 2x of B-cold's final estimate
B_VARIANTS = {"cold": ["library.enabled=false"], "library": [], "transfer": ["library.match_keys=false"]}


def model_spec(text: str) -> tuple[str, dict, str]:
    """``PATH[@NAME=DIMS]`` -> (path, shapes, a short name)."""
    path, _, shape = text.partition("@")
    shapes = dict([parse_shape(shape)]) if shape else {}
    name = os.path.splitext(os.path.basename(path))[0] + ("-" + shape.split("=")[1] if shape else "")
    return path, shapes, name


def config(spec: str, work: str, budget: float, slot: float, library_db: str | None, extra=()):
    path, shapes, _ = model_spec(spec)
    lib = [f"library.url=sqlite:///{os.path.abspath(library_db)}"] if library_db else []
    return load_config(
        None,
        [
            f"slot_s={slot}",
            "search.trials_per_iter=8",
            "measure_every_s=0",
            "compile.measure_untuned=false",
            "compile.profile=false",
            "stopping.enabled=false",  # the curves compared over the whole budget
            *lib,
            *extra,
        ],
        model=path,
        shapes=shapes or None,
        budget=budget,
        work_dir=work,
    )


def copy_library(src: str, dst: str) -> None:
    """A consistent copy of a SQLite library (its write-ahead log included)."""
    if os.path.exists(dst):
        os.remove(dst)
    with sqlite3.connect(src) as a, sqlite3.connect(dst) as b:
        a.backup(b)


def run_saved(out: str, name: str, cfg) -> dict:
    saved = os.path.join(out, "runs", name + ".json")
    if os.path.exists(saved):
        with open(saved) as f:
            return json.load(f)
    res = run_one(cfg)
    summary = RunSummary.load(WorkDir(cfg.work_dir).summary)
    res["library"] = summary.library
    res["curve"][0] = (0.0, summary.start_estimated_latency_ms / 1e3)  # with the library's records in it
    seed_s = (res["library"] or {}).get("seed_s", 0.0)
    res["curve"] = [(t + seed_s, v) for t, v in res["curve"]]
    atomic_write_json(saved, res)
    print(f"{name}: {res['estimated_ms']:.3f} ms estimated, {res['latency_ms']:.3f} ms measured", flush=True)
    return res


def _finite(v: float) -> float | None:
    return None if v == float("inf") else v


def _num(v, fmt: str, none: str = "-") -> str:
    return none if v is None else format(v, fmt)


def table(result: dict) -> str:
    """The benchmark as markdown: per pair, the B runs' time to B-cold's final estimate and their compiled
    latency at equal budget."""
    lines = [
        "| pair (A -> B) | B run | matched / transferred tasks | start estimate | TTQ to cold's final "
        "| sooner than cold | TTQ within 10 % / 50 % / 2x | transferred vs search's first batch "
        "| compiled latency | vs ONNX Runtime |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for p in result["pairs"]:
        for k, r in p["B"].items():
            lib = r.get("library") or {}
            sooner = p["sooner_than_cold"].get(k)
            lines.append(
                " | ".join(
                    [
                        f"| {p['pair'].replace('--', ' -> ')}" if k == "cold" else "|",
                        k + (" (A's run)" if k == "cold" and p.get("cold_is_A") else ""),
                        f"{lib.get('matched_tasks', 0)} / {lib.get('transferred_tasks', 0)}" if lib else "-",
                        f"{r['curve'][0][1] * 1e3:.2f} ms",
                        _num(p["ttq_s"][k], ".0f", "never") + (" s" if p["ttq_s"][k] is not None else ""),
                        "-"
                        if k == "cold" or p["ttq_s"][k] is None
                        else _num(sooner, ".1f", "at once") + ("x" if sooner is not None else ""),
                        " / ".join(_num(p["ttq_levels_s"][str(level)][k], ".0f", "never") for level in LEVELS)
                        + " s",
                        _num(lib.get("transfer_gain_median"), ".2f")
                        + ("x" if lib.get("transfer_gain_median") else ""),
                        f"{r['latency_ms']:.2f} ms",
                        f"{r['ratio_vs_onnxruntime']:.2f}x |",
                    ]
                )
            )
    return (
        "\n".join(lines) + f"\n\nBudget {result['budget_s']:.0f} s a run; TTQ within {result['rtol']:.0%} "
        "of B-cold's final estimate; the library's seeding time counts.\n"
    )


def main(argv=None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--pair", nargs=2, action="append", metavar=("A", "B"), required=True)
    ap.add_argument("--budget", type=float, default=600)
    ap.add_argument("--slot", type=float, default=20)
    ap.add_argument("--rtol", type=float, default=0.02)
    ap.add_argument("--out", default="bench/results/library")
    ap.add_argument(
        "--skip",
        nargs="*",
        default=[],
        metavar="PAIR-VARIANT",
        help="B runs not to make, e.g. squeezenet1_1--squeezenet1_1-transfer",
    )
    args = ap.parse_args(argv)
    os.makedirs(os.path.join(args.out, "runs"), exist_ok=True)
    pairs = []
    for a, b in args.pair:
        name_a = model_spec(a)[2]
        pair = f"{name_a}--{model_spec(b)[2]}"
        work = os.path.join(args.out, "work", pair)
        work_a = os.path.join(args.out, "work", "A-" + name_a)
        lib_a = os.path.join(work_a, "library.db")
        os.makedirs(work_a, exist_ok=True)
        os.makedirs(work, exist_ok=True)
        run_a = run_saved(
            args.out, "A-" + name_a, config(a, os.path.join(work_a, "run"), args.budget, args.slot, lib_a)
        )
        runs = {}
        for variant, extra in B_VARIANTS.items():
            if f"{pair}-{variant}" in args.skip:
                continue
            if variant == "cold" and a == b:
                runs[variant] = run_a
                continue
            lib = None
            if variant != "cold":  # each B run from its own copy of A's library
                lib = os.path.join(work, f"library-{variant}.db")
                if not os.path.exists(os.path.join(args.out, "runs", f"{pair}-{variant}.json")):
                    copy_library(lib_a, lib)
            runs[variant] = run_saved(
                args.out,
                f"{pair}-{variant}",
                config(b, os.path.join(work, "B-" + variant), args.budget, args.slot, lib, extra),
            )
        target = runs["cold"]["curve"][-1][1]
        ttq = {k: time_to_quality(r["curve"], target, args.rtol) for k, r in runs.items()}
        pairs.append(
            {
                "pair": pair,
                "A": run_a,
                "B": runs,
                "cold_is_A": runs["cold"] is run_a,
                "target_ms": target * 1e3,
                "ttq_s": {k: _finite(v) for k, v in ttq.items()},
                # TTQ(cold) / TTQ(run); None: reached at the start, before any tuning
                "sooner_than_cold": {
                    k: ttq_ratio(ttq["cold"], ttq[k], args.budget) for k in runs if k != "cold"
                },
                # how soon each run comes within 10 % / 50 % / 2x of B-cold's final: where it never comes
                # within rtol, how far it got early
                "ttq_levels_s": {
                    str(level): {
                        k: _finite(time_to_quality(r["curve"], target, level)) for k, r in runs.items()
                    }
                    for level in LEVELS
                },
                "latency_ms": {k: r["latency_ms"] for k, r in runs.items()},
                "ratio_vs_onnxruntime": {k: r["ratio_vs_onnxruntime"] for k, r in runs.items()},
            }
        )
        p = pairs[-1]
        print(
            f"{pair}: TTQ {p['ttq_s']}, sooner than cold {p['sooner_than_cold']}, latency {p['latency_ms']}",
            flush=True,
        )
    result = {"budget_s": args.budget, "rtol": args.rtol, "pairs": pairs}
    atomic_write_json(os.path.join(args.out, "library.json"), result)
    with open(os.path.join(args.out, "library.md"), "w") as f:
        f.write(table(result))
    print(table(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
