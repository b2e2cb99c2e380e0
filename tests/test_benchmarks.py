"""The maintained benchmarks (``bench/``), each run on a tiny model: one that breaks, or that measures
something other than what it states, fails here.

A benchmark that tunes through the CLI is given the session's finished run (conftest's ``tiny_run``) in
place of its tuning (``tune=``): what is checked is the benchmark's own part, and the settings it asked
the run for."""

import ast
import json
import os
import shutil

import pytest
from helpers import ROOT, randomized_light_model

BENCH = os.path.join(ROOT, "bench")
MODULES = sorted(
    f[:-3] for f in os.listdir(BENCH) if f.endswith(".py") and f not in ("__init__.py", "harness.py")
)


def test_every_benchmark_is_a_module_with_a_main_and_edits_no_import_path():
    assert {"deployed_speed", "kernels", "measure_protocols", "stop_savings", "trial_cost"} <= set(MODULES)
    for name in MODULES:
        text = open(os.path.join(BENCH, name + ".py")).read()
        tree = ast.parse(text)
        doc = ast.get_docstring(tree)
        assert doc and f"python -m bench.{name}" in doc, f"{name}: its docstring shows how to run it"
        assert any(isinstance(n, ast.FunctionDef) and n.name == "main" for n in tree.body), name
        assert "sys.path" not in text, f"{name} edits sys.path"
        # a protocol is stated field by field (bench.harness.PROTOCOLS), never MeasureConfig()'s defaults
        calls = {
            n.func.id if isinstance(n.func, ast.Name) else getattr(n.func, "attr", None)
            for n in ast.walk(tree)
            if isinstance(n, ast.Call)
        }
        assert "MeasureConfig" not in calls, f"{name}: state the protocol with bench.harness.measure_config"


def test_the_protocols_state_what_they_are():
    from bench.harness import PROTOCOLS, measure_config

    assert measure_config("fixed").adaptive is False and measure_config("fixed").repeat == 5
    assert measure_config("adaptive").adaptive is True
    assert measure_config("fixed", repeat=1).repeat == 1
    assert set(PROTOCOLS) == {"fixed", "adaptive"}


def _tune_from(tiny_run, calls: list):
    """A ``tune`` for a benchmark that hands out copies of the session's finished run, and records what it
    was asked for."""
    from bench.harness import Tuned
    from dynatune.run.summary import RunSummary

    def tune(model, budget, work, config=None, sets=(), repo=None, **kwargs):
        calls.append({"model": model, "budget": budget, "work": work, "config": config, "sets": list(sets)})
        shutil.copytree(tiny_run["work"], work, dirs_exist_ok=True)
        summary = RunSummary.of(dict(tiny_run["summary"], work_dir=work))
        return Tuned(summary, 1.0, "")

    return tune


# -- on tuning traces (no tuning) ---------------------------------------------------------------------
def test_stop_savings_replay_states_its_rule(tmp_path):
    from synthetic_traces import multi_seed

    from bench.stop_savings import main

    path, out = tmp_path / "syn.json", tmp_path / "replay.json"
    path.write_text(json.dumps(multi_seed([0, 1])))
    argv = ["replay", "--models", str(path), "--draws", "1", "--budgets", "1", "--shares", "0.02"]
    rows = main([*argv, "--out", str(out)])
    assert rows and json.loads(out.read_text())["rows"] == rows
    assert {r["share"] for r in rows} == {0.02} and {r["patience"] for r in rows} == {3}
    assert all(0 < r["used_share"] <= 1 for r in rows)


