"""Reliability: a crash, a bad candidate, bad input or two runs at once cost at most the work in flight.

Real processes throughout: ``dynatune tune`` subprocesses (Prefect local mode, MLflow on SQLite, real TVM
tuning of the tiny model), ``kill -9``, fault injection in TVM's worker processes. Expensive set-up is
shared: the two racing runs start when the module starts, and tune in the background while the in-process
fault tests run; the run that wins the race is killed mid-round and resumed while the bad-input tests run.
docs/reliability.md lists every fault and bad input tried here, and what was observed.
"""

import hashlib
import json
import math
import os
import shutil
import signal
import socket
import sqlite3
import subprocess
import sys
import time

import faults
import pytest
from helpers import cli_environment, make_tiny_onnx

pytestmark = pytest.mark.slow  # real tuning, servers or subprocesses

FAILED = 1e10


# -- helpers ------------------------------------------------------------------------------------------
def _env(home) -> dict:
    env = cli_environment(home)
    env.pop("DYNATUNE_DEBUG", None)
    return env


def _cli(args, home, timeout=300) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "dynatune.cli", *map(str, args)],
        cwd=str(home),
        env=_env(home),
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def _spawn(args, home, name) -> subprocess.Popen:
    """A background ``dynatune`` run in its own process group (so the test can always clean up after it)."""
    return subprocess.Popen(
        [sys.executable, "-m", "dynatune.cli", *map(str, args)],
        cwd=str(home),
        env=_env(home),
        stdout=open(home / f"{name}.out", "w"),
        stderr=open(home / f"{name}.err", "w"),
        start_new_session=True,
    )


def _lines(path) -> int:
    try:
        with open(path, "rb") as f:
            return f.read().count(b"\n")
    except FileNotFoundError:
        return 0


def _jsonl(path) -> list:
    """Every line of a JSON-lines file, parsed; fails on a torn, merged or unparseable line."""
    data = open(path, "rb").read()
    assert not data or data.endswith(b"\n"), f"{path} ends in a partial line"
    return [json.loads(line) for line in data.splitlines()]


def _tree(d) -> dict:
    """{relative path: sha256} of every file, and every directory (None): a byte-for-byte fingerprint."""
    out = {}
    for root, dirs, files in os.walk(d):
        for name in dirs:
            out[os.path.relpath(os.path.join(root, name), d)] = None
        for name in files:
            p = os.path.join(root, name)
            out[os.path.relpath(p, d)] = hashlib.sha256(open(p, "rb").read()).hexdigest()
    return out


def _mean(secs) -> float:
    m = sum(secs) / len(secs) if secs else math.inf
    return math.inf if m >= FAILED else m


def _estimate_s(wd) -> float:
    """The run's objective (sum of weight x best latency) computed from its files alone."""
    tasks = json.load(open(wd / "tasks.json"))
    states = json.load(open(wd / "session.json"))["tasks"]
    best = {}
    for line in open(wd / "db" / "records.jsonl", "rb").read().splitlines():
        try:
            r = json.loads(line)
        except ValueError:
            continue
        best[r["key"]] = min(best.get(r["key"], math.inf), _mean(r["record"][1]))
    return sum(
        t["weight"] * min(states[t["key"]]["default_s"] or math.inf, best.get(t["key"], math.inf))
        for t in tasks
    )


def _one_line_error(p, code=2) -> str:
    msg = p.stderr.strip()
    assert p.returncode == code, (p.returncode, p.stderr[-2000:])
    assert "Traceback" not in p.stderr, p.stderr[-2000:]
    assert len(msg.splitlines()) == 1 and msg.startswith("error: "), p.stderr[-2000:]
    return msg


def _alive(proc) -> bool:
    import psutil

    try:
        return proc.is_running() and proc.status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


def _kill_group(p) -> None:
    try:
        os.killpg(p.pid, signal.SIGKILL)  # our own process group (start_new_session)
    except (ProcessLookupError, PermissionError):
        pass


