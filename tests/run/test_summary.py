"""The run's summary as a type: summary.json keeps its keys, and older work dirs' summaries still load."""

import json
from types import SimpleNamespace as NS

import pytest

from dynatune.run import pipeline, report
from dynatune.run.callbacks import TuningEnded
from dynatune.run.summary import RunSummary

# the keys of a run's summary.json, in order, as the dict that RunSummary replaced wrote them (a run that
# compiled, verified, profiled and was tracked in MLflow)
SUMMARY_KEYS = [
    "model",
    "model_sha256",
    "model_version",
    "scheduler",
    "tasks",
    "rounds",
    "trials",
    "budget_s",
    "elapsed_s",
    "wall_s",
    "estimated_latency_ms",
    "initial_estimated_latency_ms",
    "estimate_excludes",
    "warmup_rounds",
    "never_tuned_tasks",
    "stopped_early",
    "stop_reason",
    "tuning_s_used",
    "tuning_s_saved",
    "stop_check",
    "confirmed",
    "latency_ms",
    "untuned_latency_ms",
    "onnxruntime_latency_ms",
    "max_rel_err",
    "max_rel_err_per_input",
    "max_abs_err",
    "numerics_ok",
    "artifact",
    "work_dir",
    "ratio_vs_onnxruntime",
    "ratio_vs_onnxruntime_min",
    "ratio_vs_onnxruntime_max",
    "ratio_vs_onnxruntime_per_process",
    "timing_under_load",
    "timing_load_cores",
    "timing_attempts",
    "timing_onnxruntime_slow",
    "onnxruntime_reference_ms",
    "measurements",
    "time_to_onnxruntime_parity_s",
    "periodic_measure_s",
    "dynatune_version",
    "retired_tasks",
    "speedup_vs_untuned",
    "speedup_vs_onnxruntime",
    "library",
    "start_estimated_latency_ms",
    "profile",
    "residual_ms",
    "residual_source",
    "estimated_model_latency_ms",
    "mlflow_run_id",
    "mlflow_tracking_uri",
    "mlflow_ui",
    "tracking_s",
]
# written only when known: measured speedups, the profile, the per-input errors, MLflow's part, the
# confirmation of records measured elsewhere
ONLY_WHEN_SET = {
    "confirmed",
    "ratio_vs_onnxruntime_per_process",
    "max_rel_err_per_input",
    "timing_under_load",
    "timing_load_cores",
    "timing_attempts",
    "timing_onnxruntime_slow",
    "onnxruntime_reference_ms",
    "speedup_vs_untuned",
    "speedup_vs_onnxruntime",
    "profile",
    "mlflow_run_id",
    "mlflow_tracking_uri",
    "mlflow_ui",
    "tracking_s",
}

