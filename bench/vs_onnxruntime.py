"""Tuned model vs ONNX Runtime: tune each model with the default config for each budget, then time the
compiled model against ONNX Runtime in one fresh process (same threads, same inputs, interleaved).

    python bench/vs_onnxruntime.py --model ../shared/models/squeezenet1_1.onnx \
        --model ../shared/models/mnasnet0_5.onnx --model ../shared/models/transformer_tiny.onnx \
        --budget 300 --label after [--repo PATH] [--measure-every 60]

Each (model, budget) runs ``dynatune tune MODEL --budget B --json`` in its own work directory, as a user
would (Prefect + MLflow included). ``--repo`` runs another checkout's dynatune instead (e.g. a worktree of
an older commit, for the "before" figures); the timing always uses this checkout's side-by-side timer,
which needs only TVM and ONNX Runtime. Reported per run: the ratio tuned / ORT (median of alternating
rounds, and the spread of the per-round ratios), the run's own figures, and the time to ORT parity: the
first tuning second at which the periodically measured model beat ONNX Runtime (``--measure-every``
sets the interval for the run; runs of versions without periodic measurement have none).
Results are merged into ``bench/results/vs_onnxruntime.json`` under ``label/model/budget``.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
from dynatune.run.summary import RunSummary  # noqa: E402


def tune(
    repo: str, model: str, budget: float, work: str, config: str | None = None, sets=()
) -> tuple[RunSummary, float]:
    """The run's summary (its ``--json`` line, from this or an older checkout) and its wall seconds;
    ``sets``: ``--set KEY=VALUE`` overrides."""
    cmd = [sys.executable, "-m", "dynatune.cli", "tune", *([config] if config else [])]
    cmd += ["--model", model, "--budget", str(budget), "--work-dir", work, "--json"]
    for s in sets:
        cmd += ["--set", s]
    env = dict(os.environ, PYTHONPATH=repo)
    t0 = time.perf_counter()
    out = subprocess.run(cmd, cwd=repo, env=env, capture_output=True, text=True)
    if out.returncode != 0:
        raise RuntimeError(f"tune failed ({out.returncode}): {out.stderr[-2000:]}")
    return RunSummary.of(json.loads(out.stdout.strip().splitlines()[-1])), time.perf_counter() - t0


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
        "ratio": t.ratio_median,
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
        "| run's own ratio | estimate / model (profile) | tasks never tuned | parity s |",
        "|---|---|---:|---:|---|---:|---:|---:|---:|---:|---:|",
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
                    f"{fmt(est, '.3f')} | {never} | {fmt(r.get('time_to_onnxruntime_parity_s'), '.0f')} |"
                )
    return "\n".join(lines)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", action="append", default=[])
    ap.add_argument("--budget", action="append", type=float, default=[])
    ap.add_argument("--label", default="after")
    ap.add_argument("--repo", default=ROOT, help="the checkout whose dynatune tunes (default: this one)")
    ap.add_argument("--measure-every", type=float, default=None)
    ap.add_argument("--config", help="a config file for the runs (default: the built-in defaults)")
    ap.add_argument("--name", help="the name results are filed under (default: the model file's stem)")
    ap.add_argument("--rounds", type=int, default=15, help="alternating timing rounds")
    ap.add_argument("--work", default="/tmp/dynatune-vs-ort")
    ap.add_argument("--out", default=os.path.join(ROOT, "bench", "results", "vs_onnxruntime.json"))
    ap.add_argument(
        "--table", action="store_true", help="print the results file as a markdown table and exit"
    )
    args = ap.parse_args(argv)
    if args.table:
        print(table(json.load(open(args.out))))
        return 0
    if not args.model:
        ap.error("give at least one --model")
    results = json.load(open(args.out)) if os.path.exists(args.out) else {}
    for model in args.model:
        name = args.name or os.path.splitext(os.path.basename(model))[0]
        for budget in args.budget or [300.0]:
            work = os.path.join(args.work, args.label, f"{name}-{int(budget)}")
            s, bench_wall_s = tune(
                os.path.abspath(args.repo),
                os.path.abspath(model),
                budget,
                work,
                os.path.abspath(args.config) if args.config else None,
                [] if args.measure_every is None else [f"measure_every_s={args.measure_every}"],
            )
            fresh = time_fresh(os.path.abspath(model), s.artifact, args.rounds)
            row = {
                "fresh": fresh,
                "run": {
                    k: getattr(s, k)
                    for k in (
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
                    )
                },
                "bench_wall_s": bench_wall_s,
                "date": time.strftime("%Y-%m-%d %H:%M"),
                "repo": os.path.abspath(args.repo),
            }
            results.setdefault(args.label, {}).setdefault(name, {})[str(int(budget))] = row
            os.makedirs(os.path.dirname(args.out), exist_ok=True)
            with open(args.out, "w") as f:
                json.dump(results, f, indent=1)
            print(
                f"{args.label} {name} {int(budget)} s: tuned/ORT {fresh['ratio']:.2f} "
                f"[{fresh['ratio_spread'][0]:.2f}, {fresh['ratio_spread'][1]:.2f}] "
                f"({fresh['tvm_ms']:.3f} vs {fresh['onnxruntime_ms']:.3f} ms), "
                f"parity at {s.time_to_onnxruntime_parity_s}"
                + (f"; UNDER LOAD ({fresh['load_cores']:.2f} cores busy)" if fresh["under_load"] else ""),
                flush=True,
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