def test_replay_oracle_reports_the_share_of_the_clairvoyants_advantage_on_the_same_draws(tmp_path):
    from synthetic_traces import multi_seed

    from bench.replay_oracle import captured_share, main

    path, out = tmp_path / "syn.json", tmp_path / "oracle.json"
    path.write_text(json.dumps(multi_seed([0, 1, 2])))
    main(["--models", str(path), "--draws", "4", "--rtol", "0.02", "--out", str(out)])
    res = json.loads(out.read_text())
    assert res["traces_per_task"] == 3 and res["draws"] == 4
    cell = res["shares"]["0.02"]["1.0"]
    assert cell["vs_gradient"]["clairvoyant"]["n"] == 4
    assert cell["vs_gradient"]["clairvoyant"]["median"] >= 1.0  # foresight is no slower than gradient here
    row = {"ttq_s": {"0.02": {"gradient": 100.0, "dynatune": 70.0, "clairvoyant": 40.0}}}
    assert captured_share(row, "0.02") == 0.5
    row["ttq_s"]["0.02"]["clairvoyant"] = 99.5  # the clairvoyant saves < 1 %: no share
    assert captured_share(row, "0.02") is None


def test_bench_calibration_scores_each_belief_model_on_the_recorded_traces(tmp_path, capsys):
    from dynatune.beliefs import BELIEFS
    from dynatune.bench.traces import available_traces
    from dynatune.cli import main

    name, out = available_traces()[0], tmp_path / "calibration.json"
    assert main(["bench", "calibration", "--models", name, "--out", str(out)]) == 0
    scores = json.loads(out.read_text())[name]
    assert set(BELIEFS) <= set(scores) and all(scores[b]["slots"] > 0 for b in BELIEFS)
    assert capsys.readouterr().out.count(name) == len(set(scores) - {"seeds", "roofline"})


# -- compiled models side by side ------------------------------------------------------------------
@pytest.mark.slow  # compiles the tiny model (compiled_tiny: ~28 s, the fast tier's only user of it)
def test_lowering_ab_times_artifacts_side_by_side_as_their_users_call_them(compiled_tiny, tmp_path):
    from bench.harness import SIDE_BY_SIDE
    from bench.lowering_ab import main

    so, out = compiled_tiny["library"], tmp_path / "ab.json"
    argv = ["--model", compiled_tiny["onnx"], "--artifact", f"a={so}", "--artifact", f"b={so}"]
    entry = main([*argv, "--rounds", "2", "--block-ms", "10", "--out", str(out)])
    assert json.loads(out.read_text()) == [entry] and entry["timer"] == SIDE_BY_SIDE
    a, b = entry["variants"]
    assert (a["variant"], b["variant"]) == ("a", "b") and a["vs_first"]["median"] == 1.0
    assert 0.2 < b["vs_first"]["median"] < 5 and entry["onnxruntime_ms"] > 0
    assert a["max_rel_err"] < 1e-4 and a["settings"] == {"artifact": so}


@pytest.mark.slow  # the session's tiny run, its model built again with empty kernels
def test_dispatch_times_a_runs_artifact_beside_its_calls_with_empty_kernels(tiny_run, tmp_path):
    from bench.dispatch import main

    out = tmp_path / "dispatch.json"
    entry = main([tiny_run["work"], "--rounds", "2", "--block-ms", "10", "--out", str(out)])
    assert json.loads(out.read_text()) == [entry]
    (row,) = entry["rows"]
    assert row["calls_a_run"] > 0 and 0 < row["dispatch_ms"] < row["model_ms"]
    assert 0 < row["dispatch_share"]["min"] <= row["dispatch_share"]["median"] < 1


