"""Tuned model vs ONNX Runtime: tune each model for each budget as a user would, then time the compiled
model against ONNX Runtime in one fresh process (same threads, same inputs, interleaved).

    python -m bench.vs_onnxruntime --model ../shared/models/squeezenet1_1.onnx \\
        --model ../shared/models/mnasnet0_5.onnx --model ../shared/models/transformer_tiny.onnx \\
        --budget 300 --stopping off --label after [--config C] [--set KEY=VALUE]... [--repo PATH] \\
        [--measure-every 60]
    python -m bench.vs_onnxruntime --table      # the results as a markdown table

Each (model, budget) runs ``dynatune tune [CONFIG] --model MODEL --budget B --json`` in its own work
directory (Prefect + MLflow included; :func:`bench.harness.tune_cli`). ``--stopping`` is stated: ``off``
spends the whole budget (the figure is the model after B seconds), ``on`` lets the run stop when its
beliefs say the model cannot get faster (the figure is what a user gets for a budget of B). ``--repo`` runs
another checkout's dynatune instead (e.g. a worktree of an older commit, for the "before" figures); the
timing always uses this checkout's side-by-side timer (:mod:`dynatune.compiler.fresh_timing`), which needs
only TVM and ONNX Runtime. Reported per run: the ratio tuned / ORT (median of alternating rounds, and the
spread of the per-round ratios), the run's own figures and settings, and the time to ORT parity: the first
tuning second at which the periodically measured model beat ONNX Runtime (``--measure-every`` sets the
interval for the run). Results are merged into ``bench/results/vs_onnxruntime.json`` under
``label/model/budget``.
"""

from __future__ import annotations

import os
import time

from bench.harness import ROOT, parser, read_json, results_path, run_settings, stem, tune_cli, write_json

RUN_FIGURES = (
    "tasks",
    "rounds",
    "trials",
    "elapsed_s",
    "wall_s",
    "estimated_latency_ms",
    "latency_ms",
    "onnxruntime_latency_ms",
    "ratio_vs_onnxruntime",
    "ratio_vs_onnxruntime_min",
    "ratio_vs_onnxruntime_max",
    "timing_under_load",
    "timing_load_cores",
    "time_to_onnxruntime_parity_s",
    "never_tuned_tasks",
    "warmup_rounds",
    "max_rel_err",
    "numerics_ok",
    "measurements",
    "periodic_measure_s",
    "profile",
    "stopped_early",
    "tuning_s_used",
)


def time_fresh(model: str, artifact: str, rounds: int) -> dict:
    """Time ``artifact`` vs ONNX Runtime in a fresh process (the run's own final timing does the same)."""
    from dynatune.compiler.fresh_timing import time_in_fresh_process
    from dynatune.machine.target import usable_cores
    from dynatune.model.importer import load_model

    threads = usable_cores()
    t = time_in_fresh_process(artifact, load_model(model, {}), threads=threads, rounds=rounds)
    return {
        "tvm_ms": t.tvm_median_ms,
        "onnxruntime_ms": t.ort_median_ms,
        "ratio": t.ratio,
        "ratio_spread": [t.ratio_min, t.ratio_max],
        "rounds": rounds,
        "threads": threads,
        # the machine stayed busy through the retries (dynatune.machine.load): not a fair ratio
        "under_load": t.under_load,
        "load_cores": t.load_cores,
        "attempts": t.attempts,
    }


