"""Know when to stop: runs that stop when their beliefs say the model cannot get faster, against the full
budget.

Two parts.

``replay``: the stopping rule (:mod:`dynatune.run.stopping`) on the recorded traces, deterministic and cheap
(what the default ``stopping.min_gain_share`` was chosen by). For each model and draw of its traces, the
DynaTune scheduler replays ``--budgets`` (multiples of the model's recorded time; past its end a task's curve
is flat) once without the rule and once with it for each ``--shares`` x ``--patience``; reported per setting:
the share of the budget used and the objective at the stop against the full replay's (the loss)::

    python -m bench.stop_savings replay [--draws 3] [--budgets 1 2] [--shares 0.005 0.01 0.02 0.05] \\
        [--patience 1 3] [--confidence 1] [--models M ...] [--out bench/results/stopping_replay.json]

``recorded``: the rule on runs tuned here (deterministic, seconds): each work dir given is a run tuned to its
whole budget (stopping off, or ``live``'s ``run/``, resumed to the budget); the rule is checked after every
one of its recorded rounds as the tuner checks it (:mod:`dynatune.bench.recorded_run`). The rule chooses no
task, so where it stops is where the run would have stopped with it, and the run's later rounds say what
stopping there lost (the estimate at the stop against the run's last); every check keeps the beliefs' bound
beside what the run still gained after it::

    python -m bench.stop_savings recorded W/readme-s0/run W/mnasnet0_5-s0/run [--share 0.02] \
        [--patience 3] [--confidence 1] [--out bench/results/stopping_recorded.json]

``live``: item 4 of the issue, on quiet cores. For each ``--model`` (``default``: the README job's model)
and seed, cold (a fresh schedule library, a fresh work dir), with the README job's config and ``--budget``:

1. ``stopped``: ``dynatune tune`` with stopping on (issue #56); its work dir, library and ``model.so`` are
   copied aside;
2. ``full``: the same work dir resumed with stopping off to the same budget (the tuning up to the stop is
   the same run's; skipped when the first run spent the budget);
3. ``retune``: a nightly retune of the unchanged model from the copies of step 1 (a dated work dir under
   ``retune/``, warm-started from the first run's work dir, with its schedule library), stopping on;
4. the three ``model.so`` timed side by side (:func:`bench.harness.side_by_side`, in this process, which
   tunes nothing itself: alternating 200 ms blocks, ONNX Runtime beside them).

Each run states its stopping explicitly (``stopping.enabled``, ``min_gain_share``, ``patience``,
``confidence``: ``--share``, ``--patience``, ``--confidence``), so a change of the defaults does not change
what is compared; the results keep each run's settings.

Reported per run: tuning seconds used and saved, the stop's reason, and the per-round ratios of the full
run's model and of the retune's to the stopped one's (median [min, max]); each run's stopping checks
(``rounds.jsonl``'s ``stop_check``: the most the rest could buy, against the threshold) are kept in the
results: the beliefs' trace that explains a missed target. The targets (:data:`TARGETS`): stopped within 3 %
of full on every model, tuning <= 40 % of the budget on at least two models, the retune stopped within 60 s
of tuning and within 2 % of the first run's model::

    python -m bench.stop_savings live --model default --model ../shared/models/squeezenet1_1.onnx \\
        --model ../shared/models/mnasnet0_5.onnx --model ../shared/models/transformer_tiny.onnx \\
        --seeds 0 1 --budget 900 [--work /tmp/dynatune-stopping] [--out bench/results/stopping_live.json]

``retune``: steps 3 and 4 of ``live`` again (a new dated retune, then the three models timed side by side),
for every row of ``--out`` whose work dir under ``--work`` is still there; the row's retune and timing are
replaced (after a change to how a retune stops, without tuning the first and full runs again)::

    python -m bench.stop_savings retune [--work /tmp/dynatune-stopping] \\
        [--out bench/results/stopping_live.json]
"""

from __future__ import annotations

import datetime
import os
import shutil
import statistics
import time

from bench.harness import (
    ROOT,
    parser,
    read_json,
    results_path,
    run_settings,
    side_by_side,
    spread,
    tune_cli,
    write_json,
)
from dynatune.errors import DynatuneError