# budget_s: the winner must still be tuning after its first round and the third run (a whole CLI start, slow
# on a loaded machine): 12 s was spent by then beside a second pytest-xdist worker
CONFIG = """
model: {{path: {model}}}
budget_s: 24
slot_s: 3
work_dir: {work}
search: {{trials_per_iter: 4, population_size: 32}}
measure: {{repeat: 3, min_repeat_ms: 5}}
compile: {{verify: false, measure_untuned: false, measure_onnxruntime: false, profile: false}}
tracking: {{run_name: reliability}}
stopping: {{enabled: false}}  # the winner must still be tuning when it is killed mid-round
"""


# -- the background runs: two racing for one work dir; the winner is killed mid-round and resumed -------
@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """Starts when the module does: two runs at once on one work dir, then (in a thread, while the in-process
    tests run) a third run, ``kill -9`` of the winner mid-round, and the resume."""
    import threading

    home = tmp_path_factory.mktemp("rel")
    model = make_tiny_onnx(str(home / "tiny.onnx"), batch=1)
    cfg = home / "cfg.yaml"
    cfg.write_text(CONFIG.format(model=model, work=home / "work"))
    st = {"home": home, "cfg": cfg, "model": model, "work": home / "work", "procs": []}
    st["racers"] = [_spawn(["tune", cfg, "--json"], home, name) for name in ("r0", "r1")]
    st["procs"] += st["racers"]

    def background():
        try:
            st["killed"] = _kill_then_resume(st)
        except BaseException as exc:  # re-raised by the `killed` fixture
            st["error"] = exc

    st["thread"] = threading.Thread(target=background, daemon=True)
    st["thread"].start()
    yield st
    st["stop"] = True
    st["thread"].join(30)
    for p in st["procs"]:
        if p.poll() is None:
            _kill_group(p)
    for p in st.get("orphans", []):
        if _alive(p):
            p.kill()


def _kill_then_resume(runs) -> dict:
    """Wait for the race's winner to finish a round, probe the lock with a third run, ``kill -9`` the winner
    while it measures the next round, then start the same command again (the resume) in the background."""
    import psutil

    home, work = runs["home"], runs["work"]
    t0 = time.time()

    def wait(cond, what, limit=600):
        while not cond():
            assert not runs.get("stop") and time.time() - t0 < limit, what
            time.sleep(0.01)

    wait(lambda: any(p.poll() is not None for p in runs["racers"]), "neither racing run stopped")
    loser = next(p for p in runs["racers"] if p.poll() is not None)
    winner = next(p for p in runs["racers"] if p is not loser)
    loser_err = open(home / ("r0.err" if loser is runs["racers"][0] else "r1.err")).read()
    rounds_path, records_path = work / "rounds.jsonl", work / "db" / "records.jsonl"
    wait(lambda: _lines(rounds_path) >= 1 or winner.poll() is not None, "no round finished")
    assert winner.poll() is None, open(home / "r0.err").read()[-2000:] + open(home / "r1.err").read()[-2000:]
    late = _cli(["tune", runs["cfg"], "--json"], home)  # a third run, while the winner is mid-run
    # kill -9 once a record of an unfinished round is committed (checked with the run frozen): the rest of
    # that round is in flight
    seen = {"rounds": _lines(rounds_path), "records": _lines(records_path)}

    def mid_round():
        assert winner.poll() is None, "the run ended before it could be killed"
        r, n = _lines(rounds_path), _lines(records_path)
        if r != seen["rounds"]:
            seen.update(rounds=r, records=n)
            return False
        return n > seen["records"]

    def frozen_mid_round():
        """Freeze the run (``SIGSTOP``: its thread that writes both logs stops too), then check again: a round
        recorded between the poll and the freeze would leave no round in flight, so the run goes on."""
        if not mid_round():
            return False
        os.kill(winner.pid, signal.SIGSTOP)
        while psutil.Process(winner.pid).status() != psutil.STATUS_STOPPED:
            time.sleep(0.001)
        if mid_round() and open(records_path, "rb").read().endswith(b"\n"):
            return True
        os.kill(winner.pid, signal.SIGCONT)
        return False

    wait(frozen_mid_round, "no record committed mid-round")
    helpers = psutil.Process(winner.pid).children(recursive=True)
    os.kill(winner.pid, signal.SIGKILL)
    winner.wait()
    runs["orphans"] = helpers
    snap = {
        "rounds": _jsonl(rounds_path),
        "records": open(records_path, "rb").read(),
        "run": json.load(open(work / "run.json")),
        "estimate_s": _estimate_s(work),
        "build_dirs": sorted(n for n in os.listdir(work) if n.startswith("tmp-build-")),
    }
    # within seconds of the kill, none of the run's helpers (Prefect server, TVM workers) is left
    deadline = time.time() + 20
    while any(map(_alive, helpers)) and time.time() < deadline:
        time.sleep(0.2)
    snap["orphans"] = [" ".join(p.cmdline()[:4]) for p in helpers if _alive(p)]
    with sqlite3.connect(f"file:{work / 'mlflow.db'}?mode=ro", uri=True) as db:
        snap["mlflow_status"] = db.execute(
            "select status from runs where run_uuid = ?", (snap["run"]["mlflow_run_id"],)
        ).fetchone()[0]
    # an earlier run's work dir, for the bad-input tests (a real db, state, config, MLflow store)
    existing = home / "existing"
    shutil.copytree(work, existing, symlinks=True)
    (home / "existing.yaml").write_text(CONFIG.format(model=runs["model"], work=existing))
    # what a kill in the middle of a write would leave: half lines, a half-written state file
    with open(records_path, "ab") as f:
        f.write(snap["records"].splitlines()[-1][:100])
    with open(rounds_path, "ab") as f:
        f.write(b'{"round": 99, "task"')
    (work / "session.json.tmp999999").write_text('{"tasks": {')
    resume = _spawn(["tune", runs["cfg"], "--json"], home, "resume")
    runs["procs"].append(resume)
    return {
        "winner": winner,
        "loser": loser,
        "loser_err": loser_err,
        "late": late,
        "snap": snap,
        "resume": resume,
        "existing": existing,
        "existing_cfg": home / "existing.yaml",
    }


