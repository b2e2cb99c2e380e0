"""The roofline's peak: the best float32 GEMM of ONNX Runtime's MLAS and numpy's BLAS, cached per machine
(an entry measured the old, numpy-only way is measured again; one measured on busy cores is measured again
by the next run), and each task's bound on the higher roof of compute and bandwidth."""

import glob
import json
import os
import subprocess
import sys
import time

import numpy as np
import pytest
from helpers import calm_policy

from dynatune.machine import roofline
from dynatune.machine.load import QuietPolicy
from dynatune.machine.roofline import METHOD, Roofline, compulsory_bytes, machine_roofline, mlas_peak
from dynatune.machine.target import usable_cores


def test_the_mlas_peak_is_measured_through_onnxruntime(monkeypatch):
    import onnxruntime as ort

    sessions = []
    real = ort.InferenceSession

    def spy(*args, **kwargs):
        sessions.append(args[1].intra_op_num_threads)
        return real(*args, **kwargs)

    monkeypatch.setattr(ort, "InferenceSession", spy)
    peak = mlas_peak(usable_cores(), seconds=0.2)
    assert peak > 1e8  # FLOP/s: far above any interpreter, whatever the cores' load
    assert sessions == [usable_cores()]


def _fake(monkeypatch, mlas, numpy, bandwidth=2e10):
    def fixed(value):
        def measure(*_args, **_kwargs):
            if isinstance(value, Exception):
                raise value
            return value

        return measure

    monkeypatch.setattr(roofline, "mlas_peak", fixed(mlas))
    monkeypatch.setattr(roofline, "numpy_peak", fixed(numpy))
    monkeypatch.setattr(roofline, "measure_bandwidth", fixed(bandwidth))


@pytest.mark.parametrize("mlas, numpy, best", [(4.8e11, 2e11, 4.8e11), (1e11, 2e11, 2e11)])
def test_the_peak_is_the_higher_of_the_two_libraries(mlas, numpy, best, monkeypatch, tmp_path, cpu_target):
    _fake(monkeypatch, mlas, numpy)
    roof = machine_roofline(cpu_target, cache_dir=str(tmp_path))
    assert roof.peak_flops == best and roof.bandwidth == 2e10
    assert roof.peaks == {"onnxruntime-mlas": mlas, "numpy-blas": numpy} and roof.method == METHOD


def test_a_library_that_fails_leaves_the_other(monkeypatch, tmp_path, cpu_target, caplog):
    _fake(monkeypatch, ImportError("no onnxruntime"), 2e11)
    roof = machine_roofline(cpu_target, cache_dir=str(tmp_path))
    assert roof.peak_flops == 2e11 and roof.peaks == {"numpy-blas": 2e11}
    assert "onnxruntime-mlas" in caplog.text


def test_an_entry_measured_the_old_way_is_measured_again(monkeypatch, tmp_path, cpu_target):
    _fake(monkeypatch, 4.8e11, 2e11)
    machine_roofline(cpu_target, cache_dir=str(tmp_path))
    (path,) = glob.glob(os.path.join(tmp_path, "*.json"))
    old = {"peak_flops": 1.99e11, "bandwidth": 1.5e10, "fingerprint": "fp", "measured": "2026-11-01T00:00:00"}
    with open(path, "w") as f:
        json.dump(old, f)  # what the numpy-only version wrote: no method
    assert Roofline(**old).method == ""  # still readable (a trace document's roofline)
    roof = machine_roofline(cpu_target, cache_dir=str(tmp_path))
    assert roof.peak_flops == 4.8e11 and roof.method == METHOD
    with open(path) as f:
        assert json.load(f)["method"] == METHOD  # the old entry is replaced
    _fake(monkeypatch, RuntimeError("measured twice"), RuntimeError("measured twice"))
    assert machine_roofline(cpu_target, cache_dir=str(tmp_path)) == roof  # a current entry is read


def test_a_real_measurement_keeps_both_peaks(tmp_path, cpu_target):
    roof = machine_roofline(cpu_target, cache_dir=str(tmp_path), quiet=calm_policy())
    assert set(roof.peaks) == {"onnxruntime-mlas", "numpy-blas"} and min(roof.peaks.values()) > 0
    assert roof.peak_flops == max(roof.peaks.values()) and roof.bandwidth > 1e8
    assert machine_roofline(cpu_target, cache_dir=str(tmp_path)) == roof


