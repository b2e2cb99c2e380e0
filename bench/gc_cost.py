"""What CPython's garbage collector costs a `dynatune tune` process, and its exit, per checkout, side by side.

    python bench/gc_cost.py --config CFG --variant before=/tmp/old --variant after=. --rounds 2 \
        --json bench/results/gc_cost.json

Each round runs ``python -m dynatune.cli tune CFG --json`` once per variant (in turn, a fresh work dir each
time), with a probe put in front of the interpreter (a ``sitecustomize`` on ``PYTHONPATH``) that times every
collection of the main process. Reported per run: full (generation 2) collections and their seconds before
the coverage pass starts (imports, extraction, set-up) and after (tuning, compile, report), the younger
generations' seconds, the candidates measured, and the seconds from the summary's line to the process's exit.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import threading
import time

PROBE = """
import atexit, gc, json, os, sys, time
_t0, _start, _log, _young = time.time(), {}, [], [0.0]
def _cb(phase, info):
    g = info["generation"]
    if phase == "start":
        _start[g] = time.perf_counter()
        return
    d = time.perf_counter() - _start.pop(g, time.perf_counter())
    if g == 2:
        _log.append((time.time() - _t0, d))
    else:
        _young[0] += d
def _dump():  # the main process only (sys.argv is set by the time it exits)
    if sys.argv and sys.argv[0].endswith(os.path.join("dynatune", "cli.py")):
        with open(os.environ["GC_COST_OUT"], "w") as f:
            json.dump({"started": _t0, "full": _log, "young_s": _young[0]}, f)
gc.callbacks.append(_cb)
atexit.register(_dump)
"""


def run_once(checkout: str, config: str, work: str, probe_dir: str) -> dict:
    out = os.path.join(work, "gc.json")
    env = dict(os.environ, PYTHONPATH=f"{probe_dir}{os.pathsep}{checkout}", GC_COST_OUT=out)
    env.update(PREFECT_HOME=os.path.join(work, ".prefect"))
    env.pop("PREFECT_API_URL", None)
    cmd = [sys.executable, "-m", "dynatune.cli", "tune", config, "--json", "--set", f"work_dir={work}/run"]
    stamps, lines, t0 = {}, [], time.time()
    p = subprocess.Popen(
        cmd, cwd=checkout, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )

    def read_stdout():  # the summary's line, and when it came (the CLI flushes it)
        for line in p.stdout:
            lines.append(line)
            stamps["summary"] = time.time()

    reader = threading.Thread(target=read_stdout)
    reader.start()
    for line in p.stderr:
        for stage in ("coverage pass...", "tuning...", "compile..."):
            if line.startswith(stage):
                stamps.setdefault(stage, time.time())
    p.wait()
    stamps["exit"] = time.time()
    reader.join()
    summary_line = lines[-1]
    if p.returncode != 0:
        raise SystemExit(f"{checkout}: dynatune tune exited {p.returncode}")
    probe, summary = json.load(open(out)), json.loads(summary_line)
    tuning_from = stamps.get("coverage pass...", stamps.get("tuning...", t0)) - probe["started"]
    full = probe["full"]
    return {
        "candidates": summary["trials"],
        "estimate_ms": summary["estimated_latency_ms"],
        "setup_full": sum(1 for t, _ in full if t < tuning_from),
        "setup_full_s": sum(d for t, d in full if t < tuning_from),
        "run_full": sum(1 for t, _ in full if t >= tuning_from),
        "run_full_s": sum(d for t, d in full if t >= tuning_from),
        "young_s": probe["young_s"],
        "exit_s": stamps["exit"] - stamps["summary"],
        "wall_s": stamps["exit"] - t0,
    }


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--config", required=True)
    ap.add_argument("--variant", action="append", required=True, help="NAME=CHECKOUT")
    ap.add_argument("--rounds", type=int, default=1)
    ap.add_argument("--json")
    args = ap.parse_args(argv)
    variants = [v.split("=", 1) for v in args.variant]
    config = os.path.abspath(args.config)
    rows = []
    with tempfile.TemporaryDirectory(prefix="gc-cost-") as tmp:
        with open(os.path.join(tmp, "sitecustomize.py"), "w") as f:
            f.write(PROBE)
        for r in range(args.rounds):
            for name, checkout in variants:
                work = tempfile.mkdtemp(dir=tmp)
                row = {"variant": name, "round": r} | run_once(os.path.abspath(checkout), config, work, tmp)
                rows.append(row)
                print(json.dumps(row), flush=True)
    head = [
        "variant",
        "round",
        "candidates",
        "setup_full",
        "setup_full_s",
        "run_full",
        "run_full_s",
        "young_s",
        "exit_s",
    ]
    print("| " + " | ".join(head) + " |\n|" + "---|" * len(head))
    for row in rows:
        print(
            "| "
            + " | ".join(f"{row[k]:.2f}" if isinstance(row[k], float) else str(row[k]) for k in head)
            + " |"
        )
    if args.json:
        json.dump(rows, open(args.json, "w"), indent=1)


if __name__ == "__main__":
    main()
