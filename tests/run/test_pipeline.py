"""End to end: the real Prefect flow (local ephemeral mode), MLflow on SQLite, real TVM tuning."""

import json
import os
import subprocess
import sys

import numpy as np
import pytest
from helpers import ROOT, prefect_home, run_cli

pytestmark = pytest.mark.slow  # real tuning, servers or subprocesses


def _run(args, cwd, timeout=900):
    return run_cli(args, cwd, timeout)


@pytest.fixture
def first_run(tiny_run):
    """The session's finished run of the tiny model (conftest's ``tiny_run``)."""
    return tiny_run["dir"], tiny_run["config"], tiny_run["summary"], tiny_run["stderr"]


def test_flow_tracks_every_round_in_mlflow(first_run):
    from mlflow import MlflowClient

    d, _, s, stderr = first_run
    for k in (
        "model",
        "scheduler",
        "tasks",
        "rounds",
        "trials",
        "budget_s",
        "wall_s",
        "estimated_latency_ms",
        "latency_ms",
        "untuned_latency_ms",
        "onnxruntime_latency_ms",
        "max_rel_err",
        "artifact",
        "mlflow_run_id",
        "work_dir",
    ):
        assert k in s, k
    assert s["rounds"] >= 2 and s["trials"] >= 8
    # why tuning ended (stopping on, the default): a budget this small is spent, or the beliefs stopped it
    assert s["stop_reason"].startswith("stopped at" if s["stopped_early"] else "tuned for the whole budget")
    assert s["tuning_s_used"] == s["elapsed_s"] and s["stop_check"] is not None
    assert s["estimated_latency_ms"] <= s["initial_estimated_latency_ms"]
    # summary.json: written once, after the callbacks (so with MLflow's part), with RunSummary's keys in order
    from dynatune.files import WorkDir
    from dynatune.run.summary import RunSummary

    on_disk = json.load(open(WorkDir(d / "work").summary))
    assert list(on_disk) == [k for k in RunSummary.model_fields if k in on_disk] == list(s)
    assert {"mlflow_run_id", "mlflow_ui", "tracking_s"} <= set(on_disk)  # (profile...: test_vs_onnxruntime)
    assert RunSummary.load(WorkDir(d / "work").summary).mlflow_run_id == s["mlflow_run_id"]
    assert s["numerics_ok"] and s["max_rel_err"] < 1e-4
    anchors = json.load(open(WorkDir(d / "work").anchors))  # the beliefs' reachable floors
    assert anchors and all(v > 0 for v in anchors.values())
    assert "round" in stderr  # the live view printed the rounds
    client = MlflowClient(f"sqlite:///{d / 'work' / 'mlflow.db'}")
    run = client.get_run(s["mlflow_run_id"])
    assert run.data.tags["scheduler"] == "dynatune" and run.data.tags["model"] == "tiny"
    assert run.data.tags["purpose"] == "test" and "model_sha256" in run.data.tags
    assert run.data.tags["stop_reason"] == s["stop_reason"]
    assert run.data.params["budget_s"] == "6.0"
    hist = client.get_metric_history(run.info.run_id, "estimated_latency_ms")
    steps = sorted(m.step for m in hist)
    assert steps[0] == 0 and len(set(steps)) >= s["rounds"]
    for key in (
        "task",
        "belief_mean_ms",
        "belief_std_ms",
        "ucb_score",
        "trials",
        "measurements_saved",
        "round_wall_s",
    ):
        assert len(client.get_metric_history(run.info.run_id, key)) == s["rounds"], key
    arts = {a.path for a in client.list_artifacts(run.info.run_id)}
    assert {"beliefs", "report", "tuning_db", "config.json", "summary.json", "tasks.json"} <= arts
    # the tuned model is the run's MLflow model (tests/run/test_tuned_model.py loads and serves one)
    assert s["tuned_model_uri"] == f"runs:/{run.info.run_id}/tuned_model"
    assert [m.model_id for m in client.search_logged_models([run.info.experiment_id])] == [
        s["tuned_model_id"]
    ]
    beliefs = [a.path for a in client.list_artifacts(run.info.run_id, "beliefs")]
    assert len(beliefs) == s["rounds"]
    report = {os.path.basename(a.path) for a in client.list_artifacts(run.info.run_id, "report")}
    assert {"convergence.png", "beliefs.png", "report.md"} <= report
    assert run.info.status == "FINISHED"