def table(results: dict) -> str:
    """The results as markdown: one row per (label, model, budget)."""

    def fmt(x, spec=".2f"):
        return "-" if x is None else format(x, spec)

    lines = [
        "| label | model | budget s | tuned / ORT (fresh process) | min-max | tuned ms | ORT ms "
        "| run's own ratio | estimate / model (profile) | tasks never tuned | parity s | tuning s used |",
        "|---|---|---:|---:|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for label, models in results.items():
        for name, budgets in models.items():
            for budget, row in sorted(budgets.items(), key=lambda kv: float(kv[0])):
                f, r = row["fresh"], row["run"]
                lo, hi = f["ratio_spread"]
                never = r.get("never_tuned_tasks")
                never = "-" if never is None else f"{len(never)} of {r['tasks']}"
                est = (r.get("profile") or {}).get("estimate_over_model")
                busy = f" (under load: {f['load_cores']:.2f} cores busy)" if f.get("under_load") else ""
                lines.append(
                    f"| {label} | {name} | {budget} | **{f['ratio']:.2f}**{busy} | {lo:.2f}-{hi:.2f} | "
                    f"{f['tvm_ms']:.3f} | {f['onnxruntime_ms']:.3f} | {fmt(r.get('ratio_vs_onnxruntime'))} | "
                    f"{fmt(est, '.3f')} | {never} | {fmt(r.get('time_to_onnxruntime_parity_s'), '.0f')} | "
                    f"{fmt(r.get('tuning_s_used'), '.0f')} |"
                )
    return "\n".join(lines)


def main(argv=None, tune=tune_cli) -> dict:
    """``tune``: how a run is made (:func:`bench.harness.tune_cli`)."""
    ap = parser(__doc__)
    ap.add_argument("--model", action="append", default=[])
    ap.add_argument("--budget", action="append", type=float, default=[])
    ap.add_argument("--stopping", choices=("on", "off"), help="stopping.enabled of the runs (required)")
    ap.add_argument("--label", default="after")
    ap.add_argument("--repo", default=ROOT, help="the checkout whose dynatune tunes (default: this one)")
    ap.add_argument("--measure-every", type=float, default=None)
    ap.add_argument("--config", help="a config file for the runs (default: the built-in defaults)")
    ap.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="more settings")
    ap.add_argument("--name", help="the name results are filed under (default: the model file's stem)")
    ap.add_argument("--rounds", type=int, default=15, help="alternating timing rounds")
    ap.add_argument("--work", default="/tmp/dynatune-vs-ort")
    ap.add_argument("--out", default=results_path("vs_onnxruntime.json"))
    ap.add_argument("--table", action="store_true", help="print the results file as a markdown table")
    args = ap.parse_args(argv)
    results = read_json(args.out, {})
    if args.table:
        print(table(results))
        return results
    if not args.model or not args.stopping:
        ap.error("give at least one --model, and --stopping on or off")
    sets = [f"stopping.enabled={'true' if args.stopping == 'on' else 'false'}", *args.set]
    sets += [] if args.measure_every is None else [f"measure_every_s={args.measure_every}"]
    config = os.path.abspath(args.config) if args.config else None
    for model in map(os.path.abspath, args.model):
        name = args.name or stem(model)
        for budget in args.budget or [300.0]:
            work = os.path.join(args.work, args.label, f"{name}-{int(budget)}")
            run = tune(model, budget, work, config, sets, repo=os.path.abspath(args.repo))
            s, fresh = run.summary, time_fresh(model, run.summary.artifact, args.rounds)
            row = {
                "fresh": fresh,
                "run": {k: getattr(s, k) for k in RUN_FIGURES},
                "settings": run_settings(work),
                "bench_wall_s": run.wall_s,
                "date": time.strftime("%Y-%m-%d %H:%M"),
                "repo": os.path.abspath(args.repo),
            }
            results.setdefault(args.label, {}).setdefault(name, {})[str(int(budget))] = row
            write_json(args.out, results)
            print(
                f"{args.label} {name} {int(budget)} s: tuned/ORT {fresh['ratio']:.2f} "
                f"[{fresh['ratio_spread'][0]:.2f}, {fresh['ratio_spread'][1]:.2f}] "
                f"({fresh['tvm_ms']:.3f} vs {fresh['onnxruntime_ms']:.3f} ms), "
                f"parity at {s.time_to_onnxruntime_parity_s}"
                + (f"; UNDER LOAD ({fresh['load_cores']:.2f} cores busy)" if fresh["under_load"] else ""),
                flush=True,
            )
    return results


if __name__ == "__main__":
    main()