@pytest.mark.slow  # a fresh process per way of loading the model
def test_deployed_speed_loads_each_way_in_a_fresh_process(tiny_run, tmp_path):
    from bench.deployed_speed import ONCE, OPENVINO_WAY, REPEATED, SLOW_RETRIES, main
    from dynatune.files import WorkDir

    bare = WorkDir(str(tmp_path / "bare"))  # a summary naming no compiled model: one line
    os.makedirs(os.path.dirname(bare.summary))
    with open(bare.summary, "w") as f:
        json.dump({}, f)
    with pytest.raises(SystemExit, match="names no compiled model"):
        main([str(bare), "--out", str(tmp_path / "bare.json")])
    # the session's run as it finished (tests/run/test_pipeline.py resumes it later without a compile)
    work = WorkDir(str(tmp_path / "work"))
    shutil.copytree(tiny_run["work"], str(work))
    with open(work.summary, "w") as f:
        json.dump(tiny_run["summary"], f)
    argv = [
        str(work),
        "--rounds",
        "2",
        "--block-ms",
        "10",
        "--repeats",
        "1",
        "--out",
        str(tmp_path / "d.json"),
    ]
    doc = main(argv)
    (row,) = doc["rows"]
    assert set(row["ways"]) == set(REPEATED + ONCE) - {OPENVINO_WAY} and doc["openvino"] is False
    for way, w in row["ways"].items():
        assert w["ratio_min"] <= w["ratio"] <= w["ratio_max"] and w["vs_rerun"] > 0, way
        *slow, p = w["processes"]  # --repeats 1; a way timed once again where ONNX Runtime ran slow
        assert not slow or way == OPENVINO_WAY and len(slow) <= SLOW_RETRIES, way
        assert all(s["onnxruntime_slow"] for s in slow) and isinstance(w["onnxruntime_slow"], bool), way
        assert p["ms"] > 0 and p["ratio_min"] <= p["ratio"] <= p["ratio_max"], way
        # nothing of dynatune before the model is loaded, but its loader where that is the way (the run's own
        # timing process is dynatune's)
        if way != "run's timing, again":
            assert ("dynatune.runtime" in p["dynatune_modules_at_load"]) == (way == "loader"), way
            assert way == "loader" or not p["dynatune_modules_at_load"], way
    # pyfunc's process also times the same model's own predict, MLflow's wrapper bypassed; no other way does
    pyfunc = row["ways"]["pyfunc"]
    assert pyfunc["processes"][0]["unwrapped_ms"] > 0 and pyfunc["vs_unwrapped"] > 0
    assert pyfunc["unwrapped_vs_run"] > 0
    assert all("vs_unwrapped" not in w for way, w in row["ways"].items() if way != "pyfunc")
    threads = row["ways"]["plain TVM, TVM_NUM_THREADS"]["processes"][0]["threads"]
    assert threads == row["ways"]["loader"]["processes"][0]["threads"]


def test_deployed_speed_marks_processes_in_a_slow_spell_and_reads_the_target_from_the_others():
    """Both sides slow, ONNX Runtime more (mnasnet0_5's slow spells: 1.22 ms against 0.70): such a process's
    ratio flatters dynatune, so it is marked, and dynatune / the faster runtime comes from the others."""
    from bench.deployed_speed import OPENVINO_WAY, RUN_WAY, summarize_ways

    def process(ms, ort, openvino=None):
        p = {"ms_best": ms, "onnxruntime_ms_best": ort, "ratio": ms / ort}
        return p | ({"openvino_ms_best": openvino, "vs_fastest": ms / min(ort, openvino)} if openvino else {})

    row = {
        "ways": {
            RUN_WAY: {"processes": [process(0.63, 0.70), process(0.86, 1.22)]},
            OPENVINO_WAY: {"processes": [process(0.86, 1.22, 1.30), process(0.65, 0.72, 0.78)]},
        }
    }
    ways = summarize_ways(row, run_ratio=0.9)["ways"]
    assert [p["onnxruntime_slow"] for p in ways[RUN_WAY]["processes"]] == [False, True]
    assert not ways[RUN_WAY]["onnxruntime_slow"] and ways[RUN_WAY]["ratio"] == pytest.approx(0.63 / 0.70)
    assert ways[OPENVINO_WAY]["vs_fastest"] == pytest.approx(0.65 / 0.72)  # not the slow process's 0.70
    assert ways[OPENVINO_WAY]["openvino_vs_onnxruntime"] == pytest.approx(0.78 / 0.72)
    assert ways[RUN_WAY]["vs_run"] == pytest.approx(0.63 / 0.70 / 0.9) and ways[RUN_WAY]["vs_rerun"] == 1


