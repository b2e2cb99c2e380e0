"""Plots and text reports of tuning runs.

Everything here works on plain data (the dicts of ``rounds.jsonl``, belief rows, run summaries: a
:class:`~dynatune.run.summary.RunSummary` or its ``summary.json`` dict), so the CLI
(``dynatune tune``, ``dynatune report``, ``dynatune compare``) and the pipeline (which logs the files as
MLflow artifacts) can share it. Latencies come in seconds and are shown in milliseconds.

- :func:`curve_from_rounds` -- ``[(elapsed_s, estimated_latency_s)]`` of a run;
- :func:`convergence_plot` -- estimated model latency vs tuning time, one line per run / scheduler;
- :func:`belief_plot` -- per task best latency vs tuning time, with the belief's prediction for one more slot;
- :func:`rounds_table` / :func:`compare_table` -- fixed-width text tables;
- :func:`markdown_report` -- a short markdown report of one run.

Plots use matplotlib's non-interactive "Agg" backend and never open a display.
"""

from __future__ import annotations

import math
import os

from dynatune.run.summary import RunSummary

__all__ = [
    "belief_plot",
    "compare_table",
    "convergence_plot",
    "curve_from_rounds",
    "markdown_report",
    "round_gains",
    "rounds_table",
]

NO_ROUNDS = "no rounds yet"
NO_RUNS = "no runs"
DASH = "-"
TASK_NAME_WIDTH = 32


# -- small helpers --------------------------------------------------------------------------------
def _num(x) -> float | None:
    """``x`` as a finite float, or None (missing, None, NaN, inf, not a number)."""
    if x is None or isinstance(x, bool):
        return None
    try:
        v = float(x)
    except (TypeError, ValueError):
        return None
    return v if math.isfinite(v) else None


def _fmt(x, spec: str, scale: float = 1.0, suffix: str = "") -> str:
    v = _num(x)
    return DASH if v is None else format(v * scale, spec) + suffix


def _ms_from_s(x, spec: str = ".3f") -> str:
    return _fmt(x, spec, 1e3)


def _int(x) -> str:
    v = _num(x)
    return DASH if v is None else str(int(round(v)))


def _text(x) -> str:
    if x is None:
        return DASH
    if isinstance(x, bool):
        return "yes" if x else "no"
    if isinstance(x, float) and not math.isfinite(x):
        return DASH
    s = str(x)
    return s if s else DASH


def _truncate(s: str, width: int) -> str:
    s = str(s)
    return s if len(s) <= width else s[: max(width - 3, 1)] + "..."


def _ratio(num, den) -> float | None:
    a, b = _num(num), _num(den)
    if a is None or b is None or b <= 0:
        return None
    return a / b


def _table(headers: list[str], rows: list[list[str]], right: set[int] | None = None) -> str:
    """Fixed-width table; columns in ``right`` are right-aligned (numbers)."""
    right = right or set()
    widths = [max([len(h)] + [len(r[i]) for r in rows]) for i, h in enumerate(headers)]

    def fmt(cells):
        out = [c.rjust(w) if i in right else c.ljust(w) for i, (c, w) in enumerate(zip(cells, widths))]
        return "  ".join(out).rstrip()

    lines = [fmt(headers), "  ".join("-" * w for w in widths)]
    lines += [fmt(r) for r in rows]
    return "\n".join(lines)


def _md_escape(s: str) -> str:
    return str(s).replace("|", "\\|")


def _use_agg():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _ensure_dir(path: str) -> None:
    d = os.path.dirname(os.path.abspath(path))
    os.makedirs(d, exist_ok=True)


# -- curves ---------------------------------------------------------------------------------------
def curve_from_rounds(rounds: list[dict], initial_s: float | None = None) -> list[tuple[float, float]]:
    """``[(elapsed_s, estimated_latency_s)]`` after every round, starting with ``(0, initial_s)`` if given.

    Rounds without a finite estimate (e.g. before every task has a default) are skipped.
    """
    curve: list[tuple[float, float]] = []
    if _num(initial_s) is not None:
        curve.append((0.0, float(initial_s)))
    for r in rounds:
        t, y = _num(r.get("elapsed_s")), _num(r.get("estimated_latency_s"))
        if t is None or y is None:
            continue
        curve.append((t, y))
    return curve