@pytest.fixture(scope="module")
def killed(runs):
    runs["thread"].join(900)
    if "error" in runs:
        raise runs["error"]
    assert "killed" in runs, "the kill-and-resume thread did not finish"
    return runs["killed"]


@pytest.fixture(scope="module")
def resumed(runs, killed):
    p = killed["resume"]
    try:
        p.wait(timeout=600)
    except subprocess.TimeoutExpired:
        _kill_group(p)
        raise
    out, err = open(runs["home"] / "resume.out").read(), open(runs["home"] / "resume.err").read()
    assert p.returncode == 0, err[-3000:]
    return json.loads(out.strip().splitlines()[-1]), err


# -- 2. measurement faults (in-process sessions; the racing runs tune meanwhile) --------------------------
@pytest.fixture(scope="module")
def measured_tiny(runs, tiny_model, tiny_tasks, cpu_target, tmp_path_factory):
    """The tiny model and its tasks, and a work dir whose default latencies are measured (no faults); after
    ``runs``, so that the racing runs tune meanwhile."""
    from dynatune.search.measure import MeasureConfig
    from dynatune.search.session import SearchConfig, TuningSession

    wd = tmp_path_factory.mktemp("measured")
    s = TuningSession(tiny_tasks, cpu_target, str(wd), search=SearchConfig(), measure=MeasureConfig())
    try:
        s.warm_up()
        s.measure_defaults()
    finally:
        s.close()
    return tiny_model, tiny_tasks, wd


def _session(measured_tiny, cpu_target, wd, trials_per_iter=4, timeout_s=30.0, build_fn=None, evaluator=None):
    """A session on the tiny model, with failing collaborators injected (``tests/faults.py``) if given."""
    from dynatune.search.builder import PersistentBuilder
    from dynatune.search.measure import MeasureConfig, make_runner
    from dynatune.search.session import SearchConfig, TuningSession

    faults.register()
    shutil.copytree(measured_tiny[2], wd)
    measure = MeasureConfig(adaptive=False, repeat=3, min_repeat_ms=5, timeout_s=timeout_s)
    builder = PersistentBuilder(2, timeout_sec=15, build_fn=build_fn) if build_fn else None
    return TuningSession(
        measured_tiny[1],
        cpu_target,
        str(wd),
        search=SearchConfig(trials_per_iter=trials_per_iter, population_size=32),
        measure=measure,
        builder=builder,
        runner=make_runner(measure, cpu_target, evaluator),
    )