@pytest.mark.slow  # builds kernels, ONNX Runtime's profiler
def test_kernels_reads_the_roofline_peak(tiny_run, tmp_path):
    from bench.kernels import main
    from dynatune.machine.roofline import machine_roofline
    from dynatune.machine.target import make_target

    out = tmp_path / "kernels.json"
    args = ["--model", tiny_run["static_model"], "--work-dir", tiny_run["work"], "--tasks", "1"]
    doc = main([*args, "--rounds", "1", "--json", str(out)])
    assert json.loads(out.read_text()) == doc
    assert doc["peak_gflops"] == pytest.approx(machine_roofline(make_target()).peak_flops / 1e9)
    (row,) = doc["rows"]
    assert {"untuned", "best", row["analytic"]} <= set(row["us"])
    a = row["analytic"]
    assert row["pct_peak"][a] == pytest.approx(100 * row["gflops"][a] / doc["peak_gflops"], rel=0.05, abs=0.2)


# -- measurement -----------------------------------------------------------------------------------
@pytest.mark.slow  # the runner's worker process
def test_measure_protocols_measure_what_they_state(tiny_run, tmp_path):
    from bench.measure_protocols import VARIANTS, main

    args = [tiny_run["static_model"], "--work-dir", tiny_run["work"], "--tasks", "1"]
    out = main([*args, "--out", str(tmp_path / "p.json")])
    rows = out["protocols"]
    assert out["candidates"] > 0 and set(rows) == set(VARIANTS)
    assert rows["fixed"]["repeats_per_candidate"] == 5 and set(rows["fixed"]["stops"]) == {"fixed"}
    assert rows["timing_off"]["repeats_per_candidate"] == 1
    for name in ("adaptive4", "adaptive2"):
        assert 1 <= rows[name]["repeats_per_candidate"] <= 10 and "fixed" not in rows[name]["stops"], name
    assert rows["timing_off"]["s_per_candidate"] < rows["fixed"]["s_per_candidate"]


@pytest.mark.slow  # tunes
def test_trial_cost_of_one_task_under_the_stated_protocol(tmp_path):
    from helpers import make_tiny_onnx

    from bench.trial_cost import main

    model = make_tiny_onnx(str(tmp_path / "tiny.onnx"), batch=1)
    args = ["task", model, "--protocol", "fixed", "--rounds", "2", "--trials", "4", "--trials-per-iter", "4"]
    out = main([*args, "--out", str(tmp_path / "t.json")])
    assert out["protocol"] == "fixed" and out["measure"]["adaptive"] is False
    assert [r["trials"] for r in out["rounds"]] == [4, 4] and out["steady_per_trial_s"] > 0
    assert all(r["repeats_per_trial"] == 5 and set(r["stops"]) == {"fixed"} for r in out["rounds"])


@pytest.mark.slow  # the session's run
def test_trial_cost_pipeline_compares_whole_runs_that_spend_their_budget(tiny_run, tmp_path):
    from bench.trial_cost import main

    calls = []
    argv = ["pipeline", "--model", tiny_run["static_model"], "--budget", "6", "--variant", f"new={ROOT}"]
    argv += ["--work", str(tmp_path / "w"), "--out", str(tmp_path / "p.json"), "--by-task", "new"]
    res = main(argv, tune=_tune_from(tiny_run, calls))
    (call,) = calls
    assert "stopping.enabled=false" in call["sets"] and "compile.profile=false" in call["sets"]
    row = res["6"]["tiny-static"]["new"]
    assert row["candidates"] > 0 and row["s_per_candidate"] > 0
    assert row["settings"]["measure"]["repeat"] == 3  # the run's own settings, recorded