def round_gains(rounds: list[dict], initial_s: float | None = None) -> list[float | None]:
    """Weighted latency drop (seconds) of each round: estimated latency before minus after.

    The "before" of the first round is ``initial_s`` when given; otherwise it is unknown and the gain is
    taken from the round's own result, ``(best_before_s - best_after_s) x weight`` (weight from the belief
    row), or None when that is not available either.
    """
    gains: list[float | None] = []
    prev = _num(initial_s)
    for r in rounds:
        cur = _num(r.get("estimated_latency_s"))
        gain = None
        if prev is not None and cur is not None:
            gain = prev - cur
        elif prev is None:
            res = r.get("result") or {}
            before, after = _num(res.get("best_before_s")), _num(res.get("best_after_s"))
            weight = _num((r.get("belief") or {}).get("weight"))
            if before is not None and after is not None:
                gain = (before - after) * (weight if weight is not None else 1.0)
        gains.append(gain)
        if cur is not None:
            prev = cur
    return gains


# -- plots ----------------------------------------------------------------------------------------
def convergence_plot(
    curves: dict[str, list[tuple[float, float]]],
    path: str,
    title: str = "",
    initial: dict[str, float] | None = None,
) -> str:
    """Estimated model latency (ms) vs tuning time (s), one step-post line per label. Returns ``path``.

    ``initial`` maps a label to its round-0 latency (seconds), drawn at t = 0. The y axis is logarithmic
    when the values span more than 10x.
    """
    plt = _use_agg()
    initial = initial or {}
    fig, ax = plt.subplots(figsize=(7, 4.2), dpi=100)
    try:
        all_y: list[float] = []
        drawn = 0
        for label in list(curves) + [k for k in initial if k not in curves]:
            pts = [
                (float(t), float(y))
                for t, y in (curves.get(label) or [])
                if _num(t) is not None and _num(y) is not None
            ]
            pts.sort(key=lambda p: p[0])
            y0 = _num(initial.get(label))
            if y0 is not None and not (pts and pts[0][0] <= 0.0):
                pts.insert(0, (0.0, y0))
            if not pts:
                continue
            xs = [p[0] for p in pts]
            ys = [p[1] * 1e3 for p in pts]
            all_y += ys
            ax.plot(
                xs, ys, drawstyle="steps-post", marker="o", markersize=2.5, linewidth=1.5, label=str(label)
            )
            drawn += 1
        positive = [y for y in all_y if y > 0]
        if positive and len(positive) == len(all_y) and max(positive) > 10 * min(positive):
            ax.set_yscale("log")
        if drawn:
            ax.legend(loc="upper right", fontsize=8)
        else:
            ax.text(0.5, 0.5, NO_ROUNDS, ha="center", va="center", transform=ax.transAxes, color="gray")
        ax.set_xlabel("tuning time (s)")
        ax.set_ylabel("estimated model latency (ms)")
        ax.set_title(title or "convergence")
        ax.grid(True, which="both", alpha=0.3)
        return _save(fig, path)
    finally:
        plt.close(fig)


def _save(fig, path: str) -> str:
    fig.tight_layout()
    _ensure_dir(path)
    fig.savefig(path, format="png")
    return path


def _task_best_s(task: dict) -> float | None:
    hist = task.get("history") or []
    for h in reversed(hist):
        if len(h) >= 3 and _num(h[2]) is not None:
            return float(h[2])
    return _num(task.get("default_s"))


def _task_points(task: dict) -> list[tuple[float, float]]:
    """``[(seconds, best_s)]`` starting at ``(0, default_s)``; a missing best carries the previous one."""
    pts: list[tuple[float, float]] = []
    best = _num(task.get("default_s"))
    if best is not None:
        pts.append((0.0, best))
    for h in task.get("history") or []:
        if not h:
            continue
        t = _num(h[0])
        b = _num(h[2]) if len(h) >= 3 else None
        if b is not None:
            best = b
        if t is not None and best is not None:
            pts.append((t, best))
    return pts


