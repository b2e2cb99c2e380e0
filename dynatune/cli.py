"""The ``dynatune`` command.

    dynatune tune [CONFIG] [--model PATH] [--shape NAME=1x3x224x224]... [--budget S] [--no-stop]
                  [--scheduler NAME] [--work-dir DIR] [--set key=value]... [--json]
    dynatune tasks MODEL.onnx [--shape ...]... [--target T] [--json]
    dynatune compile WORK_DIR [--json]
    dynatune repair WORK_DIR                     (drop damaged lines, rebuild state; keeps .bak copies)
    dynatune config schema                       (the config's JSON schema, for an editor)
    dynatune report RUN_ID [--tracking-uri URI] [--out DIR]
    dynatune compare RUN_ID... [--tracking-uri URI] [--out PNG]
    dynatune bench replay [--json] | dynatune bench calibration [--json] [--out F] | dynatune bench live ...
    dynatune library show|export|import|prune ...   (see dynatune.library.commands)
    dynatune serve [CONFIG...] [--cron "0 2 * * *"] [--watch NAME]... [--watch-config CONFIG]
                   [--tracking-uri URI] [--every MINUTES] [--dry-run]

Bad input gets one line on stderr (``error: ...``) and exit status 2; nothing already saved is touched.
"""

from __future__ import annotations

import argparse
import gc
import json
import math
import os
import sys
import warnings

from dynatune.errors import DynatuneError
from dynatune.secrets import mask_text


def _quiet_env() -> None:
    os.environ.setdefault("PREFECT_LOGGING_LEVEL", "CRITICAL")  # errors are reported as one line below
    os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
    # Prefect's local API server starts in ~10 s, but a busy 2-core machine can take longer than its
    # default 20 s wait
    os.environ.setdefault("PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS", "180")
    # the ephemeral API server's log goes to our stderr: two runs starting at once on a fresh PREFECT_HOME
    # race on its database migrations, and the loser's server prints a traceback before Prefect restarts it
    os.environ.setdefault("PREFECT_SERVER_LOGGING_LEVEL", "CRITICAL")
    os.environ.setdefault("MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR", "false")
    os.environ.setdefault("MLFLOW_LOGGING_LEVEL", "WARNING")
    os.environ.setdefault("TVM_LOG_DEBUG", "0")
    os.environ.setdefault("GIT_PYTHON_REFRESH", "quiet")
    warnings.filterwarnings("ignore")
    import logging

    # Prefect's queue services log under their class names (e.g. "EventsWorker - Still processing items" when
    # a run stops early): not the one line a user should see
    for name in ("mlflow", "alembic", "prefect", "httpx", "EventsWorker", "APILogWorker"):
        logging.getLogger(name).setLevel(logging.ERROR)


def _shapes(items) -> dict:
    from dynatune.model.importer import parse_shape

    return dict(parse_shape(s) for s in items or [])


def _print_json(obj) -> None:
    def clean(x):
        if isinstance(x, float) and not math.isfinite(x):
            return None
        if isinstance(x, dict):
            return {k: clean(v) for k, v in x.items()}
        if isinstance(x, list):
            return [clean(v) for v in x]
        return x

    sys.stdout.write(json.dumps(clean(obj)) + "\n")
    sys.stdout.flush()


# -- tune ---------------------------------------------------------------------------------------------
def cmd_tune(args) -> int:
    from dynatune.run.config import load_config

    cfg = load_config(
        args.config,
        [*(args.set or []), *(["stopping.enabled=false"] if args.no_stop else [])],
        model=args.model,
        shapes=_shapes(args.shape) or None,
        budget=args.budget,
        scheduler=args.scheduler,
        work_dir=args.work_dir,
    )
    _check_work_dir(cfg.work_dir)
    _preflight(cfg)
    from dynatune.search.reaper import start_reaper

    start_reaper()  # a killed run's helpers (Prefect server, TVM workers) do not outlive it
    if cfg.prefect_api_url:
        os.environ["PREFECT_API_URL"] = cfg.prefect_api_url
    from dynatune.run.progress import LiveView

    view = LiveView(cfg, quiet=False)
    from dynatune.flows.startup import prestart

    prestart()  # TVM's one-off import side by side with Prefect's local API server, before the flow
    import dynatune.flows.tune_model as ftm

    with view:
        summary = ftm.tune_model(cfg.to_dict() | {"_source": cfg.source}, callbacks=[view])
    if args.json:
        _print_json(summary.to_dict())
    else:
        view.print_summary(summary)
    return 0