TODAY = {  # a summary.json as a run of this version writes it
    "model": "tiny",
    "model_sha256": "ab" * 32,
    "model_version": "3",
    "scheduler": "dynatune",
    "tasks": 4,
    "rounds": 6,
    "trials": 96,
    "budget_s": 60.0,
    "elapsed_s": 61.234,
    "wall_s": 95.5,
    "estimated_latency_ms": 1.25,
    "initial_estimated_latency_ms": 9.5,
    "estimate_excludes": ["take"],
    "warmup_rounds": 4,
    "never_tuned_tasks": [],
    "stopped_early": False,
    "stop_reason": "tuned for the whole budget (60 s); at the last check with a slot left, the rest ...",
    "tuning_s_used": 61.234,
    "tuning_s_saved": 0.0,
    "stop_check": {"stop": False, "gain_s": 2e-5, "threshold_s": 1.25e-5, "streak": 0},
    "confirmed": {"tasks": 2, "failed": [], "median_ratio": 1.01, "worst_ratio": 1.04, "worst_task": "conv"},
    "latency_ms": 1.5,
    "untuned_latency_ms": 9.0,
    "onnxruntime_latency_ms": 2.0,
    "max_rel_err": 2e-6,
    "max_rel_err_per_input": [2e-6, 1e-6, 5e-7],
    "max_abs_err": 1e-6,
    "numerics_ok": True,
    "artifact": "/w/model.so",
    "work_dir": "/w",
    "ratio_vs_onnxruntime": 0.75,
    "ratio_vs_onnxruntime_min": 0.7,
    "ratio_vs_onnxruntime_max": 0.8,
    "ratio_vs_onnxruntime_per_process": [0.75],
    "timing_under_load": False,
    "timing_load_cores": 0.1,
    "timing_attempts": 1,
    "timing_onnxruntime_slow": False,
    "onnxruntime_reference_ms": 1.9,
    "measurements": [{"round": 2, "elapsed_s": 30.0, "latency_ms": 1.7, "ratio": 0.85, "seconds": 4.0}],
    "time_to_onnxruntime_parity_s": 30.0,
    "periodic_measure_s": 4.0,
    "dynatune_version": "0.1.0",
    "retired_tasks": {"take": "default schedule failed"},
    "speedup_vs_untuned": 6.0,
    "speedup_vs_onnxruntime": 2.0 / 1.5,
    "library": {"url": "sqlite:///lib.db", "matched_tasks": 2, "seeded_records": 10, "written_records": 96},
    "start_estimated_latency_ms": 5.0,
    "profile": {"model_ms": 1.5, "estimate_ms": 1.2, "gap_ms": 0.3},
    "residual_ms": 0.3,
    "residual_source": "final profile",
    "estimated_model_latency_ms": 1.55,
    "mlflow_run_id": "0123abcd",
    "mlflow_tracking_uri": "sqlite:////w/mlflow.db",
    "mlflow_ui": "mlflow ui --backend-store-uri sqlite:////w/mlflow.db",
    "tracking_s": 1.25,
}

OLD = {  # an early run's summary.json: fewer keys, one this version no longer writes
    "model": "tiny",
    "model_sha256": "ab" * 32,
    "model_version": None,
    "scheduler": "greedy",
    "tasks": 4,
    "rounds": 3,
    "trials": 48,
    "budget_s": 30.0,
    "elapsed_s": 31.0,
    "wall_s": 50.0,
    "estimated_latency_ms": 2.0,
    "initial_estimated_latency_ms": 9.5,
    "latency_ms": 2.5,
    "untuned_latency_ms": 9.0,
    "onnxruntime_latency_ms": None,
    "max_rel_err": 1e-6,
    "max_abs_err": 1e-7,
    "numerics_ok": True,
    "artifact": "/old/model.so",
    "mlflow_run_id": "feedbeef",
    "mlflow_tracking_uri": "sqlite:////old/mlflow.db",
    "work_dir": "/old",
    "tracking_s": 0.5,
    "dynatune_version": "0.0.1",
    "retired_tasks": {},
    "speedup_vs_untuned": 3.6,
    "mlflow_ui": "mlflow ui",
    "obsolete_key": {"kept": [1, 2]},
}


def test_a_summary_json_of_today_reads_into_the_type_and_back(tmp_path):
    assert list(TODAY) == SUMMARY_KEYS
    path = tmp_path / "summary.json"
    path.write_text(json.dumps(TODAY))
    s = RunSummary.load(str(path))
    assert s.rounds == 6 and s.latency_ms == 1.5 and s.numerics_ok is True and s.mlflow_run_id == "0123abcd"
    assert s.measurements[0]["ratio"] == 0.85 and s.library["matched_tasks"] == 2
    assert s.retired_tasks == {"take": "default schedule failed"} and s.model_extra == {}
    assert s.to_dict() == TODAY and list(s.to_dict()) == SUMMARY_KEYS
    s.write(str(tmp_path / "again.json"))
    assert json.loads((tmp_path / "again.json").read_text()) == TODAY