@pytest.mark.slow  # a fresh process times the model
def test_vs_onnxruntime_states_its_stopping_and_times_the_run_in_a_fresh_process(tiny_run, tmp_path):
    from bench.vs_onnxruntime import main, table

    calls, out = [], tmp_path / "vs.json"
    argv = ["--model", tiny_run["static_model"], "--budget", "6", "--stopping", "off", "--rounds", "2"]
    res = main([*argv, "--work", str(tmp_path / "w"), "--out", str(out)], tune=_tune_from(tiny_run, calls))
    assert calls[0]["sets"][0] == "stopping.enabled=false"
    row = res["after"]["tiny-static"]["6"]
    assert row["fresh"]["ratio"] > 0 and row["fresh"]["rounds"] == 2 and "stopping" in row["settings"]
    assert "tiny-static" in table(json.loads(out.read_text()))
    with pytest.raises(SystemExit):  # the stopping is stated, not left to the defaults
        main(["--model", tiny_run["static_model"], "--out", str(out)])


@pytest.mark.slow  # the session's run, timed side by side
def test_stop_savings_live_states_its_rule_and_times_the_runs_side_by_side(tiny_run, tmp_path):
    from bench.stop_savings import live_one, live_table, model_name, retune_rows

    calls = []
    rule = {"share": 0.02, "patience": 3, "confidence": 1.0}
    spec = tiny_run["static_model"]
    work = tmp_path / "w" / f"{model_name(spec)}-s0"
    out = live_one(spec, 0, 6, None, str(work), 2, rule, tune=_tune_from(tiny_run, calls))
    for call in calls:
        assert "stopping.min_gain_share=0.02" in call["sets"] and "stopping.patience=3" in call["sets"]
    assert "stopping.enabled=true" in calls[0]["sets"] and "stopping.enabled=true" in calls[-1]["sets"]
    assert any(s.startswith("warm_start=") for s in calls[-1]["sets"])  # the retune starts from the first
    assert out["stopped"]["checks"] and out["retune_vs_first"]["median"] > 0
    assert {v["variant"] for v in out["timing"]["variants"]} >= {"stopped", "retune"}
    assert "stopped within 3 % of full" in live_table([out])
    before = len(calls)  # steps 3 and 4 again, on the work dir live left
    (again,) = retune_rows([out], str(tmp_path / "w"), None, 2, rule, tune=_tune_from(tiny_run, calls))
    assert len(calls) == before + 1 and any(s.startswith("warm_start=") for s in calls[-1]["sets"])
    assert "retune_date" in again and again["retune_vs_first"]["median"] > 0


# -- tuning in this process ------------------------------------------------------------------------
@pytest.mark.slow  # tunes three times
def test_warm_start_ttq_tunes_v1_v2_and_v2_warm(tmp_path):
    from helpers import make_tiny_onnx

    from bench.warm_start_ttq import main

    model = make_tiny_onnx(str(tmp_path / "tiny.onnx"), batch=1)
    argv = [model, "--budget", "2", "--slot", "1", "--layer", "conv2", "--out", str(tmp_path / "w.json")]
    out = main(argv)
    assert out["warm_matched_tasks"] >= 1 and out["new_task_keys"]
    assert out["settings"]["stopping"]["enabled"] is False and out["settings"]["library"]["enabled"] is False


@pytest.mark.slow  # tunes each task, then measures its untuned latencies
def test_record_traces_then_anchor_them(tmp_path, monkeypatch):
    from helpers import make_tiny_onnx

    from bench.record_traces import main as record
    from bench.trace_anchors import main as anchor

    model = make_tiny_onnx(str(tmp_path / "tiny.onnx"), batch=1)
    traces = tmp_path / "traces"
    args = [
        model,
        "--protocol",
        "fixed",
        "--seeds",
        "0",
        "--seconds-per-task",
        "0.5",
        "--trials-per-iter",
        "4",
    ]
    assert record([*args, "--out-dir", str(traces), "--work-root", str(tmp_path / "work")]) == 0
    doc = json.loads((traces / "tiny.json").read_text())
    assert doc["seeds"] == [0] and all(len(t["traces"]) == 1 for t in doc["tasks"])
    monkeypatch.setenv("TVM_NUM_THREADS", os.environ.get("TVM_NUM_THREADS", "1"))  # it sets it: restored
    out = anchor([str(traces / "tiny.json"), "--models", str(tmp_path), "--out-dir", str(tmp_path / "a")])
    assert out["anchor_s"] and out["scale"] > 0 and (tmp_path / "a" / "tiny.json").exists()