def _records(wd, key) -> list:
    return [r["record"][1] for r in _jsonl(wd / "db" / "records.jsonl") if r["key"] == key]


def test_build_failures_are_recorded_and_a_task_that_never_builds_is_retired(
    measured_tiny, cpu_target, tmp_path, monkeypatch
):
    from dynatune.run.config import load_config
    from dynatune.run.tuner import Tuner
    from dynatune.tasks.run_writer import Tracker

    model, tasks, _ = measured_tiny
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    wd = tmp_path / "work"
    session = _session(
        measured_tiny,
        cpu_target,
        wd,
        trials_per_iter=2,  # retired after 3 batches: 6 candidates
        build_fn=faults.failing_build,
    )
    tuner = Tuner(session, "dynatune", budget_s=120, slot_s=20)
    try:
        rec = tuner.step()  # every candidate fails to build: the task is retired within the slot
        r = rec.result
        assert (
            r["exhausted"] and r["trials"] >= 6 and r["build_errors"] == r["trials"] and r["run_errors"] == 0
        )
        assert all("injected build failure" in e for e in r["errors"])
        assert r["note"].startswith("retired: the last") and "injected build failure" in r["note"]
        assert r["trials"] < 10  # retired after a few failed batches, not after a whole slot of them
        ctx = tuner.context()
        assert ctx.tasks[rec.task].exhausted
        assert tuner.scheduler.choose(ctx) not in (None, rec.task)  # tuning goes on with the other tasks
        assert next(b for b in tuner.belief_table() if b.task == rec.task).retired
    finally:
        tuner.close()
    key = tasks[rec.task].key
    assert _records(wd, key) == [[FAILED]] * r["trials"]  # one error record per candidate
    st = json.load(open(wd / "session.json"))["tasks"][key]
    assert st["exhausted"] and st["note"] == r["note"] and st["fail_streak"] >= 6  # a resume keeps it retired
    # the note reaches the MLflow run
    cfg = load_config(None, model=model.path, work_dir=str(wd))
    tracker = Tracker(cfg, model)
    tracker.log_round(rec)
    tracker.finish()
    tags = tracker.client.get_run(tracker.run_id).data.tags
    assert tags[f"retired.task{rec.task}"] == f"{rec.task_name}: {r['note']}"


def test_run_rounds_stops_when_every_task_is_retired(measured_tiny, cpu_target, tmp_path, monkeypatch):
    """The benches' round loop: one curve point and one callback per round, and it ends by itself."""
    from dynatune.run.tuner import Tuner

    session = _session(
        measured_tiny, cpu_target, tmp_path / "work", trials_per_iter=2, build_fn=faults.failing_build
    )
    tuner = Tuner(session, "round_robin", budget_s=600, slot_s=20)
    seen = []
    try:
        curve = tuner.run_rounds(seen.append)
    finally:
        tuner.close()
    assert len(curve) == len(seen) == len(tuner.rounds) >= 1
    assert curve == [(r.elapsed_s, r.estimated_latency_s) for r in seen]
    assert all(r.result["exhausted"] for r in seen) and tuner.elapsed_s < 600  # all retired, budget left