README_CONFIG = os.path.join(ROOT, "configs", "quickstart.yaml")
# the targets: stopped within 3 % of full (full / stopped >= 1 / 1.03), tuning <= 40 % of the budget
# on two models or more, a retune stopped within 60 s of tuning and within 2 % of the first run's model
TARGETS = {"full_vs_stopped": 1 / 1.03, "used_share": 0.40, "retune_s": 60.0, "retune_vs_first": 1.02}


# -- replay ----------------------------------------------------------------------------------------------
def replay_rows(draws: int, budgets, shares, patiences, confidence: float, models=None) -> list[dict]:
    """One row per (model, draw, budget multiple, share, patience): the budget saved and the loss."""
    from dynatune.bench.replay import default_slot, replay, total_trace_seconds
    from dynatune.bench.replay_bench import draw_rng
    from dynatune.bench.traces import available_traces, draw, load_traces
    from dynatune.run.stopping import BeliefStopping
    from dynatune.schedulers import make_scheduler

    rows = []
    for name in models or available_traces():
        doc = load_traces(name)
        name = doc["model"]
        total, slot = total_trace_seconds(doc), default_slot(doc)
        for d in range(draws):
            drawn = draw(doc, draw_rng(0, d))
            for mult in budgets:
                budget = mult * total
                full = replay(drawn, make_scheduler("dynatune", d), budget, slot).final
                for share in shares:
                    for patience in patiences:
                        rule = BeliefStopping(share, patience, confidence)
                        r = replay(drawn, make_scheduler("dynatune", d), budget, slot, stopping=rule)
                        used = r.curve[-1][0]
                        rows.append(
                            {
                                "model": name,
                                "draw": d,
                                "budget_x": mult,
                                "budget_s": budget,
                                "share": share,
                                "patience": patience,
                                "stopped": r.stop is not None,
                                "used_share": min(used / budget, 1.0),
                                "loss": r.final / full - 1.0,
                                "reason": (r.stop or {}).get("reason"),
                            }
                        )
                        print(
                            f"{name} draw {d} x{mult} share {share:.3f} patience {patience}: used "
                            f"{rows[-1]['used_share']:.0%}, loss {rows[-1]['loss']:+.2%}",
                            flush=True,
                        )
    return rows


def replay_table(rows: list[dict]) -> str:
    lines = [
        "| min_gain_share | patience | budget (x recorded) | runs stopped | budget used: median [min, max] "
        "| loss vs full: median [max] |",
        "|---:|---:|---:|---:|---|---|",
    ]
    keys = sorted({(r["share"], r["patience"], r["budget_x"]) for r in rows})
    for share, patience, mult in keys:
        group = [r for r in rows if (r["share"], r["patience"], r["budget_x"]) == (share, patience, mult)]
        used, loss = spread([r["used_share"] for r in group]), [r["loss"] for r in group]
        lines.append(
            f"| {share:.3f} | {patience} | {mult:g} | {sum(r['stopped'] for r in group)} of {len(group)} | "
            f"{used['median']:.0%} [{used['min']:.0%}, {used['max']:.0%}] | "
            f"{statistics.median(loss):+.2%} [{max(loss):+.2%}] |"
        )
    return "\n".join(lines)


# -- recorded --------------------------------------------------------------------------------------------
def recorded_rows(work_dirs, share: float, patience: int, confidence: float) -> list[dict]:
    """One row per recorded run: where the rule stops it, and what the run gained after that."""
    from dynatune.bench.recorded_run import recorded_rounds, rule_on_run, run_roofline
    from dynatune.run.stopping import BeliefStopping

    rows = []
    for work in work_dirs:
        try:
            r = rule_on_run(
                recorded_rounds(work, run_roofline(work)), BeliefStopping(share, patience, confidence)
            )
        except DynatuneError as e:
            raise DynatuneError(f"{work}: {e}") from None
        rows.append(
            {
                "work_dir": work,
                "share": share,
                "patience": patience,
                "confidence": confidence,
                "stop_round": r.stop_round,
                "stop_s": r.stop_elapsed_s,
                "budget_s": r.budget_s,
                "used_share": r.used_share,
                "estimate_at_stop_ms": r.estimate_at_stop_s * 1e3,
                "last_estimate_ms": r.final_estimate_s * 1e3,
                "loss": r.loss,
                "checks": r.checks,
            }
        )
        print(
            f"{work}: stops at {r.stop_elapsed_s:.0f} s of {r.budget_s:.0f} ({r.used_share:.0%}), round "
            f"{r.stop_round}; its estimate {r.loss:+.2%} against the run's last",
            flush=True,
        )
    return rows