def test_an_older_summary_json_loads_keeps_what_it_has_and_reads_as_empty_what_it_lacks(tmp_path):
    path = tmp_path / "summary.json"
    path.write_text(json.dumps(OLD))
    s = RunSummary.load(str(path))
    assert s.scheduler == "greedy" and s.speedup_vs_untuned == 3.6 and s.onnxruntime_latency_ms is None
    # keys the old run did not write
    assert s.measurements == [] and s.estimate_excludes == [] and s.never_tuned_tasks == []
    assert s.library is None and s.profile is None and s.residual_ms is None
    assert s.speedup_vs_onnxruntime is None
    assert s.model_extra == {"obsolete_key": {"kept": [1, 2]}}  # a key this version does not know is kept
    out = s.to_dict()
    assert {k: out[k] for k in OLD} == OLD
    assert set(out) - set(OLD) <= set(SUMMARY_KEYS) - ONLY_WHEN_SET
    # null lists and dicts read as empty; numbers where a string belongs read as the string
    assert RunSummary.of({"never_tuned_tasks": None, "retired_tasks": None, "model_version": 3}).model_dump(
        include={"never_tuned_tasks", "retired_tasks", "model_version"}
    ) == {"never_tuned_tasks": [], "retired_tasks": {}, "model_version": "3"}


def test_the_report_reads_a_summary_or_its_dict_alike(tmp_path):
    a = report.markdown_report(RunSummary.of(OLD), [], str(tmp_path / "a.md"))
    b = report.markdown_report(OLD, [], str(tmp_path / "b.md"))
    assert a == b and "| speedup vs untuned | 3.60x |" in a and "| scheduler | greedy |" in a
    assert report.compare_table({"x": RunSummary.of(TODAY)}) == report.compare_table({"x": TODAY})
    assert "| model | - |" in report.markdown_report(None, [], str(tmp_path / "c.md"))


def _fakes(report_=True):
    cfg = NS(model=NS(version="3"), scheduler=NS(name="dynatune"), budget_s=60.0, work_dir="/w")
    session = NS(
        estimated_latency=lambda: 1.25e-3,
        untuned_estimated_latency=lambda: 9.5e-3,
        excluded_tasks=lambda: ["take"],
        state=lambda i: NS(note="default schedule failed" if i == 1 else ""),
    )
    rounds = [{"result": {"trials": 16}, "phase": "warmup"}, {"result": {"trials": 16}, "phase": "scheduler"}]
    ended = TuningEnded(True, "stopped at 61 s of the 90 s budget: ...", 61.2341, 90.0, 28.7659, 1)
    tuner = NS(
        session=session,
        rounds=rounds,
        elapsed_s=61.2341,
        never_tuned=lambda: [],
        residual_s=lambda: None,
        ending=lambda: ended,
        last_check=lambda: {"stop": True, "streak": 3},
        # records from elsewhere confirmed (None: none seeded, as in the bare run below)
        confirmation=lambda: {"tasks": 1, "failed": [], "median_ratio": 1.0} if report_ else None,
    )
    points = [{"round": 0, "elapsed_s": 30.0, "latency_ms": 1.7, "ratio": 0.85, "seconds": 4.0}]
    periodic = NS(points=points, parity_s=lambda *a: 30.0)
    rep = NS(
        latency_ms=1.5,
        untuned_latency_ms=9.0,
        onnxruntime_latency_ms=2.0,
        max_rel_err=2e-6,
        max_rel_err_per_input=[2e-6, 1e-6],
        max_abs_err=1e-6,
        numerics_ok=True,
        artifact="/w/model.so",
        metadata=None,  # the artifact's metadata and threads: only when known (a test below sets them)
        threads=None,
        ratio_vs_onnxruntime=0.75,
        ratio_vs_onnxruntime_min=0.7,
        ratio_vs_onnxruntime_max=0.8,
        ratio_vs_onnxruntime_per_process=[0.75],
        timing_under_load=False,
        timing_load_cores=0.1,
        timing_attempts=1,
        timing_onnxruntime_slow=False,
        onnxruntime_reference_ms=1.9,
    )
    tasks = [NS(index=0, name="conv"), NS(index=1, name="take")]
    return cfg, NS(name="tiny", sha256="ab" * 32), tasks, tuner, rep if report_ else None, periodic