# -- the MLflow UI ---------------------------------------------------------------------------------
@pytest.mark.slow  # an MLflow server (and Chromium, where installed)
def test_mlflow_screenshot_picks_the_two_latest_runs(tmp_path):
    from mlflow import MlflowClient

    from bench.mlflow_screenshot import main, page_url, pick_runs
    from dynatune.tasks.mlflow_store import seed_sqlite_store

    store = f"sqlite:///{tmp_path / 'mlflow.db'}"
    seed_sqlite_store(store)
    client = MlflowClient(store)
    exp = client.create_experiment("dynatune/tiny")
    ids = [client.create_run(exp).info.run_id for _ in range(2)]
    runs, exp_id = pick_runs(store, None)
    assert sorted(runs) == sorted(ids) and exp_id == exp
    assert "compare-runs" in page_url("http://h", "compare", runs, exp_id, "estimated_latency_ms")
    if not shutil.which("chromium") and not shutil.which("chromium-browser"):
        pytest.skip("no Chromium here: the screenshot itself is not taken")
    out = main(["--store", store, "--out", str(tmp_path / "shot.png")])
    assert out["bytes"] > 0


def test_efficientnet_like_writes_a_model_onnxruntime_runs(tmp_path):
    import numpy as np
    import onnxruntime as ort

    from bench.efficientnet_like import main

    out = str(tmp_path / "b2.onnx")
    assert main([out, "--blocks", "2"]) == 0
    sess = ort.InferenceSession(out, providers=["CPUExecutionProvider"])
    (inp,) = sess.get_inputs()
    (y,) = sess.run(None, {inp.name: np.random.default_rng(0).standard_normal((1, 3, 224, 224), np.float32)})
    assert y.shape == (1, 1000) and np.isfinite(y).all()


@pytest.mark.slow  # a pytest run of its own, and the subprocess its test starts
def test_suite_cpu_counts_each_process_of_a_pytest_run_by_kind_and_test(tmp_path):
    from bench.suite_cpu import main

    test = "tests/search/test_spare_workers.py::test_off_unless_a_process_turns_it_on"
    out = tmp_path / "suite_cpu.json"
    doc = main(["--out", str(out), "--", "-q", "-p", "no:cacheprovider", test])
    assert doc["exit_code"] == 0 and json.loads(out.read_text())["processes"] == doc["processes"]
    assert doc["by_kind"]["pytest"]["processes"] == 1  # the run itself
    assert doc["by_kind"]["python -c (pytest-xdist workers, scripts)"]["processes"] == 1  # what the test ran
    assert doc["top_tests"][0]["test"] == test and doc["top_tests"][0]["cpu_s"] > 0
    assert 0 < doc["counted_cpu_s"] <= doc["total_cpu_s"] * 1.05


def test_constant_folding_times_both_ways_and_finds_the_same_module(tmp_path):
    from bench.constant_folding import main

    out = tmp_path / "folding.json"
    model = randomized_light_model("squeezenet", str(tmp_path / "squeezenet.onnx"))
    assert main([model, "--rounds", "1", "--out", str(out)]) == 0
    (row,) = json.loads(out.read_text())["models"]
    assert row["same_module"] and row["calls_on_constants"] > 0
    assert set(row["seconds"]) == {"fold_constant_alone", "one_build"} and row["ratio"]["median"] > 0
