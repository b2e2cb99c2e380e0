"""The MLflow side of a run, on a real SQLite store: a run is named after what ran, the final measurement
is logged as ``measured_*`` at the last step (whatever the budget), a timing taken under load is tagged,
``dynatune report`` names tasks, and a work dir copied with ``cp -a`` and resumed goes on in a new
MLflow run linked to the old one, never writing into the original's artifacts."""

import datetime
import json
import os
import shutil
import subprocess

import pytest

from dynatune.files import WorkDir
from dynatune.run.callbacks import RunStart
from dynatune.run.summary import RunSummary
from dynatune.run.tuner import RoundRecord

pytestmark = pytest.mark.slow  # three MLflow stores (~15 s)

ROUNDS = 3


@pytest.fixture(autouse=True)
def _no_tracking_uri_from_other_tests(monkeypatch):
    """These runs track into their work dir's own store: a tracking URI another test left in the
    environment (MLflow's ``set_tracking_uri`` exports ``MLFLOW_TRACKING_URI``) must not redirect them."""
    import mlflow.tracking._tracking_service.utils as tracking_utils

    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    monkeypatch.setattr(tracking_utils, "_tracking_uri", None)  # set in-process by an earlier run


def _round(n: int) -> RoundRecord:
    result = {"trials": 4, "build_errors": 0, "run_errors": 0, "best_after_s": 1e-3}
    return RoundRecord(n, 0, "conv_a", result, {}, 0.01, elapsed_s=n, decision_s=0, wall_s=1)


def _track_a_run(tiny_onnx, work_dir, state: dict, marker: str, compiled) -> tuple:
    """What a run of the pipeline tells its MLflow callback, up to the end; returns (callback, summary).
    Its compiled model is ``compiled``'s (the ``compiled_tiny`` fixture), its metadata marked ``marker``."""
    from dynatune.run.config import load_config
    from dynatune.run.pipeline import load_model
    from dynatune.tasks.tracking import MlflowCallback

    cfg = load_config(None, model=tiny_onnx, work_dir=str(work_dir), shapes={"x": (1, 3, 16, 16)})
    wd = WorkDir(str(work_dir))
    os.makedirs(wd.report_dir, exist_ok=True)
    with open(wd.tasks, "w") as f:
        json.dump([{"index": 0, "name": "conv_a"}], f)
    shutil.copyfile(compiled["library"], wd.model_so)
    with open(compiled["metadata"]) as f:
        meta = json.load(f) | {"marker": marker}
    with open(os.path.splitext(wd.model_so)[0] + ".json", "w") as f:
        json.dump(meta, f)
    model = load_model(cfg)
    cb = MlflowCallback()
    cb.on_start(RunStart(cfg, model, [], state, 0.02, 0, 0.0))
    for n in range(ROUNDS):
        cb.on_round(_round(n))
    summary = RunSummary(
        model=model.name,
        scheduler=cfg.scheduler.name,
        rounds=ROUNDS,
        work_dir=str(work_dir),
        artifact=wd.model_so,
        latency_ms=1.5,
        onnxruntime_latency_ms=2.0,
        ratio_vs_onnxruntime=0.75,
        ratio_vs_onnxruntime_min=0.7,
        ratio_vs_onnxruntime_max=0.8,
        timing_under_load=True,
        timing_load_cores=1.02,
        timing_attempts=3,
        numerics_ok=True,
        profile={
            "model_ms": 2.1,
            "estimate_ms": 1.5,
            "attempts": 3,
            "fastest_model_ms": 1.4,
            "slow_spell": True,
        },
    )
    cb.on_finish(summary, wd.report_dir)
    with open(wd.run_state, "w") as f:  # what the pipeline keeps of the callback's state (run.json)
        json.dump(state, f)
    return cb, summary


def _files(root) -> dict:
    out = {}
    for d, _, names in os.walk(root):
        for n in names:
            p = os.path.join(d, n)
            with open(p, "rb") as f:
                out[os.path.relpath(p, root)] = f.read()
    return out


