"""Tuning seconds per measured candidate (what sets candidates per tuning second), two ways.

``task``: one task tuned in this process, split into search / build / measure, with the first round's
start-up cost (issue #2). The heaviest task (weight x FLOPs) is tuned ``--rounds`` times for ``--trials``
candidates, after the session's warm-up (TVM's tensor-intrinsics import, the worker pools) and the tasks'
untuned latencies; the first round on a task includes its one-off set-up (design space + search state),
later rounds are the steady state. The measurement protocol is stated (``--protocol``, one of
:data:`bench.harness.PROTOCOLS`), the search's settings are recorded::

    python -m bench.trial_cost task ../shared/models/squeezenet1_1.onnx --protocol fixed --rounds 4 \\
        --trials 32 [--trials-per-iter 16] [--out bench/results/trial_cost.json]

``pipeline``: whole runs, variants side by side (issue #29)::

    python -m bench.trial_cost pipeline --model ../shared/models/squeezenet1_1.onnx \\
        --model ../shared/models/mnasnet0_5.onnx --budget 240 \\
        --variant today=/tmp/base --variant new=. --variant new-fixed=.:measure.adaptive=false \\
        --config /tmp/bench_cfg.yaml [--table] [--by-task today]

A variant is ``NAME=CHECKOUT[:KEY=VALUE,...]``: ``dynatune tune`` of that checkout (a worktree of an older
commit for "today"), with those ``--set`` overrides. For each budget and model the variants run one after
the other, the order rotated from model to model (drift on a shared machine falls on every variant), each
in a fresh work dir with the same seeds. The compile stage's timings are off (``compile.profile``,
``measure_untuned``, ``measure_onnxruntime``) and the whole budget is spent (``stopping.enabled=false``):
only the tuning is compared. From each run's ``rounds.jsonl``: candidates measured, tuning seconds,
seconds per candidate, the shares of search, build and measure, and the estimated latency (sum of weight x
task latency) at the end; from its ``config.json``, the settings it ran with. Results:
``bench/results/pipeline_cost.json`` (``--out``).
"""

from __future__ import annotations

import json
import os
import tempfile
import time

from bench.harness import (
    heaviest,
    load_tasks,
    measure_config,
    parser,
    read_json,
    results_path,
    run_settings,
    stem,
    tune_cli,
    write_json,
)


# -- task ------------------------------------------------------------------------------------------
def task_cost(model_path: str, protocol: str, rounds: int, trials: int, trials_per_iter: int) -> dict:
    """One task's seconds per trial over ``rounds`` rounds of ``trials``, measured by ``protocol``."""
    from dynatune.search.session import SearchConfig, TuningSession

    t0 = time.perf_counter()
    model, target, tasks = load_tasks(model_path)
    t_extract = time.perf_counter() - t0
    search, measure = SearchConfig(trials_per_iter=trials_per_iter), measure_config(protocol)
    sess = TuningSession(tasks, target, tempfile.mkdtemp(), search=search, measure=measure)
    try:
        t0 = time.perf_counter()
        sess.warm_up()
        t_warm = time.perf_counter() - t0
        t0 = time.perf_counter()
        sess.measure_defaults()
        t_defaults = time.perf_counter() - t0
        heavy, rows = heaviest(tasks, 1)[0], []
        for r in range(rounds):
            res = sess.tune(heavy.index, trials=trials)
            rows.append(
                {
                    "round": r,
                    "trials": res.trials,
                    "wall_s": res.wall_s,
                    "search_s": res.search_s,
                    "build_s": res.build_s,
                    "measure_s": res.measure_s,
                    "per_trial_s": res.wall_s / res.trials,
                    "repeats_per_trial": res.repeats / res.trials,
                    "stops": res.stops,
                    "best_ms": res.best_after_s * 1e3,
                }
            )
            print(json.dumps(rows[-1]), flush=True)
    finally:
        sess.close()
    steady = rows[1:] or rows
    n = sum(r["trials"] for r in steady)
    return {
        "model": model.name,
        "task": heavy.name,
        "tasks": len(tasks),
        "protocol": protocol,
        "measure": measure.model_dump(),
        "search": search.model_dump(),
        "extract_s": t_extract,
        "warm_up_s": t_warm,
        "defaults_s": t_defaults,
        "first_round": rows[0],
        "rounds": rows,
        "steady_per_trial_s": sum(r["wall_s"] for r in steady) / n,
        "steady_split_s": {k: sum(r[k] for r in steady) / n for k in ("search_s", "build_s", "measure_s")},
    }