# -- live ------------------------------------------------------------------------------------------------
def model_path(spec: str) -> str:
    if spec == "default":
        from dynatune.model.default_model import default_model_path

        return default_model_path()
    return os.path.abspath(spec)


def stop_checks(work: str) -> list[dict]:
    """The run's stopping checks, one per round: the beliefs' trace."""
    from dynatune.files import WorkDir
    from dynatune.run.workdir_state import read_rounds

    keep = ("gain_s", "task", "task_gain_s", "threshold_s", "slots_left", "streak", "eligible")
    return [
        {"round": r["round"], "elapsed_s": r["elapsed_s"], **{k: r["stop_check"].get(k) for k in keep}}
        for r in read_rounds(WorkDir(work).rounds)
        if r.get("stop_check")
    ]


def run_figures(summary) -> dict:
    keys = (
        "stopped_early",
        "stop_reason",
        "tuning_s_used",
        "tuning_s_saved",
        "budget_s",
        "rounds",
        "trials",
        "estimated_latency_ms",
        "latency_ms",
        "ratio_vs_onnxruntime",
        "confirmed",
        "work_dir",
    )
    return {k: getattr(summary, k) for k in keys}


def time_artifacts(model: str, artifacts: dict, rounds: int) -> dict:
    """The runs' ``model.so`` and ONNX Runtime timed side by side (:func:`bench.harness.side_by_side`)."""
    import tvm

    from dynatune.compiler.execution import load
    from dynatune.model.importer import load_model

    vms = {name: load(path, tvm.cpu()) for name, path in artifacts.items()}
    return side_by_side(load_model(model), vms, rounds)


def stopping_sets(enabled: bool, share: float, patience: int, confidence: float) -> list[str]:
    """The run's stopping, every setting given (``--set``)."""
    return [
        f"stopping.enabled={str(enabled).lower()}",
        f"stopping.min_gain_share={share}",
        f"stopping.patience={patience}",
        f"stopping.confidence={confidence}",
    ]


def live_one(
    spec: str, seed: int, budget: float, config: str, work: str, rounds: int, rule: dict, tune=tune_cli
):
    """One model and seed: the stopped run, the full one, the retune, timed side by side. ``rule``: the
    stopping settings (:func:`stopping_sets`' keywords but ``enabled``); ``tune``: how a run is made
    (:func:`bench.harness.tune_cli`)."""
    model = model_path(spec)
    shutil.rmtree(work, ignore_errors=True)
    os.makedirs(work)
    lib, first_lib = os.path.join(work, "library.db"), os.path.join(work, "first-library.db")
    stop, no_stop = stopping_sets(True, **rule), stopping_sets(False, **rule)
    sets = [*run_seeds(seed), f"library.url=sqlite:///{lib}"]
    run_dir, first_dir = os.path.join(work, "run"), os.path.join(work, "first")
    stopped = tune(model, budget, run_dir, config, [*sets, *stop]).summary
    shutil.copytree(run_dir, first_dir, symlinks=True)
    if os.path.exists(lib):  # (a config with the library off writes none)
        shutil.copy(lib, first_lib)
    out = {"model": spec, "seed": seed, "budget_s": budget, "settings": run_settings(first_dir)}
    out["stopped"] = run_figures(stopped) | {"checks": stop_checks(run_dir)}
    if stopped.stopped_early:
        out["full"] = run_figures(tune(model, budget, run_dir, config, [*sets, *no_stop]).summary)
    return retune_and_time(out, work, config, rounds, rule, tune)


def run_seeds(seed: int) -> list[str]:
    return [f"scheduler.seed={seed}", f"search.seed={seed}"]