def test_compiled_library_loads_and_matches_onnxruntime(first_run):
    import onnxruntime as ort
    import tvm
    from tvm import relax

    from dynatune.model.importer import ModelInput, runtime_proto

    d, _, s, _ = first_run
    vm = relax.VirtualMachine(tvm.runtime.load_module(s["artifact"]), tvm.cpu())
    x = np.random.default_rng(3).standard_normal((1, 3, 16, 16)).astype("float32")
    y = vm["main"](tvm.runtime.tensor(x)).numpy()
    proto = runtime_proto(
        str(d / "tiny.onnx"), [ModelInput("x", (1, 3, 16, 16), "float32")]
    )  # at the tuned shape
    ref = ort.InferenceSession(proto.SerializeToString()).run(None, {"x": x})[0]
    assert np.max(np.abs(y - ref)) / np.max(np.abs(ref)) < 1e-4
    # its metadata beside it, with the timing the run reported
    from dynatune.runtime import read_metadata

    meta = read_metadata(s["artifact"])
    assert s["artifact_metadata"] == os.path.splitext(s["artifact"])[0] + ".json"
    assert meta["inputs"] == [{"name": "x", "shape": [1, 3, 16, 16], "dtype": "float32"}]
    assert meta["measured"]["latency_ms"] == pytest.approx(s["latency_ms"])
    assert meta["measured"]["ratio_vs_onnxruntime"] == pytest.approx(s["ratio_vs_onnxruntime"])
    assert meta["threads"]["timed"] == s["threads"] and s["threads"] >= 1
    # its kernels were chosen among each task's best few timed cold (compile.cold_choice, on by default)
    cold = json.load(open(d / "work" / "report" / "cold_choice.json"))
    assert cold["cold_protocol"]["passes"] >= 1
    assert all(len(t["cold_s"]) >= 2 and 0 <= t["chosen"] < len(t["cold_s"]) for t in cold["tasks"])


def test_rerun_continues_rounds(first_run):
    d, cfg, s, _ = first_run
    rounds_before = [json.loads(x) for x in open(d / "work" / "rounds.jsonl")]
    # budget left: 4 s (a round); no compile after it: this test looks at the rounds and the MLflow run
    args = ["--budget", str(s["elapsed_s"] + 4), "--set", "compile.verify=false"]
    p = _run(["tune", str(cfg), "--json", *args], str(d))
    assert p.returncode == 0, p.stderr[-3000:]
    s2 = json.loads(p.stdout.strip().splitlines()[-1])
    rounds_after = [json.loads(x) for x in open(d / "work" / "rounds.jsonl")]
    assert s2["mlflow_run_id"] == s["mlflow_run_id"]  # the MLflow run is continued
    assert rounds_after[: len(rounds_before)] == rounds_before  # finished rounds are not repeated
    assert len(rounds_after) > len(rounds_before)
    assert [r["round"] for r in rounds_after] == list(range(len(rounds_after)))
    assert s2["estimated_latency_ms"] <= s["estimated_latency_ms"] + 1e-9
    assert "resuming" in p.stderr


def test_prestart_hands_its_early_server_to_prefect(tmp_path):
    """`dynatune tune` starts Prefect's ephemeral server while TVM imports; the flow then uses that one."""
    code = (
        "from dynatune.flows.startup import prestart\n"
        "prestart()\n"
        "import subprocess\n"
        "from prefect import flow\n"
        "from prefect.server.api.server import SubprocessASGIServer\n"
        "s = SubprocessASGIServer()\n"
        "assert s.running and isinstance(s.server_process, subprocess.Popen), 'not handed over'\n"
        "pid = s.server_process.pid\n"
        "@flow\n"
        "def f():\n"
        "    return 41 + 1\n"
        "assert f() == 42\n"
        "assert SubprocessASGIServer().server_process.pid == pid, 'Prefect started a second server'\n"
        "print('OK', s.port)\n"
    )
    env = {k: v for k, v in os.environ.items() if k != "PREFECT_API_URL"}
    env.update(
        PYTHONPATH=ROOT,
        PREFECT_HOME=prefect_home(tmp_path / "prefect"),
        PREFECT_SERVER_ANALYTICS_ENABLED="false",
        PREFECT_LOGGING_LEVEL="CRITICAL",
    )
    p = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300)
    assert p.returncode == 0 and "OK" in p.stdout, p.stderr[-2000:]