# -- pipeline --------------------------------------------------------------------------------------
PHASES = ("search_s", "build_s", "measure_s")
# only the tuning is compared: the compile's timings off, and the whole budget spent (a run that stopped
# early would compare another length of tuning)
OFF = [
    "compile.profile=false",
    "compile.measure_untuned=false",
    "compile.measure_onnxruntime=false",
    "stopping.enabled=false",
]


def parse_variant(text: str) -> tuple[str, str, list[str]]:
    name, _, rest = text.partition("=")
    repo, _, sets = rest.partition(":")
    return name, os.path.abspath(repo), [s for s in sets.split(",") if s]


def rounds_figures(work: str) -> dict:
    """A run's candidates, tuning seconds and their split, from its ``rounds.jsonl``."""
    rounds = [json.loads(line) for line in open(os.path.join(work, "rounds.jsonl"))]
    results = [r["result"] for r in rounds]
    trials = sum(r["trials"] for r in results)
    elapsed = rounds[-1]["elapsed_s"]
    shares = {k: sum(r[k] for r in results) / elapsed for k in PHASES}
    coverage = [r["result"] for r in rounds if r.get("phase") == "warmup"]
    return {
        "candidates": trials,
        "tuning_s": elapsed,
        "s_per_candidate": elapsed / max(trials, 1),
        "shares": shares,
        "repeats_per_candidate": sum(r.get("repeats", 0) for r in results) / max(trials, 1),
        "estimated_latency_ms": rounds[-1]["estimated_latency_s"] * 1e3,
        # the coverage pass: every task's first batch
        "coverage": {
            "rounds": len(coverage),
            "candidates": sum(r["trials"] for r in coverage),
            **{k: round(sum(r[k] for r in coverage), 2) for k in ("wall_s", *PHASES)},
        },
    }


def compare(models, budgets, variants, config, work_root, out_path, tune=tune_cli) -> dict:
    """Each (budget, model) run by every variant, the order rotated from model to model; merged into
    ``out_path``. ``tune``: how a run is made (:func:`bench.harness.tune_cli`)."""
    results = read_json(out_path, {})
    for budget in budgets:
        for m, model in enumerate(models):
            name = stem(model)
            order = variants[m % len(variants) :] + variants[: m % len(variants)]
            for label, repo, sets in order:
                work = os.path.join(work_root, f"{label}-{name}-{int(budget)}")
                run = tune(os.path.abspath(model), budget, work, config, OFF + sets, repo=repo)
                row = rounds_figures(work) | {"wall_s": run.wall_s, "sets": sets}
                row |= {"settings": run_settings(work), "date": time.strftime("%Y-%m-%d %H:%M")}
                results.setdefault(str(int(budget)), {}).setdefault(name, {})[label] = row
                write_json(out_path, results)
                print(f"{budget:.0f} s {name} {label}: {json.dumps(row)}", flush=True)
    return results


def table(results: dict, base: str) -> str:
    lines = [
        f"| budget s | model | variant | candidates | s / candidate | vs {base} | search | build | measure "
        f"| repeats / cand | estimate ms | vs {base} | coverage pass s (its search) |",
        "|---:|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|",
    ]
    for budget, models in results.items():
        for name, rows in models.items():
            ref = rows.get(base)
            for label, r in rows.items():
                sh = r["shares"]
                per = f"{r['s_per_candidate'] / ref['s_per_candidate']:.2f}x" if ref else "-"
                est = f"{r['estimated_latency_ms'] / ref['estimated_latency_ms']:.3f}" if ref else "-"
                cov = r.get("coverage")
                cov = f"{cov['wall_s']:.1f} ({cov['search_s']:.1f})" if cov else "-"
                lines.append(
                    f"| {budget} | {name} | {label} | {r['candidates']} | {r['s_per_candidate']:.3f} | {per} "
                    f"| {sh['search_s']:.0%} | {sh['build_s']:.0%} | {sh['measure_s']:.0%} "
                    f"| {r['repeats_per_candidate']:.2f} | {r['estimated_latency_ms']:.3f} | {est} | {cov} |"
                )
    return "\n".join(lines)


def task_figures(work: str) -> dict[str, dict]:
    """Per task of a run: candidates, ms per candidate of search, build and measure (its ``rounds.jsonl``),
    and the mean seconds of its measured candidates in the order they ran (``db/records.jsonl``)."""
    sums: dict[str, list[float]] = {}
    for line in open(os.path.join(work, "rounds.jsonl")):
        r = json.loads(line)["result"]
        s = sums.setdefault(r["task_name"], [0, 0.0, 0.0, 0.0])
        s[0] += r["trials"]
        for k, phase in enumerate(PHASES, start=1):
            s[k] += r[phase]
    names = {t["key"]: t["name"] for t in json.load(open(os.path.join(work, "tasks.json")))}
    timed: dict[str, list[float]] = {}
    for line in open(os.path.join(work, "db", "records.jsonl")):
        r = json.loads(line)
        secs = r["record"][1]
        timed.setdefault(names.get(r["key"], r["key"]), []).append(sum(secs) / len(secs))
    return {
        name: {
            "candidates": n,
            **{p: 1e3 * s / max(n, 1) for p, s in zip(PHASES, rest)},
            "timed": timed.get(name, []),
        }
        for name, (n, *rest) in sums.items()
    }


