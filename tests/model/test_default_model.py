"""The built-in default model has random weights, so its output depends on its input."""

import os

import numpy as np
import onnx
import onnxruntime as ort

from dynatune.model.default_model import NAME, default_model_path
from dynatune.run.config import load_config


def test_default_model_output_depends_on_the_input(tmp_path, monkeypatch):
    monkeypatch.setenv("DYNATUNE_CACHE_DIR", str(tmp_path / "cache"))
    path = default_model_path()
    assert path.startswith(str(tmp_path / "cache")) and os.path.basename(path) == NAME + ".onnx"
    assert [n for n in os.listdir(os.path.dirname(path))] == [NAME + ".onnx"]  # no temporary file left
    m = onnx.load(path)
    assert not any(n.op_type == "ConstantOfShape" for n in m.graph.node)  # every weight is an initializer
    sess = ort.InferenceSession(path, providers=["CPUExecutionProvider"])
    (x,) = sess.get_inputs()
    inputs = [np.random.default_rng(s).standard_normal(x.shape).astype(np.float32) for s in range(3)]
    ys = [sess.run(None, {x.name: data})[0].ravel() for data in inputs]
    for y in ys:
        assert np.all(np.isfinite(y)) and abs(float(y.sum()) - 1.0) < 1e-4  # a softmax: nothing exploded
        assert y.max() < 10 * y.min()  # ... and no class takes it all: the logits did not blow up
    for a, b in [(0, 1), (0, 2), (1, 2)]:
        rel = float(np.max(np.abs(ys[a] - ys[b])) / np.max(np.abs(ys[a])))
        assert rel > 0.1, rel  # the constant-weight light squeezenet gives 0.0 here
        assert np.corrcoef(ys[a], ys[b])[0, 1] < 0.95


def test_default_model_is_made_once_and_the_same_each_time(tmp_path, monkeypatch):
    monkeypatch.setenv("DYNATUNE_CACHE_DIR", str(tmp_path / "a"))
    first = default_model_path()
    mtime = os.stat(first).st_mtime_ns
    assert default_model_path() == first and os.stat(first).st_mtime_ns == mtime  # cached, not rewritten
    monkeypatch.setenv("DYNATUNE_CACHE_DIR", str(tmp_path / "b"))
    second = default_model_path()
    with open(first, "rb") as f, open(second, "rb") as g:
        assert f.read() == g.read()  # seeded: the same weights
    cfg = load_config(None)
    assert cfg.model.path == second and cfg.model.name == "squeezenet1.1-random-weights"