def _preflight(cfg) -> None:
    """Everything that can be wrong with the input is found before Prefect starts and tuning begins."""
    from dynatune.machine.target import make_target
    from dynatune.model.importer import load_model
    from dynatune.tasks.reachability import check_tracking_uri

    load_model(cfg.model.path, cfg.model.shapes, name=cfg.model.name)
    make_target(cfg.target)
    from dynatune.flows.startup import check_prefect_api

    check_prefect_api(cfg.prefect_api_url or os.environ.get("PREFECT_API_URL"))  # before anything is written
    check_tracking_uri(cfg.tracking.uri)
    from dynatune.run.tuner import check_same_run

    check_same_run(cfg.work_dir, cfg.config_hash())
    from dynatune.run.lock import WorkDirLock

    WorkDirLock(cfg.work_dir).check_free()  # says who holds it, if anyone


def _check_work_dir(path: str) -> None:
    probe = path
    while probe and not os.path.exists(probe):
        probe = os.path.dirname(probe)
    if probe and not os.path.isdir(probe):
        raise DynatuneError(
            f"work directory {path} cannot be created: {probe} is a file, not a directory",
            "choose another --work-dir",
        )
    if probe and not os.access(probe, os.W_OK | os.X_OK):
        raise DynatuneError(f"work directory {path} is not writable", "choose another --work-dir")


# -- tasks --------------------------------------------------------------------------------------------
def cmd_tasks(args) -> int:
    from dynatune.machine.target import make_target
    from dynatune.model.extract import extract_tasks
    from dynatune.model.importer import load_model

    model = load_model(args.model, _shapes(args.shape))
    tasks = extract_tasks(model, make_target(args.target))
    if args.json:
        _print_json([t.as_dict() for t in tasks])
        return 0
    print(
        f"{model.name}: {len(tasks)} tasks ({sum(t.weight for t in tasks)} call sites, "
        f"{sum(t.weight * t.flops for t in tasks) / 1e9:.2f} GFLOP)"
    )
    print(f"{'#':>3}  {'name':<48} {'key':<16} {'weight':>6} {'MFLOP':>10}")
    for t in tasks:
        print(f"{t.index:>3}  {t.name[:48]:<48} {t.key:<16} {t.weight:>6} {t.flops / 1e6:>10.2f}")
    return 0


# -- config -------------------------------------------------------------------------------------------
def cmd_config(args) -> int:
    """``dynatune config schema``: the config's JSON schema, for an editor completing configs/*.yaml."""
    from dynatune.run.config_schema import Config

    sys.stdout.write(json.dumps(Config.model_json_schema(), indent=2) + "\n")
    sys.stdout.flush()
    return 0


# -- compile ------------------------------------------------------------------------------------------
def cmd_compile(args) -> int:
    from dynatune.files import WorkDir
    from dynatune.run.config import saved_config
    from dynatune.run.pipeline import TuningRun

    cfg_path = WorkDir(args.work_dir).config
    if not os.path.exists(cfg_path):
        raise DynatuneError(
            f"{args.work_dir} is not a dynatune work directory (no config.json)",
            "give the work_dir of an earlier `dynatune tune`",
        )
    cfg = saved_config(args.work_dir)  # a damaged file: one line, exit 2
    with TuningRun(cfg) as r:
        rep = r.compile(args.output)
        out = rep.as_dict() | {
            "estimated_latency_ms": r.session.estimated_latency() * 1e3,
            "estimate_excludes": r.session.excluded_tasks(),
        }
    if args.json:
        _print_json(out)
    else:
        for k, v in out.items():
            print(f"{k:>24}: {v}")
    if not rep.numerics_ok:
        raise DynatuneError(f"compiled model does not match ONNX Runtime (max rel err {rep.max_rel_err:.2e})")
    return 0


# -- report / compare ---------------------------------------------------------------------------------
def _tracking_uri(arg: str | None) -> str:
    uri = arg or os.environ.get("MLFLOW_TRACKING_URI")
    if not uri:
        raise DynatuneError(
            "no tracking store given",
            "pass --tracking-uri sqlite:///runs/x/mlflow.db or set MLFLOW_TRACKING_URI",
        )
    return uri