def task_table(work_root: str, budgets, models, variants, base: str, least: int = 64) -> str:
    """Per task, ms per candidate of search and build in each variant over ``base``'s, and its best kernel
    after as many candidates as both runs measured, for the tasks both runs gave at least ``least``
    candidates (the scheduler spends a run's slots on tasks of its choosing, so a run's mean mixes tasks
    differently from another's; a task's own cost and progress compare like with like)."""
    lines = [
        f"| budget s | model | task | variant | candidates ({base}) | search ms / cand ({base}) | vs {base} "
        f"| build ms / cand ({base}) | vs {base} | best after the same candidates, vs {base} |",
        "|---:|---|---|---|---:|---:|---:|---:|---:|---:|",
    ]
    for budget in budgets:
        for model in models:
            name = stem(model)
            runs = {
                label: task_figures(os.path.join(work_root, f"{label}-{name}-{int(budget)}"))
                for label, _, _ in variants
            }
            ref = runs[base]
            for label, tasks in runs.items():
                if label == base:
                    continue
                for task, f in sorted(tasks.items(), key=lambda kv: -ref.get(kv[0], {}).get("candidates", 0)):
                    r = ref.get(task)
                    if r is None or min(r["candidates"], f["candidates"]) < least:
                        continue
                    n = min(len(r["timed"]), len(f["timed"]))
                    lines.append(
                        f"| {budget:.0f} | {name} | {task} | {label} | {f['candidates']} ({r['candidates']}) "
                        f"| {f['search_s']:.1f} ({r['search_s']:.1f}) | {f['search_s'] / r['search_s']:.2f}x "
                        f"| {f['build_s']:.1f} ({r['build_s']:.1f}) | {f['build_s'] / r['build_s']:.2f}x "
                        f"| {min(f['timed'][:n]) / min(r['timed'][:n]):.3f} |"
                    )
    return "\n".join(lines)


def main(argv=None, tune=tune_cli):
    """``tune``: how a pipeline run is made (:func:`bench.harness.tune_cli`)."""
    from bench.harness import PROTOCOLS

    ap = parser(__doc__)
    sub = ap.add_subparsers(dest="mode", required=True)
    tk = sub.add_parser("task", help="one task tuned in this process: seconds per trial, split")
    tk.add_argument("model")
    tk.add_argument("--protocol", required=True, choices=sorted(PROTOCOLS), help="measurement protocol")
    tk.add_argument("--rounds", type=int, default=4)
    tk.add_argument("--trials", type=int, default=32)
    tk.add_argument("--trials-per-iter", type=int, default=16)
    tk.add_argument("--out", default=results_path("trial_cost.json"))
    pl = sub.add_parser("pipeline", help="whole runs of checkouts side by side: seconds per candidate")
    pl.add_argument("--model", action="append", default=[])
    pl.add_argument("--budget", action="append", type=float, default=[])
    pl.add_argument("--variant", action="append", default=[], help="NAME=CHECKOUT[:KEY=VALUE,...]")
    pl.add_argument("--config")
    pl.add_argument("--work", default="/tmp/dynatune-trial-cost")
    pl.add_argument("--out", default=results_path("pipeline_cost.json"))
    pl.add_argument("--table", action="store_true", help="print the results file as a table and exit")
    pl.add_argument("--by-task", metavar="BASE", help="also each task's cost per candidate against BASE's")
    args = ap.parse_args(argv)
    if args.mode == "task":
        out = task_cost(args.model, args.protocol, args.rounds, args.trials, args.trials_per_iter)
        write_json(args.out, out)
        print(json.dumps({k: v for k, v in out.items() if k != "rounds"}))
        return out
    variants = [parse_variant(v) for v in args.variant]
    if not args.table:
        if not variants or not args.model:
            ap.error("give a --model and a --variant (or --table)")
        config = os.path.abspath(args.config) if args.config else None
        compare(args.model, args.budget or [240.0], variants, config, args.work, args.out, tune)
    results = read_json(args.out, {})
    print(table(results, variants[0][0] if variants else "today"))
    if args.by_task:
        print(task_table(args.work, args.budget or [240.0], args.model, variants, args.by_task))
    return results


if __name__ == "__main__":
    main()
