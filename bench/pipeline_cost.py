"""Tuning seconds per measured candidate, whole pipeline, variants side by side (issue #29).

    python bench/trial_cost.py pipeline --model ../shared/models/squeezenet1_1.onnx \
        --model ../shared/models/mnasnet0_5.onnx --budget 240 \
        --variant today=/tmp/base --variant new=. --variant new-fixed=.:measure.adaptive=false \
        --config /tmp/bench_cfg.yaml

A variant is ``NAME=CHECKOUT[:KEY=VALUE,...]``: ``dynatune tune`` of that checkout (a worktree of an older
commit for "today"), with those ``--set`` overrides. For each budget and model the variants run one after
the other, the order rotated from model to model (drift on a shared machine falls on every variant), each
in a fresh work dir with the same seeds. The compile stage's timings are off (``compile.profile``,
``measure_untuned``, ``measure_onnxruntime``): only the tuning is compared. From each run's
``rounds.jsonl``: candidates measured, tuning seconds, seconds per candidate, the shares of search,
build and measure, and the estimated latency (sum of weight x task latency) at the end.
"""

from __future__ import annotations

import json
import os
import time

from vs_onnxruntime import tune

PHASES = ("search_s", "build_s", "measure_s")
OFF = ["compile.profile=false", "compile.measure_untuned=false", "compile.measure_onnxruntime=false"]


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


def compare(models, budgets, variants, config, work_root, out_path) -> dict:
    results = json.load(open(out_path)) if os.path.exists(out_path) else {}
    for budget in budgets:
        for m, model in enumerate(models):
            name = os.path.splitext(os.path.basename(model))[0]
            order = variants[m % len(variants) :] + variants[: m % len(variants)]
            for label, repo, sets in order:
                work = os.path.join(work_root, f"{label}-{name}-{int(budget)}")
                t0 = time.perf_counter()
                tune(repo, os.path.abspath(model), budget, work, config, OFF + sets)
                row = rounds_figures(work) | {"wall_s": time.perf_counter() - t0, "sets": sets}
                row["date"] = time.strftime("%Y-%m-%d %H:%M")
                results.setdefault(str(int(budget)), {}).setdefault(name, {})[label] = row
                json.dump(results, open(out_path, "w"), indent=1)
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
            name = os.path.splitext(os.path.basename(model))[0]
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
