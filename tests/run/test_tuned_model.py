"""The tuned model as an MLflow model (tasks.tuned_model): logged with its own loader module (no pickle)
into a run of a real SQLite store, loaded with pyfunc in a plain Python process (no dynatune), and served
by a real ``mlflow models serve`` on loopback that answers an HTTP request."""

import json
import os
import subprocess
import sys
import urllib.request

import numpy as np
import onnxruntime as ort
import pytest
from servers import free_port, stop_process, wait_for

pytestmark = pytest.mark.slow  # a model is compiled, plain processes load it, a server serves it


@pytest.fixture(scope="module")
def logged(compiled_tiny, tmp_path_factory):
    from mlflow import MlflowClient

    from dynatune.tasks.tuned_model import MODEL_NAME, log_tuned_model

    d = tmp_path_factory.mktemp("tuned-model")
    uri = f"sqlite:///{d / 'mlflow.db'}"
    client = MlflowClient(uri)
    exp = client.create_experiment("dynatune/tiny", artifact_location="file://" + str(d / "artifacts"))
    run_id = client.create_run(exp).info.run_id
    info = log_tuned_model(compiled_tiny["library"], run_id, uri)
    return {"uri": uri, "run_id": run_id, "info": info, "model_uri": f"runs:/{run_id}/{MODEL_NAME}", "dir": d}


def _inputs(seed=5):
    return {"x": np.random.default_rng(seed).standard_normal((1, 3, 16, 16)).astype(np.float32)}


def _reference(compiled_tiny, inputs):
    return ort.InferenceSession(compiled_tiny["onnx"]).run(None, inputs)[0]


def _plain_env(uri):
    drop = ("TVM_", "DYNATUNE_", "OMP_NUM_THREADS", "PYTHONPATH")
    env = {k: v for k, v in os.environ.items() if not k.startswith(drop)} | {"MLFLOW_TRACKING_URI": uri}
    # as in an activated venv: the server's scoring process (uvicorn) is found on the PATH
    return env | {"PATH": os.pathsep.join([os.path.dirname(sys.executable), env.get("PATH", "")])}


def test_the_model_holds_no_pickle_and_pins_what_loading_needs(logged):
    import mlflow

    local = mlflow.artifacts.download_artifacts(
        artifact_uri=logged["model_uri"], dst_path=str(logged["dir"] / "dl"), tracking_uri=logged["uri"]
    )
    files = {os.path.relpath(os.path.join(r, f), local) for r, _, fs in os.walk(local) for f in fs}
    assert not [f for f in files if f.endswith((".pkl", ".pickle", ".cloudpickle"))], files
    assert {
        "data/library/model.so",
        "data/library/model.json",
        "code/dynatune_pyfunc.py",
        "code/dynatune_runtime.py",
        "MLmodel",
    } <= files
    assert "python_model" not in open(os.path.join(local, "MLmodel")).read()  # MLflow's wrapper: not used
    reqs = open(os.path.join(local, "requirements.txt")).read().split()
    names = {r.split("==")[0] for r in reqs}
    assert {"apache-tvm", "apache-tvm-ffi", "numpy", "mlflow"} <= names and all("==" in r for r in reqs)
    model = mlflow.models.Model.load(os.path.join(local, "MLmodel"))
    assert model.signature.inputs.input_names() == ["x"] and model.signature.outputs.input_names() == ["y"]
    assert model.saved_input_example_info is not None


def test_pyfunc_in_a_plain_process_predicts_what_onnxruntime_does(logged, compiled_tiny, tmp_path):
    x = _inputs()
    np.save(tmp_path / "x.npy", x["x"])
    code = f"""
import json, sys, numpy as np, mlflow
model = mlflow.pyfunc.load_model({logged["model_uri"]!r})
x = np.load({str(tmp_path / "x.npy")!r})
y = model.predict({{"x": x}})["y"]
np.save({str(tmp_path / "y.npy")!r}, y)
import tvm
print(json.dumps({{"dynatune": sorted(m for m in sys.modules if m.split(".")[0] == "dynatune"),
                  "threads": tvm.get_global_func("runtime.NumThreads")(),
                  "bare_array_same": bool((model.predict(x)["y"] == y).all())}}))
"""
    out = subprocess.run(
        [sys.executable, "-c", code],
        env=_plain_env(logged["uri"]),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert out.returncode == 0, out.stderr[-2000:]
    got = json.loads(out.stdout.strip().splitlines()[-1])
    assert got["dynatune"] == []  # loaded by the model's own copy of the runtime, not by dynatune
    assert got["threads"] == min(2, os.cpu_count())  # the thread pool it was timed with
    assert got["bare_array_same"]  # a model with one input takes its array bare too
    ref = _reference(compiled_tiny, x)
    assert np.abs(np.load(tmp_path / "y.npy") - ref).max() / np.abs(ref).max() <= 1e-4


def test_mlflow_models_serve_answers_on_loopback(logged, compiled_tiny, tmp_path):
    port = free_port()
    mlflow_cli = os.path.join(os.path.dirname(sys.executable), "mlflow")
    cmd = [mlflow_cli, "models", "serve", "-m", logged["model_uri"], "--env-manager", "local"]
    proc = subprocess.Popen(
        [*cmd, "-h", "127.0.0.1", "-p", str(port)],
        env=_plain_env(logged["uri"]),
        stdout=open(tmp_path / "serve.log", "w"),
        stderr=subprocess.STDOUT,
    )
    try:
        url = f"http://127.0.0.1:{port}"
        wait_for(
            lambda: urllib.request.urlopen(url + "/ping", timeout=2).status == 200, 180, "the server", proc
        )
        x = _inputs(7)
        request = urllib.request.Request(
            url + "/invocations",
            data=json.dumps({"inputs": {"x": x["x"].tolist()}}).encode(),
            headers={"Content-Type": "application/json"},
        )
        with urllib.request.urlopen(request, timeout=60) as resp:
            answer = json.loads(resp.read())
        y = np.asarray(answer["predictions"]["y"], np.float32)
        ref = _reference(compiled_tiny, x)
        assert y.shape == ref.shape and np.abs(y - ref).max() / np.abs(ref).max() <= 1e-4
    finally:
        stop_process(proc)


def test_the_library_is_found_in_a_downloaded_model_of_either_layout(tmp_path):
    from dynatune.tasks.tuned_model import library_in_model

    new, old = tmp_path / "new" / "data" / "library", tmp_path / "old" / "artifacts"  # old: a PythonModel's
    for d in (new, old):
        d.mkdir(parents=True)
        (d / "model.so").write_bytes(b"")
    assert library_in_model(str(tmp_path / "new")) == str(new / "model.so")
    assert library_in_model(str(tmp_path / "old")) == str(old / "model.so")