def test_run_name_final_measurement_load_tag_and_task_names(tiny_onnx, tmp_path, capsys, compiled_tiny):
    from mlflow import MlflowClient

    from dynatune.cli import main

    work = tmp_path / "work"
    cb, summary = _track_a_run(tiny_onnx, work, {}, "model", compiled_tiny)
    uri = "sqlite:///" + WorkDir(str(work)).mlflow_db
    client = MlflowClient(uri)
    run = client.get_run(cb.tracker.run_id)
    today = datetime.datetime.now().strftime("%Y-%m-%d")
    name = run.info.run_name
    assert name.startswith("tiny ") and today in name and name.endswith(" dynatune")  # what ran, when
    for key, value in [("measured_latency_ms", 1.5), ("measured_ratio_vs_onnxruntime", 0.75)]:
        history = client.get_metric_history(run.info.run_id, key)
        assert [(m.step, m.value) for m in history] == [(ROUNDS, value)]  # at the last step
    assert run.data.tags["timing_under_load"] == "1.02 cores busy"
    # a profile taken in a slow spell (dynatune.compiler.profile) is tagged, with the time it was held against
    assert run.data.tags["profile_slow_spell"] == "the model over its 1.400 ms in the final timing"
    capsys.readouterr()
    assert main(["report", run.info.run_id, "--tracking-uri", uri, "--out", str(tmp_path / "rep")]) == 0
    table = capsys.readouterr().out
    assert table.count("conv_a") == ROUNDS  # the task by name, not by index
    report = (tmp_path / "rep" / "report.md").read_text()
    assert "taken under load: other work took 1.02 cores, 3 tries" in report
    assert "Taken in a slow spell: in all 3 attempts the model ran over 1.400 ms" in report


def test_a_copied_work_dir_goes_on_in_a_new_run_and_leaves_the_original_alone(
    tiny_onnx, tmp_path, compiled_tiny
):
    from mlflow import MlflowClient

    from dynatune.tasks.tuned_model import DATA_DIR

    orig, copy = tmp_path / "orig", tmp_path / "copy"
    first, _ = _track_a_run(tiny_onnx, orig, {}, "original model", compiled_tiny)
    old_id = first.tracker.run_id
    artifacts_before = _files(WorkDir(str(orig)).mlartifacts)
    metadata = os.path.join("data", DATA_DIR, "model.json")  # in the run's tuned model
    assert [p for p in artifacts_before if p.endswith(metadata)]
    subprocess.run(["cp", "-a", str(orig), str(copy)], check=True)

    state = json.load(open(WorkDir(str(copy)).run_state))
    second, _ = _track_a_run(tiny_onnx, copy, state, "the copy's model", compiled_tiny)
    new_id = second.tracker.run_id

    assert new_id != old_id and state["mlflow_run_id"] == new_id
    assert _files(WorkDir(str(orig)).mlartifacts) == artifacts_before  # the original, untouched
    copy_client = MlflowClient("sqlite:///" + WorkDir(str(copy)).mlflow_db)
    new = copy_client.get_run(new_id)
    assert new.data.tags["dynatune.continues_run"] == old_id
    assert new.data.tags["dynatune.continues_work_dir"] == os.path.realpath(orig)
    assert new.info.artifact_uri.startswith("file://" + WorkDir(str(copy)).mlartifacts)
    copied = _files(WorkDir(str(copy)).mlartifacts)  # the original's, copied along, and the new run's
    markers = [json.loads(copied[p])["marker"] for p in copied if p.endswith(metadata)]
    assert sorted(markers) == ["original model", "the copy's model"]  # its tuned model is there too
    orig_client = MlflowClient("sqlite:///" + WorkDir(str(orig)).mlflow_db)
    assert [r.info.run_id for r in orig_client.search_runs([first.tracker.experiment_id])] == [old_id]

    # resumed again where it now is: the same (new) run goes on
    third, _ = _track_a_run(
        tiny_onnx, copy, json.load(open(WorkDir(str(copy)).run_state)), "again", compiled_tiny
    )
    assert third.tracker.run_id == new_id and third.tracker.resumed