@pytest.mark.slow  # a busy process beside two real measurements
def test_a_roofline_measured_on_busy_cores_is_measured_again_next_run(monkeypatch, tmp_path, cpu_target):
    """A real measurement beside a busy loop on the same cores: used, cached as under load, measured again
    by the next call, which keeps the best of each figure; an entry measured on quiet cores is final."""
    busy = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    try:
        time.sleep(0.3)  # the loop is running
        loaded = machine_roofline(cpu_target, cache_dir=str(tmp_path))
    finally:
        busy.kill()
        busy.wait()
    assert loaded.under_load and loaded.load["busy_cores"] > QuietPolicy().tolerance_cores
    assert loaded.peak_flops > 0 and loaded.bandwidth > 0
    (path,) = glob.glob(os.path.join(tmp_path, "*.json"))
    with open(path) as f:
        assert json.load(f)["under_load"]
    # the next run measures again (counted quiet here, whatever else shares this machine's cores)
    again = machine_roofline(cpu_target, cache_dir=str(tmp_path), quiet=calm_policy())
    assert not again.under_load and again.load is not None and again.load != loaded.load
    assert again.peak_flops >= loaded.peak_flops and again.bandwidth >= loaded.bandwidth
    assert all(again.peaks[name] >= peak for name, peak in loaded.peaks.items())
    _fake(monkeypatch, RuntimeError("measured twice"), RuntimeError("measured twice"))
    assert machine_roofline(cpu_target, cache_dir=str(tmp_path)) == again  # final: read, not measured


def test_an_entry_measured_under_load_keeps_its_best_figures(monkeypatch, tmp_path, cpu_target):
    """A measurement lower than the entry it replaces (more load the second time) keeps the entry's."""
    _fake(monkeypatch, 4.8e11, 2e11, bandwidth=2e10)
    first = machine_roofline(cpu_target, cache_dir=str(tmp_path))
    (path,) = glob.glob(os.path.join(tmp_path, "*.json"))
    with open(path, "w") as f:
        json.dump(first.as_dict() | {"under_load": True}, f)
    _fake(monkeypatch, 1e11, 2.5e11, bandwidth=1e10)
    roof = machine_roofline(cpu_target, cache_dir=str(tmp_path))
    assert roof.peaks == {"onnxruntime-mlas": 4.8e11, "numpy-blas": 2.5e11}
    assert roof.peak_flops == 4.8e11 and roof.bandwidth == 2e10


def _low_intensity_model(path):
    """A depthwise conv, a max pool and a batch-1 dense (memory-bound), after a dense conv."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(0)

    def w(name, *shape):
        return numpy_helper.from_array(rng.standard_normal(shape).astype(np.float32), name)

    nodes = [
        helper.make_node("Conv", ["x", "w1"], ["c1"], pads=[1, 1, 1, 1]),
        helper.make_node("Conv", ["c1", "dw"], ["c2"], pads=[1, 1, 1, 1], group=64),
        helper.make_node("MaxPool", ["c2"], ["p"], kernel_shape=[2, 2], strides=[2, 2]),
        helper.make_node("Flatten", ["p"], ["f"]),
        helper.make_node("Gemm", ["f", "fc"], ["y"], transB=1),
    ]
    graph = helper.make_graph(
        nodes,
        "low",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 64, 16, 16])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 256])],
        [w("w1", 64, 64, 3, 3), w("dw", 64, 1, 3, 3), w("fc", 256, 64 * 8 * 8)],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.save(model, path)
    return path


def test_low_intensity_tasks_are_bound_by_the_bandwidth_roof(tmp_path, cpu_target):
    from dynatune.model.extract import extract_tasks
    from dynatune.model.importer import load_model

    roof = Roofline(peak_flops=4.8e11, bandwidth=2e10)  # an AVX-512 machine's MLAS peak
    tasks = extract_tasks(load_model(_low_intensity_model(str(tmp_path / "low.onnx"))), cpu_target)
    by_roof = {}
    for t in tasks:
        compute, memory = t.flops / roof.peak_flops, compulsory_bytes(t.mod) / roof.bandwidth
        assert roof.bound_s(t.flops, compulsory_bytes(t.mod)) == max(compute, memory) > 0
        by_roof[t.name] = roof.limit(t.flops, compulsory_bytes(t.mod))
        assert by_roof[t.name] == ("memory" if memory > compute else "compute")
        assert roof.share_of_roof(t.flops, compulsory_bytes(t.mod), 2 * max(compute, memory)) == 0.5
    names = sorted(by_roof)
    depthwise = [n for n in names if "conv2d" in n and by_roof[n] == "memory"]
    assert len(depthwise) == 1 and len([n for n in names if "conv2d" in n and by_roof[n] == "compute"]) == 1
    assert all(by_roof[n] == "memory" for n in names if "pool" in n or "matmul" in n or "dense" in n)
    assert any("pool" in n for n in names) and any("matmul" in n or "dense" in n for n in names)