def belief_plot(tasks: list[dict], path: str, top: int = 8) -> str:
    """Small multiples of the ``top`` tasks by weight x best latency. Returns ``path``.

    Each panel: the task's best latency (ms) vs its tuning seconds, and the belief's prediction for one
    more slot at ``last seconds + slot_s``: ``best - gain_mean_s / weight`` with error bar
    ``+- gain_std_s / weight``.
    """
    plt = _use_agg()

    def key(t):
        b = _task_best_s(t)
        w = _num(t.get("weight")) or 1.0
        return -(w * b) if b is not None else math.inf

    chosen = sorted(tasks or [], key=key)[: max(int(top), 0)]
    n = len(chosen)
    ncols = min(4, max(n, 1))
    nrows = max(1, math.ceil(n / ncols))
    fig, axes = plt.subplots(nrows, ncols, figsize=(3.2 * ncols, 2.6 * nrows), dpi=100, squeeze=False)
    try:
        flat = [a for row in axes for a in row]
        if not chosen:
            flat[0].text(
                0.5, 0.5, "no tasks", ha="center", va="center", transform=flat[0].transAxes, color="gray"
            )
            flat[0].set_axis_off()
        for ax, task in zip(flat, chosen):
            pts = _task_points(task)
            weight = _num(task.get("weight")) or 1.0
            if pts:
                ax.plot(
                    [p[0] for p in pts],
                    [p[1] * 1e3 for p in pts],
                    drawstyle="steps-post",
                    marker="o",
                    markersize=3,
                    linewidth=1.2,
                    label="best",
                )
            best = _task_best_s(task)
            mean, std, slot = (
                _num(task.get("gain_mean_s")),
                _num(task.get("gain_std_s")),
                _num(task.get("slot_s")),
            )
            if best is not None and mean is not None:
                last_t = pts[-1][0] if pts else 0.0
                x = last_t + (slot if slot is not None else 0.0)
                pred = (best - mean / weight) * 1e3
                err = (std / weight) * 1e3 if std is not None else 0.0
                ax.errorbar(
                    [x],
                    [pred],
                    yerr=[[err], [err]],
                    fmt="s",
                    color="tab:red",
                    markersize=4,
                    capsize=3,
                    label="predicted",
                )
                if pts:
                    ax.plot([last_t, x], [best * 1e3, pred], linestyle=":", color="tab:red", linewidth=1)
            name = _truncate(task.get("name", ""), 28)
            ax.set_title(f"{name} (w={_int(task.get('weight'))})", fontsize=8)
            ax.set_xlabel("tuning s", fontsize=7)
            ax.set_ylabel("best (ms)", fontsize=7)
            ax.tick_params(labelsize=7)
            ax.grid(True, alpha=0.3)
        for ax in flat[max(n, 1) :]:
            ax.set_axis_off()
        if chosen:
            flat[0].legend(fontsize=6, loc="upper right")
        return _save(fig, path)
    finally:
        plt.close(fig)


# -- text tables ----------------------------------------------------------------------------------
def rounds_table(rounds: list[dict], last: int | None = None, initial_s: float | None = None) -> str:
    """Fixed-width table of rounds (the ``last`` ones if given): round, task, trials, gain (ms, the weighted
    drop of estimated latency this round, see :func:`round_gains`), estimated latency (ms), elapsed (s)."""
    if not rounds:
        return NO_ROUNDS
    gains = round_gains(rounds, initial_s)
    pairs = list(zip(rounds, gains))
    if last is not None:
        pairs = pairs[-last:] if last > 0 else []
    rows = []
    for r, g in pairs:
        res = r.get("result") or {}
        rows.append(
            [
                _int(r.get("round")),
                _truncate(r.get("task_name") or _text(r.get("task")), TASK_NAME_WIDTH),
                _int(res.get("trials")),
                _ms_from_s(g, ".4f"),
                _ms_from_s(r.get("estimated_latency_s")),
                _fmt(r.get("elapsed_s"), ".1f"),
            ]
        )
    headers = ["round", "task", "trials", "gain ms", "est. ms", "elapsed s"]
    return _table(headers, rows, right={0, 2, 3, 4, 5})