def retune_and_time(out: dict, work: str, config: str, rounds: int, rule: dict, tune=tune_cli) -> dict:
    """Step 3 and 4 of ``live`` on its work dir ``work`` (``first/`` and ``first-library.db`` as step 1 left
    them, ``run/`` as step 2 did): a nightly retune of the unchanged model, then the runs' models timed side
    by side. ``out``: the row of steps 1 and 2, which gets the retune and the timing."""
    from dynatune.files import WorkDir

    model = model_path(out["model"])
    first_dir, run_dir = os.path.join(work, "first"), os.path.join(work, "run")
    artifacts = {"stopped": os.path.join(first_dir, "model.so")}
    if out.get("full"):
        artifacts["full"] = WorkDir(run_dir).model_so
    stamp = datetime.datetime.now(datetime.timezone.utc).strftime("%Y%m%dT%H%M%SZ")
    retune_dir = WorkDir(first_dir).retune(stamp)
    first_lib = f"library.url=sqlite:///{os.path.join(work, 'first-library.db')}"
    sets = [*run_seeds(out["seed"]), first_lib, f"warm_start=[{first_dir}]", *stopping_sets(True, **rule)]
    retune = tune(model, out["budget_s"], retune_dir, config, sets).summary
    out["retune"] = run_figures(retune) | {"checks": stop_checks(retune_dir)}
    artifacts["retune"] = WorkDir(retune_dir).model_so
    timing = time_artifacts(model, artifacts, rounds)
    ms = {v["variant"]: v for v in timing["variants"]}
    out["timing"] = timing
    # per-round ratios to the first artifact, the stopped run's model
    out["full_vs_stopped"] = ms["full"]["vs_first"] if "full" in ms else None
    out["retune_vs_first"] = ms["retune"]["vs_first"]
    return out


def retune_rows(
    results: list[dict], work_root: str, config: str, rounds: int, rule: dict, tune=tune_cli
) -> list[dict]:
    """``retune``: steps 3 and 4 again for every row of ``results`` whose work dir (``work_root/<model>-s
    <seed>``, as ``live`` left it) is still there; the row's retune and timing are replaced."""
    for row in results:
        work = os.path.join(work_root, f"{model_name(row['model'])}-s{row['seed']}")
        if not os.path.isdir(os.path.join(work, "first")):
            continue
        retune_and_time(row, work, config, rounds, rule, tune)
        row["retune_date"] = time.strftime("%Y-%m-%d %H:%M")
        print(live_table([row]), flush=True)
    return results


def model_name(spec: str) -> str:
    return "readme" if spec == "default" else os.path.splitext(os.path.basename(spec))[0]


def live_table(results: list[dict]) -> str:
    def f(x, spec=".0f"):
        return "-" if x is None else format(x, spec)

    def ratio(r):
        return f"{r['median']:.3f} [{r['min']:.3f}, {r['max']:.3f}]" if r else "-"

    lines = [
        "| model | seed | stopped at s (of budget) | saved s | full / stopped model | retune tuning s "
        "| retune / first model | stop reason |",
        "|---|---:|---:|---:|---|---:|---|---|",
    ]
    for r in results:
        s, rt = r["stopped"], r["retune"]
        used = f"{f(s['tuning_s_used'])} ({s['tuning_s_used'] / r['budget_s']:.0%})"
        lines.append(
            f"| {r['model']} | {r['seed']} | {used} | {f(s['tuning_s_saved'])} | "
            f"{ratio(r.get('full_vs_stopped'))} | {f(rt['tuning_s_used'])} | "
            f"{ratio(r.get('retune_vs_first'))} | {s['stop_reason']} |"
        )
    return "\n".join(lines + ["", targets(results)])