def test_crashing_and_hanging_workers_are_errors_and_get_restarted(
    measured_tiny, cpu_target, tmp_path, monkeypatch
):
    """A build worker that dies, a runner that crashes, a runner that hangs past measure.timeout_s: each
    candidate is an error record, the slot goes on, and the next candidates get fresh workers."""
    from dynatune.search.builder import build_and_export
    from dynatune.search.measure import adaptive_evaluator

    tasks = measured_tiny[1]
    wd = tmp_path / "work"
    s = _session(
        measured_tiny,
        cpu_target,
        wd,
        trials_per_iter=1,
        timeout_s=3,  # one candidate per batch
        build_fn=faults.dying_build,
        evaluator=faults.dying_evaluator,
    )
    try:
        r1 = s.tune(0, trials=1)  # 1. the build worker dies
        assert r1.trials == 1 and r1.build_errors == 1 and not r1.exhausted
        assert all("build failed" in e and "Subprocess terminated" in e for e in r1.errors), r1.errors
        s.builder.build_fn = build_and_export
        s.runner.inner.worker._start()  # the runner's worker process, started now to watch it
        runner = s.runner.inner.worker._proc
        r2 = s.tune(1, trials=1)  # 2. builds work again (a new build worker); the runner crashes
        assert r2.build_errors == 0 and r2.run_errors == 1, r2.errors
        assert all("Subprocess terminated" in e for e in r2.errors), r2.errors
        assert runner.poll() is not None  # that worker is dead
        s.runner.evaluator = faults.hanging_evaluator
        t0 = time.perf_counter()
        r3 = s.tune(0, trials=1)  # 3. the runner hangs: killed after measure.timeout_s
        assert r3.run_errors == 1 and all("Timeout, killed after 3" in e for e in r3.errors), r3.errors
        assert 3 <= time.perf_counter() - t0 < 60
        s.runner.evaluator = adaptive_evaluator
        # a fresh worker's first candidate (its start, TVM's import) can take over 3 s on busy cores
        s.runner.inner.timeout_sec = 30
        r4 = s.tune(1, trials=1)  # 4. fresh workers: the candidate builds and runs
        assert r4.build_errors == r4.run_errors == 0 and r4.repeats == 3 and math.isfinite(r4.best_after_s)
        assert not s.state(0).exhausted and not s.state(1).exhausted and s.state(1).fail_streak == 0
    finally:
        s.close()
    failed = _records(wd, tasks[0].key) + _records(wd, tasks[1].key)
    assert failed.count([FAILED]) == 3 and len(failed) == 4


# -- 3. bad input: one line, exit 2, nothing saved is touched ----------------------------------------------
def _bad_models(home) -> dict:
    import numpy as np
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    out = home / "bad_models"
    if out.exists():
        return {p.stem: p for p in out.iterdir()}
    out.mkdir()
    (out / "not_onnx.onnx").write_text("name,value\nbatch,1\n")
    data = (home / "tiny.onnx").read_bytes()
    (out / "truncated.onnx").write_bytes(data[: len(data) // 2])
    g = helper.make_graph(
        [helper.make_node("FancyNewOp", ["x"], ["y"], name="my_node")],
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4])],
    )
    onnx.save(
        helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]), str(out / "unsupported_op.onnx")
    )
    g = helper.make_graph(
        [helper.make_node("Reshape", ["x", "s"], ["y"], name="bad_reshape")],
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [7])],
        [numpy_helper.from_array(np.array([7], dtype=np.int64), "s")],
    )
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]), str(out / "bad_shapes.onnx"))
    make_tiny_onnx(str(out / "dynamic.onnx"), batch="N")
    return {p.stem: p for p in out.iterdir()}


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# id -> (extra CLI args, or a config text; what the message must say)
BAD_INPUTS = {
    "missing_model": (
        lambda h, m: ["--model", h / "nowhere" / "model.onnx"],
        r"model file not found: .*nowhere",
    ),
    "not_onnx": (
        lambda h, m: ["--model", m["not_onnx"]],
        r"not_onnx\.onnx is not (a readable )?(an )?ONNX model",
    ),
    "truncated_onnx": (
        lambda h, m: ["--model", m["truncated"]],
        r"truncated\.onnx is not a readable ONNX model",
    ),
    "unsupported_op": (
        lambda h, m: ["--model", m["unsupported_op"]],
        r"TVM cannot import op 'FancyNewOp' \(node 'my_node'\)",
    ),
    "shapes_tvm_cannot_infer": (
        lambda h, m: ["--model", m["bad_shapes"]],
        r"TVM could not import bad_shapes\.onnx at op 'Reshape'",
    ),
    "dynamic_dims_no_shape": (
        lambda h, m: ["--model", m["dynamic"]],
        r"input 'x' has dynamic dim 0 \('N'\) and no shape was given.*--shape x=1x3x16x16, any positive size",
    ),
    "shape_for_missing_input": (
        lambda h, m: ["--shape", "image=1x3x16x16"],
        r"shape given for input 'image', which tiny\.onnx does not have.*inputs are: x",
    ),
    "yaml_syntax_error": ("model: {path: [unclosed\n", r"YAML syntax error at line \d+, column \d+"),
    "unknown_key": (
        "budget: 10\nserach: {}\n",
        r"2 problems: budget: unknown key \(did you mean 'budget_s'\?\); "
        r"serach: unknown key \(did you mean 'search'\?\)",
    ),
    "zero_budget": (lambda h, m: ["--budget", "0"], r"budget_s: must be > 0, got 0(\.0)? "),
    "negative_slot": (lambda h, m: ["--set", "slot_s=-5"], r"slot_s: must be > 0, got -5"),
    "unknown_scheduler": (
        lambda h, m: ["--scheduler", "fastest"],
        r"scheduler\.name: must be one of dynatune, .* got 'fastest'",
    ),
    "unwritable_work_dir": (
        lambda h, m: ["--work-dir", h / "cfg.yaml" / "work"],
        r"work directory .*cfg\.yaml/work cannot be created: .*cfg\.yaml is a file",
    ),
    "unreachable_tracking_server": (
        lambda h, m: ["--set", f"tracking.uri=http://127.0.0.1:{_free_port()}"],
        r"MLflow tracking server http://127\.0\.0\.1:\d+ is unreachable",
    ),
    "different_config_same_work_dir": (
        lambda h, m: ["--scheduler", "round_robin"],
        r"work directory .*existing holds a run of a different config",
    ),
}


