"""Cost-model files cannot run code: a planted pickle (or TVM's own format, which unpickles) is refused,
nothing in it runs, and the session starts its cost model afresh and relearns the records."""

import io
import json
import logging
import os
import tarfile

import numpy as np
import pytest
from helpers import PlantedPayload, make_tiny_onnx, plant_pickle

from dynatune.search.costmodel import load_cost_model, make_cost_model
from dynatune.search.model_file import RefusedModelFile


def _plant_tvm_tar(path, marker) -> None:
    """TVM's XGBModel.save format: a tar with data.npy, an object array (it loads with allow_pickle=True)."""
    buf = io.BytesIO()
    arr = np.empty(1, dtype=object)
    arr[0] = PlantedPayload(str(marker))
    np.save(buf, arr, allow_pickle=True)
    with tarfile.open(path, "w") as tar:
        info = tarfile.TarInfo("data.npy")
        info.size = len(buf.getvalue())
        tar.addfile(info, io.BytesIO(buf.getvalue()))


@pytest.mark.parametrize("kind", ["xgb", "ensemble"])
@pytest.mark.parametrize("plant", [plant_pickle, _plant_tvm_tar])
def test_a_planted_file_is_refused_and_runs_nothing(kind, plant, tmp_path):
    path, marker = tmp_path / "cost_model", tmp_path / "marker"
    plant(path, marker)
    with pytest.raises(RefusedModelFile, match="not loaded"):
        load_cost_model(make_cost_model(kind), str(path))
    assert not marker.exists()


def test_a_file_of_another_kind_or_damaged_is_refused(tmp_path):
    path = str(tmp_path / "cost_model")
    model = make_cost_model("xgb")
    _fill_xgb(model)
    model.save(path)
    with pytest.raises(RefusedModelFile, match="not a saved 'ensemble' cost model"):
        load_cost_model(make_cost_model("ensemble"), path)
    data = open(path, "rb").read()
    open(path, "wb").write(data[: len(data) // 2])
    with pytest.raises(RefusedModelFile):
        load_cost_model(make_cost_model("xgb"), path)


def _fill_xgb(model, n=24, seed=0):
    from tvm.s_tir.meta_schedule.cost_model.xgb_model import FeatureGroup

    rng = np.random.default_rng(seed)
    feats = [rng.random((int(rng.integers(1, 4)), 164)).astype(np.float32) for _ in range(n)]
    costs = (rng.random(n) + 0.1).astype(np.float32)
    model.data["g0"] = FeatureGroup("g0", feats, costs)
    model.data_size = n
    model._train(xs=feats, ys=costs.min() / costs)
    return feats


def test_xgb_model_round_trips_without_objects(tmp_path):
    path = str(tmp_path / "cost_model")
    model = make_cost_model("xgb")
    feats = _fill_xgb(model)
    model.save(path)
    with np.load(path, allow_pickle=False) as z:  # plain arrays only: loads without unpickling
        assert all(z[k].dtype != object for k in z.files)
        assert json.loads(z["header"].tobytes())["kind"] == "xgb"
    other = make_cost_model("xgb")
    other.load(path)
    assert other.data_size == model.data_size and list(other.data) == ["g0"]
    np.testing.assert_array_equal(other._predict(feats), model._predict(feats))


@pytest.mark.slow
def test_session_refuses_a_planted_cost_model_and_relearns_the_records(cpu_target, tmp_path, caplog):
    from tvm.s_tir import meta_schedule as ms
    from tvm.s_tir.meta_schedule.arg_info import ArgInfo

    from dynatune.files import WorkDir
    from dynatune.model.extract import extract_tasks
    from dynatune.model.importer import load_model
    from dynatune.search.session import TuningSession

    model = load_model(make_tiny_onnx(str(tmp_path / "tiny.onnx"), batch=1))
    tasks = extract_tasks(model, cpu_target)[:1]
    work = str(tmp_path / "work")
    first = TuningSession(tasks, cpu_target, work)
    t = tasks[0]
    ctx = ms.TuneContext(mod=t.mod, target=cpu_target, space_generator="post-order-apply")
    wl = first.db.workload(t.key, t.mod)
    for i, sch in enumerate(ctx.generate_design_space()):
        args = ArgInfo.from_prim_func(t.mod["main"])
        rec = ms.database.TuningRecord(sch.trace, wl, [1e-3 * (i + 1)], cpu_target, args)
        first.db.commit(t.key, rec)
    first.close()
    marker = tmp_path / "marker"
    plant_pickle(WorkDir(work).cost_model, marker)
    with caplog.at_level(logging.WARNING):
        session = TuningSession(tasks, cpu_target, work)
    try:
        assert not marker.exists()
        warned = [r.getMessage() for r in caplog.records if "cost_model" in r.getMessage()]
        assert len(warned) == 1 and "not loaded" in warned[0] and "starts afresh" in warned[0], warned
        assert session.cost_model.data_size == 0
        session._context(0)  # the first slot of the task: the fresh model learns its records
        assert session.cost_model.data_size == session.db.num_records(t.key) > 0
        session.save_state()
        assert open(WorkDir(work).cost_model, "rb").read(4) == b"PK\x03\x04"  # saved in the new format
    finally:
        session.close()
    assert os.path.exists(WorkDir(work).cost_model)


@pytest.mark.slow
def test_dynatune_compile_on_a_work_dir_with_a_planted_cost_model_runs_nothing(tmp_path):
    import subprocess
    import sys

    from helpers import ROOT

    from dynatune.files import WorkDir
    from dynatune.run.config import load_config

    model = make_tiny_onnx(str(tmp_path / "tiny.onnx"), batch=1)
    cfg_yaml = tmp_path / "cfg.yaml"
    cfg_yaml.write_text(
        f"model: {{path: {model}}}\nbudget_s: 2\nslot_s: 1\nwork_dir: {tmp_path / 'work'}\n"
        "compile: {measure_untuned: false, measure_onnxruntime: false, profile: false}\n"
    )
    cfg = load_config(str(cfg_yaml))
    wd = WorkDir(cfg.work_dir)
    os.makedirs(wd.path)
    with open(wd.config, "w") as f:
        json.dump(cfg.to_record(), f)
    marker = tmp_path / "marker"
    plant_pickle(wd.cost_model, marker)
    env = dict(os.environ, PYTHONPATH=ROOT)
    p = subprocess.run(
        [sys.executable, "-m", "dynatune.cli", "compile", wd.path, "--json"],
        capture_output=True,
        text=True,
        env=env,
        cwd=str(tmp_path),
        timeout=600,
    )
    assert p.returncode == 0, p.stderr[-2000:]
    assert not marker.exists()
    warned = [line for line in p.stderr.splitlines() if "cost_model" in line]
    assert len(warned) == 1 and "not loaded" in warned[0] and "starts afresh" in warned[0], p.stderr
    assert json.loads(p.stdout.splitlines()[-1])["numerics_ok"] is True