def targets(results: list[dict]) -> str:
    """Each target of :data:`TARGETS`, met or missed, over the runs."""
    t = TARGETS
    close = [r for r in results if r.get("full_vs_stopped")]
    within = sum(r["full_vs_stopped"]["median"] >= t["full_vs_stopped"] for r in close)
    under = {r["model"] for r in results if r["stopped"]["tuning_s_used"] <= t["used_share"] * r["budget_s"]}
    fast = sum(r["retune"]["tuning_s_used"] <= t["retune_s"] for r in results)
    near = sum(r["retune_vs_first"]["median"] <= t["retune_vs_first"] for r in results)
    n, models = len(results), len({r["model"] for r in results})
    return (
        f"stopped within 3 % of full: {within} of {len(close)} stopped runs; tuning <= 40 % of the budget on "
        f"{len(under)} of {models} models (target: 2); retune stopped within 60 s: {fast} of {n}; retune "
        f"within 2 % of the first run's model: {near} of {n}"
    )


def main(argv=None):
    ap = parser(__doc__)
    sub = ap.add_subparsers(dest="part", required=True)
    rp = sub.add_parser("replay", help="the rule on the recorded traces")
    rp.add_argument("--models", nargs="*", help="trace files or recorded model names (default: all recorded)")
    rp.add_argument("--draws", type=int, default=3)
    rp.add_argument("--budgets", type=float, nargs="+", default=[1.0, 2.0])
    rp.add_argument("--shares", type=float, nargs="+", default=[0.005, 0.01, 0.02, 0.05])
    rp.add_argument("--patience", type=int, nargs="+", default=[3])
    rp.add_argument("--confidence", type=float, default=1.0, help="stopping.confidence")
    rp.add_argument("--out", default=results_path("stopping_replay.json"))
    rc = sub.add_parser("recorded", help="the rule on runs tuned to their whole budget here")
    rc.add_argument("work_dirs", nargs="+", help="work dirs of runs tuned to their whole budget")
    rc.add_argument("--share", type=float, default=0.02, help="stopping.min_gain_share")
    rc.add_argument("--patience", type=int, default=3, help="stopping.patience")
    rc.add_argument("--confidence", type=float, default=1.0, help="stopping.confidence")
    rc.add_argument("--out", default=results_path("stopping_recorded.json"))
    lv = sub.add_parser("live", help="stopped, full and retune runs, timed side by side")
    lv.add_argument("--model", action="append", default=[], help="an ONNX file, or 'default' (README's)")
    lv.add_argument("--seeds", type=int, nargs="+", default=[0, 1])
    lv.add_argument("--budget", type=float, default=900.0)
    rt = sub.add_parser("retune", help="live's retune and timing again, on the work dirs live left")
    for p in (lv, rt):
        p.add_argument("--config", default=README_CONFIG, help="the runs' config (default: the README job's)")
        p.add_argument("--share", type=float, default=0.02, help="stopping.min_gain_share of the runs")
        p.add_argument("--patience", type=int, default=3, help="stopping.patience")
        p.add_argument("--confidence", type=float, default=1.0, help="stopping.confidence")
        p.add_argument("--rounds", type=int, default=20, help="alternating timing rounds")
        p.add_argument("--work", default="/tmp/dynatune-stopping")
        p.add_argument("--out", default=results_path("stopping_live.json"))
    args = ap.parse_args(argv)
    if args.part == "replay":
        t0 = time.perf_counter()
        rows = replay_rows(args.draws, args.budgets, args.shares, args.patience, args.confidence, args.models)
        write_json(args.out, {"rows": rows, "seconds": time.perf_counter() - t0})
        print(replay_table(rows))
        return rows
    if args.part == "recorded":
        try:
            rows = recorded_rows(args.work_dirs, args.share, args.patience, args.confidence)
        except DynatuneError as e:
            ap.error(str(e))
        write_json(args.out, {"rows": rows})
        return rows
    rule = {"share": args.share, "patience": args.patience, "confidence": args.confidence}
    results = read_json(args.out, [])
    if args.part == "retune":
        write_json(args.out, retune_rows(results, args.work, args.config, args.rounds, rule))
        print(live_table(results))
        return results
    for spec in args.model or ["default"]:
        for seed in args.seeds:
            work = os.path.join(args.work, f"{model_name(spec)}-s{seed}")
            row = live_one(spec, seed, args.budget, args.config, work, args.rounds, rule)
            row["date"] = time.strftime("%Y-%m-%d %H:%M")
            results.append(row)
            write_json(args.out, results)
            print(live_table([row]), flush=True)
    print(live_table(results))
    return results


if __name__ == "__main__":
    main()
