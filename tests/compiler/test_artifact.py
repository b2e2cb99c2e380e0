"""The compiled model as its user gets it: the metadata written beside it at compile time, and the loader
(dynatune.runtime.load) in a plain process: the thread pool it was timed with, one-line input errors, the
same outputs as ONNX Runtime."""

import json
import os
import subprocess
import sys

import numpy as np
import onnxruntime as ort
import pytest

from dynatune.runtime import ArtifactError, load, read_metadata

pytestmark = pytest.mark.slow  # a model is compiled, and plain processes load it


def test_the_metadata_is_written_beside_the_library_and_reads_back(compiled_tiny):
    import tvm

    from dynatune.machine.target import cpu_model_and_isa, usable_cores

    lib, meta_file = compiled_tiny["library"], compiled_tiny["metadata"]
    assert meta_file == os.path.splitext(lib)[0] + ".json" and os.path.dirname(meta_file) == os.path.dirname(
        lib
    )
    meta = read_metadata(lib)
    assert meta == json.load(open(meta_file)) == read_metadata(os.path.dirname(lib))
    assert meta["library"] == "model.so" and meta["device"] == "cpu"
    assert "llvm" in meta["target"] and meta["tvm_version"] == tvm.__version__
    name, isa = cpu_model_and_isa()
    assert meta["cpu"]["name"] == name and meta["cpu"]["isa"] == isa
    assert set(meta["cpu"]["required_features"]) >= {f for f in ("avx2", "fma") if f in isa}
    assert meta["inputs"] == [{"name": "x", "shape": [1, 3, 16, 16], "dtype": "float32"}]
    assert meta["outputs"] == [{"name": "y", "shape": [1, 10], "dtype": "float32"}]
    assert meta["threads"] == {"planned": usable_cores(), "timed": 2}
    assert meta["thread_pool"]["TVM_NUM_THREADS"] == "2"
    m, report = meta["measured"], compiled_tiny["report"]
    assert m["latency_ms"] == pytest.approx(report.latency_ms)
    assert m["ratio_vs_onnxruntime"] == pytest.approx(report.ratio_vs_onnxruntime)
    assert m["ratio_vs_onnxruntime_min"] <= m["ratio_vs_onnxruntime"] <= m["ratio_vs_onnxruntime_max"]
    assert m["latency_min_ms"] <= m["latency_ms"] <= m["latency_max_ms"] and m["rounds"] == 2


def _plain(code: str, env_extra: dict | None = None, drop=("TVM_", "DYNATUNE_", "OMP_NUM_THREADS")) -> dict:
    """Run ``code`` in a plain Python process (no TVM or dynatune setting inherited from the tests) and
    return the JSON it prints last."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(drop)} | (env_extra or {})
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


LOAD_AND_PREDICT = """
import json, os, sys, time
t0 = time.perf_counter()
from dynatune.runtime import load
model = load({lib!r})
load_s = time.perf_counter() - t0
import numpy as np
x = np.random.default_rng(3).standard_normal((1, 3, 16, 16)).astype(np.float32)
y = model.predict({{"x": x}})["y"]
np.save({out!r}, y)
env = {{k: v for k, v in os.environ.items() if k.startswith("TVM_")}}
heavy = sorted({{m.split(".")[0] for m in sys.modules}} & {{"prefect", "mlflow", "onnx", "onnxruntime"}})
print(json.dumps({{"threads": model.threads, "load_s": load_s, "env": env, "heavy": heavy}}))
"""


def test_the_loader_in_a_plain_process_runs_on_the_threads_it_was_timed_with(compiled_tiny, tmp_path):
    lib = compiled_tiny["library"]
    out = str(tmp_path / "y.npy")
    got = _plain(LOAD_AND_PREDICT.format(lib=lib, out=out))
    # left alone, TVM would take one thread on 2 cores (it halves an x86 machine's hardware concurrency)
    assert got["threads"] == min(2, os.cpu_count()) and got["env"]["TVM_NUM_THREADS"] == "2"
    assert got["env"]["TVM_THREAD_POOL_SPIN_COUNT"] == "1000" and got["env"]["TVM_BIND_THREADS"] == "0"
    assert got["load_s"] < 30 and got["heavy"] == []  # neither Prefect nor MLflow nor ONNX is imported
    x = np.random.default_rng(3).standard_normal((1, 3, 16, 16)).astype(np.float32)
    ref = ort.InferenceSession(compiled_tiny["onnx"]).run(None, {"x": x})[0]
    y = np.load(out)
    assert np.abs(y - ref).max() / np.abs(ref).max() < 1e-4
    # a thread count the user set is kept
    assert _plain(LOAD_AND_PREDICT.format(lib=lib, out=out), {"TVM_NUM_THREADS": "1"})["threads"] == 1


def test_wrong_inputs_are_refused_in_one_line(compiled_tiny):
    model = load(compiled_tiny["library"])
    x = np.zeros((1, 3, 16, 16), np.float32)
    cases = [
        ({"input": x}, "unknown input 'input': the model's inputs are x"),
        ({}, "missing input 'x'"),
        ({"x": x.astype(np.float64)}, "input 'x' is float64: the model takes float32"),
        ({"x": np.zeros((1, 3, 8, 8), np.float32)}, "input 'x' has shape 1x3x8x8: the model takes 1x3x16x16"),
        (x, "inputs must be a mapping of input name to array, not ndarray"),
    ]
    for inputs, message in cases:
        with pytest.raises(ArtifactError) as e:
            model.predict(inputs)
        assert str(e.value).startswith(message) and "\n" not in str(e.value), str(e.value)
    assert model.predict({"x": x})["y"].shape == (1, 10)