@pytest.mark.parametrize("case", list(BAD_INPUTS))
def test_bad_input_one_line_exit_2_nothing_touched(case, runs, killed):
    import re

    home, existing = runs["home"], killed["existing"]
    spec, expect = BAD_INPUTS[case]
    if callable(spec):
        args = ["tune", killed["existing_cfg"], *spec(home, _bad_models(home))]
    else:
        bad_cfg = home / f"{case}.yaml"
        bad_cfg.write_text(spec)
        args = ["tune", bad_cfg, "--work-dir", existing]
    before = _tree(existing)
    t0 = time.perf_counter()
    p = _cli([*args, "--json"], home, timeout=120)
    msg = _one_line_error(p)
    assert re.search(expect, msg), msg
    assert p.stdout == ""
    assert time.perf_counter() - t0 < 60  # found before Prefect starts and tuning begins
    assert _tree(existing) == before


# -- 1. kill -9 in the middle of a round, then the same command again -------------------------------------
def test_kill_mid_round_then_resume_loses_nothing(runs, killed, resumed):
    from mlflow import MlflowClient

    summary, err = resumed
    snap, work = killed["snap"], runs["work"]
    k = len(snap["rounds"])
    assert k >= 1
    # every record committed before the kill is still there, byte for byte, and the round in flight had some
    records = open(work / "db" / "records.jsonl", "rb").read()
    assert snap["records"].endswith(b"\n") and records.startswith(snap["records"])
    assert len(snap["records"].splitlines()) > sum(r["result"]["trials"] for r in snap["rounds"])
    # the torn lines left by a kill mid-write are gone; every line parses; nothing lost, nothing twice
    rounds = _jsonl(work / "rounds.jsonl")
    recs = _jsonl(work / "db" / "records.jsonl")
    assert rounds[:k] == snap["rounds"] and [r["round"] for r in rounds] == list(range(len(rounds)))
    assert len(rounds) > k  # the run went on from the next round
    assert len(recs) == len(snap["records"].splitlines()) + sum(r["result"]["trials"] for r in rounds[k:])
    assert f"resuming: estimate {snap['estimate_s'] * 1e3:.2f} ms, {k} rounds done" in err
    # round counter, tuning time, scheduler state and beliefs restored
    run = json.load(open(work / "run.json"))
    assert run["rounds_done"] == len(rounds) == summary["rounds"]
    # the scheduler decided every round after the coverage pass (whose first batches it does not choose)
    assert run["scheduler_state"]["decisions"] == sum(r["phase"] == "scheduler" for r in rounds)
    assert rounds[k]["elapsed_s"] > snap["rounds"][-1]["elapsed_s"] == snap["run"]["elapsed_s"]
    first = rounds[k]["belief"]  # the first belief row after the resume saw every earlier visit of its task
    assert first["visits"] == sum(r["task"] == rounds[k]["task"] for r in rounds[:k])
    states = json.load(open(work / "session.json"))["tasks"]
    tasks = json.load(open(work / "tasks.json"))
    for t in tasks:  # the belief model's input: one history point per round of the task
        assert len(states[t["key"]]["history"]) == sum(r["task"] == t["index"] for r in rounds), t
    # the estimate is no worse than at the kill
    assert summary["estimated_latency_ms"] <= snap["estimate_s"] * 1e3 * (1 + 1e-9)
    assert summary["estimated_latency_ms"] == pytest.approx(_estimate_s(work) * 1e3)
    # the killed run's helpers did not outlive it; its leftovers are cleaned up by the resume
    assert snap["orphans"] == []
    assert snap["build_dirs"] == [f"tmp-build-{killed['winner'].pid}"]  # what the kill left
    leftovers = [n for n in os.listdir(work) if ".tmp" in n or n.startswith("tmp-build-")]
    assert leftovers == [], leftovers
    # the same MLflow run is continued: RUNNING after the kill, FINISHED now; each round logged once
    assert snap["mlflow_status"] == "RUNNING"
    assert summary["mlflow_run_id"] == snap["run"]["mlflow_run_id"]
    client = MlflowClient(f"sqlite:///{work / 'mlflow.db'}")
    info = client.get_run(summary["mlflow_run_id"]).info
    assert info.status == "FINISHED"
    assert len(client.search_runs([info.experiment_id])) == 1
    wall = sorted(m.step for m in client.get_metric_history(info.run_id, "round_wall_s"))
    assert wall == list(range(len(rounds)))
    task_metric = {m.step: m.value for m in client.get_metric_history(info.run_id, "task")}
    assert task_metric == {r["round"]: r["task"] for r in rounds}
    untuned = client.get_metric_history(info.run_id, "untuned_estimate_ms")
    assert len(untuned) == 1 and untuned[0].step == 0  # logged once, not again by the resume
    assert untuned[0].value == pytest.approx(summary["initial_estimated_latency_ms"])


