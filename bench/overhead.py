"""Share of wall time spent in Prefect and MLflow, against the same tuning driven without them.

    python bench/overhead.py ../shared/models/squeezenet1_1.onnx --budget 600 --slot 20

Runs the same config twice, each in a fresh process on a fresh work dir, timed from outside (imports
and start-up included): (A) the real pipeline as ``dynatune tune`` runs it (Prefect flow in local
ephemeral mode + MLflow on SQLite), (B) the library alone (``dynatune.run.pipeline.run``: the same stages,
no Prefect, no MLflow).
Both tune for the same budget, so the difference in wall time is the orchestration and tracking cost.
Also reports the directly measured MLflow seconds and the per-round Prefect task overhead.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))


def library_only(cfg) -> dict:
    """The same pipeline, from the library alone: no Prefect steps, no MLflow callback."""
    from dynatune.run.callbacks import RunCallback
    from dynatune.run.pipeline import run

    class RoundSeconds(RunCallback):
        seconds = 0.0

        def on_round(self, rec):
            self.seconds += rec.wall_s

    t0 = time.perf_counter()
    rounds = RoundSeconds()
    s = run(cfg, callbacks=[rounds])
    return {
        "inner_wall_s": time.perf_counter() - t0,
        "rounds": s.rounds,
        "round_s": rounds.seconds,
        "elapsed_s": s.elapsed_s,
    }


def child(mode: str, args) -> dict:
    from dynatune.cli import _quiet_env

    _quiet_env()
    from dynatune.run.config import load_config

    cfg = load_config(
        None,
        [f"slot_s={args.slot}", "library.enabled=false", "stopping.enabled=false"],
        model=args.model,
        budget=args.budget,
        work_dir=args.work_dir,
    )
    if mode == "pipeline":  # what `dynatune tune` does
        from dynatune.flows.startup import prestart

        prestart()
        import dynatune.flows.tune_model as ftm

        s = ftm.tune_model(cfg.to_dict())
        return {"rounds": s.rounds, "mlflow_s": s.tracking_s, "elapsed_s": s.elapsed_s}
    return library_only(cfg)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("model")
    ap.add_argument("--budget", type=float, default=600)
    ap.add_argument("--slot", type=float, default=20)
    ap.add_argument("--mode", choices=("pipeline", "library"), help=argparse.SUPPRESS)  # one child run
    ap.add_argument("--work-dir", help=argparse.SUPPRESS)
    ap.add_argument("--out", default=os.path.join(os.path.dirname(__file__), "results", "overhead.json"))
    args = ap.parse_args()
    if args.mode:
        print("RESULT " + json.dumps(child(args.mode, args)), flush=True)
        return
    out = {"budget_s": args.budget, "slot_s": args.slot, "model": os.path.basename(args.model)}
    # each mode in a fresh process, timed from outside: imports and start-up count, nothing is pre-loaded
    for mode in ("pipeline", "library"):
        work = tempfile.mkdtemp(prefix=f"overhead-{mode}-")
        t0 = time.perf_counter()
        p = subprocess.run(
            [
                sys.executable,
                __file__,
                args.model,
                "--budget",
                str(args.budget),
                "--slot",
                str(args.slot),
                "--mode",
                mode,
                "--work-dir",
                work,
            ],
            capture_output=True,
            text=True,
        )
        wall = time.perf_counter() - t0
        line = next((x for x in p.stdout.splitlines() if x.startswith("RESULT ")), None)
        if p.returncode or line is None:
            raise SystemExit(f"{mode} run failed:\n{p.stderr[-3000:]}")
        out[mode] = {"wall_s": wall, **json.loads(line[7:])}
        print(mode, json.dumps(out[mode]), flush=True)
        shutil.rmtree(work, ignore_errors=True)
    a, b = out["pipeline"], out["library"]
    out["overhead_s"] = a["wall_s"] - b["wall_s"]
    out["overhead_share"] = out["overhead_s"] / a["wall_s"]
    # the same, net of tuning seconds: a budget ends inside a slot, so the two runs' tuning time differs
    # by up to a slot (tuning, not orchestration)
    out["overhead_net_s"] = (a["wall_s"] - a["elapsed_s"]) - (b["wall_s"] - b["elapsed_s"])
    out["overhead_net_share"] = out["overhead_net_s"] / a["wall_s"]
    out["mlflow_share"] = a["mlflow_s"] / a["wall_s"]
    with open(args.out, "w") as f:
        json.dump(out, f, indent=1)
    print(json.dumps(out))


if __name__ == "__main__":
    main()