def _speedup(reference_ms, latency_ms) -> str:
    v = _ratio(reference_ms, latency_ms)
    return DASH if v is None else f"{v:.2f}x"


def _ratio_spread(summary: RunSummary) -> str:
    r, lo, hi = (
        _num(summary.ratio_vs_onnxruntime),
        _num(summary.ratio_vs_onnxruntime_min),
        _num(summary.ratio_vs_onnxruntime_max),
    )
    if r is None:
        return DASH
    text = f"{r:.3f}" if lo is None or hi is None else f"{r:.3f} ({lo:.3f}-{hi:.3f})"
    note = unfair_timing_note(summary)
    return text + (f" {note}" if note else "")


def unfair_timing_note(summary: RunSummary) -> str:
    """What a summary says of its side-by-side timing when that is not a fair one ("" when it is): taken on
    a busy machine, or in a slow spell (ONNX Runtime slower than alone before tuning, in every process)."""
    why = []
    if summary.timing_under_load:
        load = _num(summary.timing_load_cores)
        why.append("taken under load" + (f": other work took {load:.2f} cores" if load is not None else ""))
    if summary.timing_onnxruntime_slow:
        ref = _num(summary.onnxruntime_reference_ms)
        alone = f" ({ref:.3f} ms)" if ref is not None else ""
        why.append(f"taken in a slow spell: ONNX Runtime over its time alone before tuning{alone}")
    if not why:
        return ""
    return f"({'; '.join(why)}, {_int(summary.timing_attempts)} tries; not a fair ratio, no parity)"


def compare_table(runs: dict[str, RunSummary | dict]) -> str:
    """One row per run (label -> summary, or its dict); a missing value shows as "-".

    Columns: label, model, scheduler, rounds, trials, tuning s, est. ms, measured ms, speedup vs untuned,
    speedup vs ONNX Runtime (both from the measured latency).
    """
    if not runs:
        return NO_RUNS
    rows = []
    for label, s in runs.items():
        s = RunSummary.of(s)
        model = s.model
        rows.append(
            [
                str(label),
                _truncate(os.path.basename(str(model)), 24) if model else DASH,
                _text(s.scheduler),
                _int(s.rounds),
                _int(s.trials),
                _fmt(s.elapsed_s, ".1f"),
                _fmt(s.estimated_latency_ms, ".3f"),
                _fmt(s.latency_ms, ".3f"),
                _speedup(s.untuned_latency_ms, s.latency_ms),
                _speedup(s.onnxruntime_latency_ms, s.latency_ms),
            ]
        )
    headers = [
        "run",
        "model",
        "scheduler",
        "rounds",
        "trials",
        "tuning s",
        "est. ms",
        "measured ms",
        "vs untuned",
        "vs ORT",
    ]
    return _table(headers, rows, right={3, 4, 5, 6, 7, 8, 9})


# -- markdown -------------------------------------------------------------------------------------
_HEADLINE = [
    ("rounds", "rounds", _int),
    ("trials", "trials", _int),
    ("elapsed_s", "tuning time (s)", lambda v: _fmt(v, ".1f")),
    ("budget_s", "budget (s)", lambda v: _fmt(v, ".1f")),
    ("stopped_early", "stopped before the budget", _text),
    ("tuning_s_saved", "tuning seconds saved", lambda v: _fmt(v, ".1f")),
    ("wall_s", "wall time (s)", lambda v: _fmt(v, ".1f")),
    ("estimated_latency_ms", "estimated latency (ms)", lambda v: _fmt(v, ".3f")),
    (
        "estimated_model_latency_ms",
        "estimated latency with what the kernels alone miss (ms)",
        lambda v: _fmt(v, ".3f"),
    ),
    ("latency_ms", "measured latency (ms)", lambda v: _fmt(v, ".3f")),
    ("untuned_latency_ms", "untuned TVM latency (ms)", lambda v: _fmt(v, ".3f")),
    ("onnxruntime_latency_ms", "ONNX Runtime latency (ms)", lambda v: _fmt(v, ".3f")),
    (
        "time_to_onnxruntime_parity_s",
        "first tuning second the measured model beat ONNX Runtime",
        lambda v: _fmt(v, ".0f"),
    ),
    ("warmup_rounds", "coverage pass: first batches", _int),
]