def test_the_pipeline_writes_the_keys_it_always_wrote():
    s = pipeline.make_summary(*_fakes(), wall_s=95.5)
    s.library = None
    s.start_estimated_latency_ms = 9.5
    s.profile = {"gap_ms": 0.25}
    s = s.model_copy(update=pipeline.residual_fields(s.estimated_latency_ms, _fakes()[3], s.profile))
    s.mlflow_run_id, s.mlflow_tracking_uri, s.mlflow_ui, s.tracking_s = "r", "u", "ui", 0.5  # MLflow's part
    d = s.to_dict()
    assert list(d) == SUMMARY_KEYS
    assert d["trials"] == 32 and d["warmup_rounds"] == 1 and d["elapsed_s"] == 61.234
    assert d["stopped_early"] and d["stop_reason"].startswith("stopped at 61 s") and d["stop_check"]["stop"]
    assert d["tuning_s_used"] == 61.234 and d["tuning_s_saved"] == 28.766 and d["confirmed"]["tasks"] == 1
    assert d["retired_tasks"] == {"take": "default schedule failed"}
    assert d["speedup_vs_untuned"] == pytest.approx(6.0)
    assert d["estimated_model_latency_ms"] == pytest.approx(1.5)
    # without the final compile (nor profile, nor MLflow, nor seeds): the keys that are always there
    cfg, model, tasks, tuner, rep, periodic = _fakes()
    rep.metadata, rep.threads = "/w/model.json", 2
    known = pipeline.make_summary(cfg, model, tasks, tuner, rep, periodic, wall_s=1.0).to_dict()
    assert known["artifact_metadata"] == "/w/model.json" and known["threads"] == 2
    bare = pipeline.make_summary(*_fakes(report_=False), wall_s=1.0)
    bare.library, bare.start_estimated_latency_ms = None, 9.5
    bare = bare.model_copy(update=pipeline.residual_fields(bare.estimated_latency_ms, _fakes()[3], None))
    d = bare.to_dict()
    assert list(d) == [k for k in SUMMARY_KEYS if k not in ONLY_WHEN_SET]
    assert d["latency_ms"] is None and d["numerics_ok"] is None and d["residual_ms"] is None
    assert json.loads(json.dumps(d)) == d  # plain JSON


def test_a_final_ratio_taken_under_load_claims_no_parity():
    """The final timing beat ONNX Runtime only because the machine was busy: no parity, and it says so."""
    from dynatune.compiler.periodic import parity_s

    cfg, model, tasks, tuner, rep, _ = _fakes()
    periodic = NS(points=[], parity_s=lambda e=None, r=None: parity_s([], e, r))
    rep.ratio_vs_onnxruntime = 0.97
    quiet = pipeline.make_summary(cfg, model, tasks, tuner, rep, periodic, wall_s=1.0)
    assert quiet.time_to_onnxruntime_parity_s == quiet.elapsed_s  # a quiet final timing: parity
    rep.timing_under_load, rep.timing_load_cores, rep.timing_attempts = True, 1.02, 3
    s = pipeline.make_summary(cfg, model, tasks, tuner, rep, periodic, wall_s=1.0)
    assert s.time_to_onnxruntime_parity_s is None
    assert s.timing_under_load and s.timing_load_cores == 1.02 and s.timing_attempts == 3
    text = report.markdown_report(s, [], "/dev/null")
    assert "taken under load: other work took 1.02 cores, 3 tries" in text


def test_a_final_ratio_taken_in_a_slow_spell_claims_no_parity():
    """The final timing's ONNX Runtime ran slower than alone before tuning, every try (a slow spell the load
    probe did not see): no parity, and the summary, the report and the console say so."""
    from dynatune.compiler.periodic import parity_s
    from dynatune.run.report import unfair_timing_note

    cfg, model, tasks, tuner, rep, _ = _fakes()
    periodic = NS(points=[], parity_s=lambda e=None, r=None: parity_s([], e, r))
    rep.ratio_vs_onnxruntime = 0.97
    rep.timing_onnxruntime_slow, rep.timing_attempts, rep.onnxruntime_reference_ms = True, 3, 1.68
    s = pipeline.make_summary(cfg, model, tasks, tuner, rep, periodic, wall_s=1.0)
    assert s.time_to_onnxruntime_parity_s is None
    assert s.timing_onnxruntime_slow and s.onnxruntime_reference_ms == 1.68
    text = report.markdown_report(s, [], "/dev/null")
    note = "taken in a slow spell: ONNX Runtime over its time alone before tuning (1.680 ms), 3 tries"
    assert note in text and note in unfair_timing_note(s)