def cmd_report(args) -> int:
    from dynatune.run import report as rp
    from dynatune.tasks.run_reader import read_run

    uri = _tracking_uri(args.tracking_uri)
    data = read_run(uri, args.run_id)
    rounds = [
        {
            "round": r["round"],
            "task": r.get("task"),
            "task_name": data["task_names"].get(int(r["task"]), str(int(r["task"])))
            if r.get("task") is not None
            else "?",
            "result": {"trials": r.get("trials")},
            "estimated_latency_s": (r.get("estimated_latency_ms") or 0) / 1e3,
            "elapsed_s": r.get("elapsed_s"),
        }
        for r in data["rounds"]
        if r.get("elapsed_s") is not None
    ]
    print(rp.rounds_table(rounds))
    out = args.out or f"report-{args.run_id[:8]}"
    os.makedirs(out, exist_ok=True)
    label = data["tags"].get("scheduler", args.run_id[:8])
    untuned = data["metrics"].get("untuned_estimate_ms")
    init = untuned / 1e3 if untuned else None
    png = rp.convergence_plot(
        {label: rp.curve_from_rounds(rounds, init)},
        os.path.join(out, "convergence.png"),
        title=data["tags"].get("model", ""),
    )
    if data["summary"]:
        rp.markdown_report(data["summary"], rounds, os.path.join(out, "report.md"))
    print(f"wrote {png}")
    return 0


def cmd_compare(args) -> int:
    from dynatune.run import report as rp
    from dynatune.run.summary import RunSummary
    from dynatune.tasks.run_reader import read_run

    uri = _tracking_uri(args.tracking_uri)
    curves, summaries = {}, {}
    for rid in args.run_ids:
        data = read_run(uri, rid)
        label = f"{data['tags'].get('scheduler', '?')}:{rid[:8]}"
        untuned = data["metrics"].get("untuned_estimate_ms")
        pts = [(0.0, untuned / 1e3)] if untuned else []
        pts += [
            (r["elapsed_s"], r["estimated_latency_ms"] / 1e3)
            for r in data["rounds"]
            if r.get("estimated_latency_ms") is not None and r.get("elapsed_s") is not None
        ]
        curves[label] = sorted(pts)
        summaries[label] = data["summary"] or RunSummary(
            model=data["tags"].get("model"), scheduler=data["tags"].get("scheduler")
        )
    print(rp.compare_table(summaries))
    out = args.out or "compare.png"
    rp.convergence_plot(curves, out, title="convergence")
    print(f"wrote {out}")
    return 0


# -- repair -------------------------------------------------------------------------------------------
def cmd_repair(args) -> int:
    """Mend a work dir a run refuses as damaged (:mod:`dynatune.run.repair`)."""
    from dynatune.run.repair import repair_work_dir

    done = repair_work_dir(args.work_dir)
    print("\n".join(done) if done else f"{args.work_dir}: nothing damaged, nothing changed")
    return 0


# -- serve --------------------------------------------------------------------------------------------
def cmd_serve(args) -> int:
    """Register the scheduled deployments with Prefect and run their flow runs here (until Ctrl-C)."""
    if not args.configs and not args.watch:
        raise DynatuneError(
            "nothing to serve", "give one or more configs to retune nightly, and/or --watch NAME"
        )
    for path in args.configs:
        if not os.path.isfile(path):
            raise DynatuneError(f"config file {path} not found")
    if args.watch_config and not os.path.isfile(args.watch_config):
        raise DynatuneError(f"config file {args.watch_config} not found")
    if args.every <= 0:
        raise DynatuneError(f"--every must be > 0 minutes, got {args.every:g}")
    from dynatune.flows.serve import build_deployments, serve_deployments

    deps = build_deployments(
        args.configs,
        cron=args.cron,
        timezone=args.timezone,
        watch=args.watch,
        watch_config=args.watch_config,
        tracking_uri=args.tracking_uri,
        every_minutes=args.every,
        work_root=args.work_root,
    )
    for d in deps:
        sched = "; ".join(
            str(getattr(s.schedule, "cron", None) or getattr(s.schedule, "interval", ""))
            for s in (d.schedules or [])
        )
        print(f"deployment {d.flow_name}/{d.name}: {sched}  {d.parameters}", flush=True)
    if args.dry_run:
        return 0
    serve_deployments(deps, limit=args.limit)
    return 0


