"""Screenshot of the MLflow UI comparing two tuning runs (docs/mlflow_compare.png).

Starts ``mlflow server`` on loopback for a SQLite store, opens the UI's comparison of two runs in headless
Chromium, and saves the page as a PNG:

    python -m bench.mlflow_screenshot --store sqlite:///runs/x/mlflow.db [--runs RUN1 RUN2] \\
        [--view metric|compare] [--metric estimated_latency_ms] [--out docs/mlflow_compare.png]

Without ``--runs``, the two most recent runs of the store's most recent ``dynatune/...`` experiment are
compared. ``--view metric`` (default) is the UI's metric comparison: one chart with both runs' curves of
``--metric`` over the rounds (step = round; ``--log-y`` for a log scale); ``--view compare`` is the
"Compare runs" page (parameters, metrics, plots). Needs the Debian ``chromium`` package
(``apt-get install -y chromium``).
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import urllib.parse
import urllib.request

from bench.harness import ROOT, parser

CHROMIUM_FLAGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
    "--hide-scrollbars",
    "--disable-dev-shm-usage",
    "--virtual-time-budget=15000",
]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def pick_runs(store: str, runs: list[str] | None) -> tuple[list[str], str]:
    """The runs to compare and their experiment id."""
    from mlflow import MlflowClient

    client = MlflowClient(store)
    if runs:
        exps = {client.get_run(r).info.experiment_id for r in runs}
        if len(exps) != 1:
            raise SystemExit(f"the runs are in {len(exps)} experiments; give runs of one experiment")
        return runs, exps.pop()
    exps = [e for e in client.search_experiments() if e.name.startswith("dynatune/")]
    if not exps:
        raise SystemExit(f"no dynatune/... experiment in {store}")
    exp = max(exps, key=lambda e: e.creation_time or 0)
    found = client.search_runs([exp.experiment_id], order_by=["attributes.start_time DESC"], max_results=2)
    if len(found) < 2:
        raise SystemExit(f"experiment {exp.name} has fewer than two runs")
    return [r.info.run_id for r in reversed(found)], exp.experiment_id


def page_url(base: str, view: str, runs: list[str], exp_id: str, metric: str, log_y: bool = False) -> str:
    q = urllib.parse.quote
    if view == "compare":
        return f"{base}/#/compare-runs?runs={q(json.dumps(runs))}&experiments={q(json.dumps([exp_id]))}"
    params = (
        f"runs={q(json.dumps(runs))}&metric={q(json.dumps(metric))}&experiments={q(json.dumps([exp_id]))}"
        f"&plot_metric_keys={q(json.dumps([metric]))}&plot_layout={q('{}')}&x_axis=step"
        f"&y_axis_scale={'log' if log_y else 'linear'}"
        f"&line_smoothness=1&show_point=true&deselected_curves={q('[]')}&last_linear_y_axis_range={q('[]')}"
    )
    return f"{base}/#/metric?{params}"


def start_mlflow(store: str, port: int, log_path: str) -> subprocess.Popen:
    mlflow = os.path.join(os.path.dirname(sys.executable), "mlflow")
    cmd = [
        mlflow if os.path.exists(mlflow) else "mlflow",
        "server",
        "--backend-store-uri",
        store,
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--workers",
        "1",
    ]
    env = dict(os.environ, MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR="false")
    log = open(log_path, "w")
    proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True)
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise SystemExit(f"mlflow server exited ({proc.returncode}); see {log_path}")
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2) as r:
                if r.status == 200:
                    return proc
        except Exception:
            time.sleep(0.5)
    proc.kill()
    raise SystemExit(f"mlflow server did not answer on port {port}; see {log_path}")


def screenshot(url: str, out: str, size: str = "1600,1000") -> None:
    chromium = shutil.which("chromium") or shutil.which("chromium-browser") or shutil.which("google-chrome")
    if not chromium:
        raise SystemExit("no chromium found: apt-get update && apt-get install -y chromium")
    with tempfile.TemporaryDirectory(prefix="chromium-") as profile:
        cmd = [
            chromium,
            *CHROMIUM_FLAGS,
            f"--user-data-dir={profile}",
            f"--window-size={size}",
            f"--screenshot={os.path.abspath(out)}",
            url,
        ]
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=180)
    if p.returncode != 0 or not os.path.exists(out):
        raise SystemExit(f"chromium failed ({p.returncode}): {p.stderr[-1500:]}")


def main(argv=None) -> dict:
    ap = parser(__doc__)
    ap.add_argument("--store", required=True, help="MLflow backend store, e.g. sqlite:///runs/x/mlflow.db")
    ap.add_argument("--runs", nargs=2, metavar="RUN_ID", help="the two runs (default: the two latest)")
    ap.add_argument("--view", choices=["metric", "compare"], default="metric")
    ap.add_argument("--metric", default="estimated_latency_ms")
    ap.add_argument("--out", default=os.path.join(ROOT, "docs", "mlflow_compare.png"))
    ap.add_argument("--log-y", action="store_true", help="log-scale y axis (default linear)")
    ap.add_argument("--window-size", default="1600,1000")
    args = ap.parse_args(argv)

    runs, exp_id = pick_runs(args.store, args.runs)
    port = free_port()
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    log_path = os.path.join(tempfile.gettempdir(), f"mlflow-server-{port}.log")
    server = start_mlflow(args.store, port, log_path)
    try:
        url = page_url(f"http://127.0.0.1:{port}", args.view, runs, exp_id, args.metric, log_y=args.log_y)
        screenshot(url, args.out, args.window_size)
    finally:
        os.killpg(server.pid, 15)
        try:
            server.wait(timeout=20)
        except subprocess.TimeoutExpired:
            os.killpg(server.pid, 9)
    out = {"out": args.out, "bytes": os.path.getsize(args.out), "runs": runs, "experiment_id": exp_id}
    out["url"] = url
    print(json.dumps(out))
    return out


if __name__ == "__main__":
    main()