# -- 4. two runs on one work directory --------------------------------------------------------------------
def test_concurrent_runs_one_holds_the_lock_the_other_says_who(runs, killed, resumed):
    from mlflow import MlflowClient

    winner, loser = killed["winner"], killed["loser"]
    # two runs started at the same moment: one tuned, the other stopped with the holder's name
    assert loser.returncode == 2
    msg = killed["loser_err"].strip()
    assert len(msg.splitlines()) == 1 and "Traceback" not in msg, msg
    assert msg.startswith(f"error: work directory {runs['work']} is in use by pid {winner.pid} on "), msg
    assert msg.endswith("(wait for that run to finish, or use another --work-dir)")
    # a third run while the first was tuning: the same
    late = _one_line_error(killed["late"])
    assert f"is in use by pid {winner.pid} on " in late and "tune" in late
    # no database line is interleaved or corrupted, every record belongs to a known workload, and only one
    # MLflow run exists
    work = runs["work"]
    keys = {w["key"] for w in _jsonl(work / "db" / "workloads.jsonl")}
    assert keys and {r["key"] for r in _jsonl(work / "db" / "records.jsonl")} <= keys
    assert len(_jsonl(work / "db" / "workloads.jsonl")) == len(keys)
    client = MlflowClient(f"sqlite:///{work / 'mlflow.db'}")
    assert len(client.search_runs([client.get_experiment_by_name("dynatune/tiny").experiment_id])) == 1