# -- bench --------------------------------------------------------------------------------------------
def cmd_bench(args) -> int:
    if args.bench == "replay":
        from dynatune.bench.replay_bench import run_replay_benchmark, summary_lines

        res = run_replay_benchmark(
            models=args.models or None, budgets=args.budgets, rtols=args.rtol, draws=args.draws
        )
        if args.json:
            _print_json(res)
        else:
            print("\n".join(summary_lines(res)))
        return 0
    if args.bench == "calibration":
        from dynatune.bench.belief_calibration import calibrate_recorded, calibration_lines
        from dynatune.files import atomic_write_json

        res = calibrate_recorded(args.models or None)
        if args.out:
            atomic_write_json(args.out, res)
        if args.json:
            _print_json(res)
        else:
            print("\n".join(calibration_lines(res)))
        return 0
    if args.bench == "live":
        from dynatune.bench.livebench import main as live_main

        return live_main(args.rest)
    raise DynatuneError(f"unknown benchmark {args.bench!r}", "use replay, calibration or live")


def build_parser() -> argparse.ArgumentParser:
    from dynatune import __version__

    p = argparse.ArgumentParser(
        prog="dynatune",
        description="Tune an ONNX model for this machine "
        "(DynaTune scheduling, AdaTune measurement, Apache TVM).",
    )
    p.add_argument("--version", action="version", version=f"dynatune {__version__}")
    sub = p.add_subparsers(dest="cmd", required=True)

    t = sub.add_parser("tune", help="tune a model end to end (Prefect flow, MLflow tracking)")
    t.add_argument("config", nargs="?", help="YAML config (defaults apply without one)")
    t.add_argument("--model", help="ONNX file (overrides model.path)")
    t.add_argument("--shape", action="append", help="NAME=1x3x224x224 (repeatable)")
    t.add_argument("--budget", type=float, help="tuning budget in seconds: a cap, see --no-stop")
    t.add_argument(
        "--no-stop",
        action="store_true",
        help="spend the whole budget (by default a run stops when its beliefs say the model cannot get "
        "meaningfully faster: stopping.*)",
    )
    t.add_argument("--scheduler", help="dynatune, gradient, round_robin, random or greedy")
    t.add_argument("--work-dir", help="where records, state and artifacts go")
    t.add_argument("--set", action="append", metavar="KEY=VALUE", help="override any config key")
    t.add_argument("--json", action="store_true", help="print one JSON object on stdout")
    t.set_defaults(func=cmd_tune)

    k = sub.add_parser("tasks", help="list a model's tuning tasks")
    k.add_argument("model")
    k.add_argument("--shape", action="append")
    k.add_argument("--target", default=None)
    k.add_argument("--json", action="store_true")
    k.set_defaults(func=cmd_tasks)

    g = sub.add_parser("config", help="about the run config: `config schema` prints its JSON schema")
    g.add_argument("action", choices=["schema"], help="schema: the JSON schema of the YAML config (stdout)")
    g.set_defaults(func=cmd_config)

    c = sub.add_parser("compile", help="compile + verify from an existing work dir")
    c.add_argument("work_dir")
    c.add_argument("--output", help="path of the shared library (default WORK_DIR/model.so)")
    c.add_argument("--json", action="store_true")
    c.set_defaults(func=cmd_compile)

    rp = sub.add_parser(
        "repair", help="mend a damaged work dir: drop damaged lines, rebuild state (keeps .bak copies)"
    )
    rp.add_argument("work_dir")
    rp.set_defaults(func=cmd_repair)

    r = sub.add_parser("report", help="print a run's rounds and write its plots")
    r.add_argument("run_id")
    r.add_argument("--tracking-uri")
    r.add_argument("--out")
    r.set_defaults(func=cmd_report)

    m = sub.add_parser("compare", help="compare runs: a table and one convergence plot")
    m.add_argument("run_ids", nargs="+")
    m.add_argument("--tracking-uri")
    m.add_argument("--out")
    m.set_defaults(func=cmd_compare)

    v = sub.add_parser(
        "serve", help="serve the scheduled deployments here: nightly retunes, registry watcher"
    )
    v.add_argument("configs", nargs="*", help="configs to retune nightly (one deployment each)")
    v.add_argument("--cron", default="0 2 * * *", help="schedule of the nightly retunes (default: 0 2 * * *)")
    v.add_argument("--timezone", default="UTC", help="time zone of --cron (default UTC)")
    v.add_argument(
        "--watch",
        action="append",
        metavar="NAME",
        help="registered model (MLflow Model Registry) to tune on every new version; repeatable",
    )
    v.add_argument("--watch-config", help="config for the registry-triggered runs (budget, search, ...)")
    v.add_argument("--tracking-uri", help="the registry's store (default $MLFLOW_TRACKING_URI)")
    v.add_argument("--every", type=float, default=10.0, help="minutes between registry checks (default 10)")
    v.add_argument("--work-root", default="runs/registry", help="work dirs of registry-triggered runs")
    v.add_argument(
        "--limit", type=int, default=1, help="flow runs at once (default 1: one tuning per machine)"
    )
    v.add_argument("--dry-run", action="store_true", help="print the deployments and exit")
    v.set_defaults(func=cmd_serve)

    b = sub.add_parser(
        "bench", help="benchmarks: replay and calibration (recorded traces) or live (real tuning)"
    )
    bench = b.add_subparsers(dest="bench", required=True, metavar="{replay,calibration,live}")
    br = bench.add_parser("replay", help="the schedulers replayed on recorded tuning traces")
    br.add_argument("--json", action="store_true", help="one JSON object on stdout")
    br.add_argument("--models", nargs="*", help="recorded models to replay (default: all)")
    br.add_argument(
        "--rtol",
        type=float,
        nargs="+",
        default=[0.0, 0.02],
        help="quality-target tolerances: reach gradient's final objective x (1 + rtol) (default 0 0.02)",
    )
    br.add_argument(
        "--draws", type=int, default=20, help="draws of one trace per task, per model (default 20)"
    )
    br.add_argument(
        "--budgets",
        type=float,
        nargs="+",
        default=[0.25, 0.5, 1.0],
        help="budgets as fractions of the recorded time (default 0.25 0.5 1)",
    )
    br.set_defaults(func=cmd_bench)
    bc = bench.add_parser("calibration", help="how well each belief model predicts a slot's gain (traces)")
    bc.add_argument("--json", action="store_true", help="one JSON object on stdout")
    bc.add_argument("--models", nargs="*", help="recorded models to score (default: all)")
    bc.add_argument("--out", help="also write the scores here (JSON)")
    bc.set_defaults(func=cmd_bench)
    bench.add_parser("live", help="the schedulers tuning live, same budget (`dynatune bench live --help`)")

    from dynatune.library.commands import add_parser as add_library_parser

    add_library_parser(sub)
    return p