def markdown_report(summary: RunSummary | dict | None, rounds: list[dict], path: str) -> str:
    """Write a short markdown report of one run to ``path`` and return its text.

    Title (model, scheduler), headline numbers, the 10 rounds with the largest gains, and links to the
    plots ``convergence.png`` and ``beliefs.png`` (expected next to the report).
    """
    summary = RunSummary.of(summary)  # a summary.json dict (an older run's, or partial) is read into one
    model = summary.model
    model_name = os.path.basename(str(model)) if model else DASH
    lines = [f"# dynatune: {_md_escape(model_name)} ({_md_escape(_text(summary.scheduler))})", ""]

    lines += ["| metric | value |", "|---|---|"]
    lines.append(f"| model | {_md_escape(_text(model))} |")
    lines.append(f"| scheduler | {_md_escape(_text(summary.scheduler))} |")
    for field, label, fmt in _HEADLINE:
        lines.append(f"| {label} | {fmt(getattr(summary, field))} |")
    lines.append(f"| speedup vs untuned | {_speedup(summary.untuned_latency_ms, summary.latency_ms)} |")
    lines.append(
        f"| speedup vs ONNX Runtime | {_speedup(summary.onnxruntime_latency_ms, summary.latency_ms)} |"
    )
    lines.append(
        f"| TVM / ONNX Runtime, side by side (median, min-max of rounds) | {_ratio_spread(summary)} |"
    )
    rel = _num(summary.max_rel_err)
    per = [_num(e) for e in summary.max_rel_err_per_input or []]
    per_text = ", ".join(DASH if e is None else f"{e:.3g}" for e in per)
    each = f" (over {len(per)} random inputs: {per_text})" if per else ""
    lines.append(f"| max relative error | {DASH if rel is None else f'{rel:.3g}'}{each} |")
    lines.append(f"| numerics ok | {_text(summary.numerics_ok)} |")
    lines.append(f"| artifact | {_md_escape(_text(summary.artifact))} |")
    lines.append(
        f"| its metadata (dynatune.runtime.load reads it) | {_md_escape(_text(summary.artifact_metadata))} |"
    )
    lines.append(f"| threads (TVM's and ONNX Runtime's) | {_int(summary.threads)} |")
    lines.append("")
    if summary.stop_reason:
        lines += [f"Why tuning ended: {_md_escape(summary.stop_reason)}.", ""]
    conf = summary.confirmed
    if conf:
        failed = conf.get("failed") or []
        lines += [
            f"{_int(conf.get('tasks'))} tasks started from schedules measured in earlier runs (the schedule "
            f"library, a warm start); measured again here, they took "
            f"{_fmt(conf.get('median_ratio'), '.3f')}x their recorded time (median; the most, "
            f"{_fmt(conf.get('worst_ratio'), '.3f')}x, {_md_escape(_text(conf.get('worst_task')))})"
            + (
                f"; {len(failed)} did not build or run: {', '.join(_md_escape(n) for n in failed)}"
                if failed
                else ""
            )
            + ".",
            "",
        ]
    never = summary.never_tuned_tasks
    if never:
        lines += [
            f"{len(never)} of {_int(summary.tasks)} tasks were never tuned (no batch before tuning ended, "
            f"no schedule from an earlier run) and run their untuned schedules: "
            f"{', '.join(_md_escape(str(n)) for n in never)}.",
            "",
        ]
    lib = summary.library
    if lib:
        lines += [
            f"Schedule library ({_md_escape(_text(lib.get('url')))}): {_int(lib.get('matched_tasks'))} of "
            f"{_int(summary.tasks)} tasks matched and started from "
            f"{_int(lib.get('seeded_records'))} of its records; this run wrote "
            f"{_int(lib.get('written_records'))} records to it"
            + (f" until it failed: {_md_escape(lib['write_error'])}" if lib.get("write_error") else "")
            + ".",
            "",
        ]
        if lib.get("transfer_tasks"):
            gain = lib.get("transfer_gain_median")
            lines += [
                f"{_int(lib.get('transferred_tasks'))} of {_int(lib.get('transfer_tasks'))} new tasks with "
                f"similar library tasks got transferred schedules in their first batch"
                + (
                    f"; the best of that batch's own candidates was {gain:.2f}x the transferred best (median)"
                    if gain
                    else ""
                )
                + ".",
                "",
            ]
    prof = summary.profile
    if prof:
        lines += [
            f"Where the model's time goes (`profile.md`): "
            f"{_fmt(prof.get('model_ms'), '.3f')} ms in the model, "
            f"{_fmt(prof.get('kernel_ms'), '.3f')} ms in tuned-task kernels, "
            f"{_fmt(prof.get('calls_without_task_ms'), '.3f')} ms in calls with no task, "
            f"{_fmt(prof.get('between_calls_ms'), '.3f')} ms between calls "
            f"({_fmt(prof.get('between_calls_run_ms'), '.3f')} ms against a single run's median, "
            f"{_fmt(prof.get('model_run_ms'), '.3f')} ms); the estimate "
            f"(weight x latency, re-timed alone with the caches flushed) is "
            f"{_fmt(prof.get('estimate_ms'), '.3f')} ms." + _profile_slow_note(prof),
            "",
        ]
    excluded = summary.estimate_excludes
    if excluded:
        names = ", ".join(_md_escape(str(n)) for n in excluded)
        lines += [
            f"The estimated latency leaves out {len(excluded)} task(s) with no measured latency "
            f"(default schedule failed, no tuned record): {names}.",
            "",
        ]

    lines += ["## Rounds with the largest gains", ""]
    if not rounds:
        lines.append(NO_ROUNDS)
    else:
        gains = round_gains(rounds)
        order = sorted(range(len(rounds)), key=lambda i: -(gains[i] if gains[i] is not None else -math.inf))
        top = [i for i in order if gains[i] is not None][:10]
        if not top:
            lines.append("no gains recorded")
        else:
            lines += [
                "| round | task | trials | gain (ms) | est. latency (ms) | elapsed (s) |",
                "|---:|---|---:|---:|---:|---:|",
            ]
            for i in top:
                r = rounds[i]
                res = r.get("result") or {}
                name = _md_escape(_truncate(r.get("task_name") or _text(r.get("task")), TASK_NAME_WIDTH))
                lines.append(
                    f"| {_int(r.get('round'))} | {name} | {_int(res.get('trials'))} | "
                    f"{_ms_from_s(gains[i], '.4f')} | {_ms_from_s(r.get('estimated_latency_s'))} | "
                    f"{_fmt(r.get('elapsed_s'), '.1f')} |"
                )
    lines.append("")

    lines += [
        "## Plots",
        "",
        "- convergence: `convergence.png`",
        "- beliefs: `beliefs.png`",
        "",
        "![convergence](convergence.png)",
        "",
        "![beliefs](beliefs.png)",
        "",
    ]
    text = "\n".join(lines)
    _ensure_dir(path)
    with open(path, "w") as f:
        f.write(text)
    return text


def _profile_slow_note(prof: dict) -> str:
    """The profile's slow-spell check in words (:func:`dynatune.compiler.profile.profile_model`)."""
    if not prof.get("slow_spell"):
        return ""
    return (
        f" Taken in a slow spell: in all {prof.get('attempts')} attempts the model ran over "
        f"{_fmt(prof.get('fastest_model_ms'), '.3f')} ms, the final timing's fastest block, by more than "
        "the profile's check allows; its split is not the quiet machine's."
    )