def main(argv=None) -> int:
    _quiet_env()
    argv = sys.argv[1:] if argv is None else list(argv)
    if argv[:2] == ["bench", "live"]:  # its own parser: every option after `live` is the live bench's
        args = argparse.Namespace(func=cmd_bench, bench="live", rest=argv[2:])
    else:
        args = build_parser().parse_args(argv)
    try:
        return args.func(args) or 0
    except DynatuneError as exc:
        print(f"error: {mask_text(exc.one_line())}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(
            "error: interrupted (every committed record is kept; run the same command to resume)",
            file=sys.stderr,
        )
        return 130
    except Exception as exc:
        if os.environ.get("DYNATUNE_DEBUG"):
            raise
        msg = str(exc).strip().splitlines()
        print(
            f"error: {type(exc).__name__}: {mask_text(msg[-1]) if msg else ''} (set DYNATUNE_DEBUG=1 for the "
            "traceback)",
            file=sys.stderr,
        )
        return 1


def entry() -> int:
    """The ``dynatune`` command: :func:`main`, in a process that then exits without the interpreter's last
    garbage collection. Once TVM, Prefect and MLflow are imported, that collection walks 450-700
    thousand objects: 2.0-3.4 s of each ``dynatune tune``'s exit, with nothing left to free that the
    operating system would not (``gc.freeze``; atexit hooks still run, files are still closed;
    BENCHMARKS.md, session 30)."""
    code = main()
    gc.freeze()
    return code


if __name__ == "__main__":
    sys.exit(entry())
