"""No silent damage: every state file a run reads back is checked before anything is written; a torn last
line of a log is dropped with a warning, any other damage stops the run with one line naming the file (and
the line), exit 2, nothing rewritten; `dynatune repair` mends what can be mended; MLflow never gets a step
twice."""

import json
import logging
import os

import pytest
from helpers import make_tiny_onnx, run_cli

from dynatune.files import WorkDir
from dynatune.run.repair import repair_work_dir
from dynatune.run.workdir_state import check_work_dir_state, read_rounds
from dynatune.search.state_files import DamagedFile


def _round(n: int, task: int = 0, trials: int = 4, best: float = 1e-3) -> dict:
    result = {"trials": trials, "wall_s": 1.0, "build_errors": 0, "run_errors": 0, "best_after_s": best}
    return {"round": n, "task": task, "result": result, "elapsed_s": n + 1.0, "estimated_latency_s": 0.01}


def _lines(*objs) -> bytes:
    return b"".join(json.dumps(o).encode() + b"\n" for o in objs)


def _work_dir(tmp_path) -> WorkDir:
    """A work dir whose state is all well formed: 2 tasks, 3 rounds."""
    wd = WorkDir(str(tmp_path / "work"))
    os.makedirs(wd.db)
    with open(wd.config, "w") as f:
        json.dump({"budget_s": 10}, f)
    with open(wd.tasks, "w") as f:
        json.dump([{"index": i, "name": f"conv_{k}", "key": k} for i, k in enumerate(("ka", "kb"))], f)
    with open(wd.run_state, "w") as f:
        json.dump({"config_hash": "abc", "mlflow_run_id": "r1"}, f)
    with open(wd.session, "w") as f:
        json.dump({"tasks": {"ka": {"seconds": 2.0, "trials": 8, "default_s": 0.01, "history": []}}}, f)
    with open(wd.rounds, "wb") as f:
        f.write(_lines(_round(0), _round(1, task=1), _round(2)))
    return wd


def _tree(root) -> dict:
    out = {}
    for d, _, names in os.walk(root):
        for n in names:
            if n != ".lock":  # taken (and named) by every command: not state
                with open(os.path.join(d, n), "rb") as f:
                    out[os.path.relpath(os.path.join(d, n), root)] = f.read()
    return out


def test_a_torn_last_line_is_dropped_with_a_warning(tmp_path, caplog):
    wd = _work_dir(tmp_path)
    with open(wd.rounds, "ab") as f:
        f.write(b'{"round": 3, "task": 0, "res')  # a crash mid-write
    with caplog.at_level(logging.WARNING):
        rounds = read_rounds(wd.rounds)
        check_work_dir_state(wd.path)
    assert [r["round"] for r in rounds] == [0, 1, 2]
    warned = [r.getMessage() for r in caplog.records]
    assert any("rounds.jsonl line 4 was cut short" in m for m in warned), warned


DAMAGE = {  # what is written where -> what the one line must say
    "garbage_round": ("rounds", lambda b: b.replace(b'{"round": 1', b'#{"round": 1'), "line 2.*not JSON"),
    "garbage_last_round": ("rounds", lambda b: b + b"\x00\x00garbage\n", "line 4.*not JSON"),
    "round_without_task": ("rounds", lambda b: b.replace(b'"task": 1, ', b""), "line 2.*no 'task'"),
    "rounds_out_of_order": ("rounds", lambda b: b + _lines(_round(1)), "line 4.*round 1 follows round 2"),
    "garbage_record": ("records", lambda b: b + b"garbage\n" + _lines({"key": "ka", "record": []}), "line 1"),
    "session_not_json": ("session", lambda b: b[:20], "session.json is damaged: not JSON"),
    "session_bad_field": ("session", lambda b: b.replace(b'"trials": 8', b'"trials": "8"'), "'trials' is"),
    "config_not_json": ("config", lambda b: b"{budget_s: 10", "config.json is damaged: not JSON"),
    "tasks_not_a_list": ("tasks", lambda b: b"{}", "tasks.json is damaged: not a JSON array"),
    "run_state_not_json": ("run_state", lambda b: b"\x00" * 8, "run.json is damaged: not JSON"),
}


@pytest.mark.parametrize("case", list(DAMAGE))
def test_damage_stops_with_one_line_naming_the_file(case, tmp_path):
    import re

    wd = _work_dir(tmp_path)
    name, damage, expect = DAMAGE[case]
    path = getattr(wd, name)
    data = open(path, "rb").read() if os.path.exists(path) else b""
    with open(path, "wb") as f:
        f.write(damage(data))
    with pytest.raises(DamagedFile) as exc:
        check_work_dir_state(wd.path)
    msg = str(exc.value)
    assert "\n" not in msg and os.path.basename(path) in msg and re.search(expect, msg), msg
    assert "dynatune repair" in msg


def test_repair_drops_damaged_lines_keeps_a_copy_and_rebuilds_the_session(tmp_path):
    wd = _work_dir(tmp_path)
    with open(wd.rounds, "wb") as f:
        f.write(_lines(_round(0)) + b"garbage\n" + _lines(_round(2, task=1, best=5e-4)) + b'{"round": 3')
    rounds_before = open(wd.rounds, "rb").read()
    with open(wd.session, "w") as f:
        f.write('{"tasks": {"ka": ')
    with open(wd.records, "wb") as f:
        f.write(b"\xff\xfe not a record\n")
    done = repair_work_dir(wd.path)
    assert len(done) == 3, done
    assert "rounds.jsonl: dropped lines 2, 4" in done[0]
    assert open(wd.rounds + ".bak", "rb").read() == rounds_before  # nothing is lost
    rounds = read_rounds(wd.rounds)
    assert [r["round"] for r in rounds] == [0, 2]  # numbers kept: the next round is 3, a new MLflow step
    assert open(wd.records, "rb").read() == b""
    session = json.load(open(wd.session))["tasks"]
    assert session["ka"]["trials"] == 4 and session["kb"]["history"] == [[1.0, 4, 5e-4]]
    assert session["ka"]["default_s"] is None  # measured again by the next run
    check_work_dir_state(wd.path)  # the run goes on
    assert repair_work_dir(wd.path) == []  # nothing left to repair
    with pytest.raises(Exception, match="not a dynatune work directory"):
        repair_work_dir(str(tmp_path))


def test_repair_of_the_last_rounds_starts_a_new_mlflow_run(tmp_path):
    """All of rounds.jsonl garbage: the run starts again from round 0, in a new MLflow run (the old one
    has steps 0, 1 and 2 already)."""
    wd = _work_dir(tmp_path)
    with open(wd.rounds, "wb") as f:
        f.write(b"garbage\n" * 3)
    done = repair_work_dir(wd.path)
    assert read_rounds(wd.rounds) == [] and "dropped lines 1, 2, 3" in done[0]
    assert "new MLflow run" in done[1] and json.load(open(wd.run_state)) == {"config_hash": "abc"}
    assert json.load(open(wd.run_state + ".bak"))["mlflow_run_id"] == "r1"


def _cli(args, cwd, timeout=300):
    return run_cli(args, cwd, timeout)


@pytest.fixture
def tiny_work_dir(tmp_path):
    """A work dir that `dynatune compile` accepts (its config.json, for the tiny model) and its config."""
    from dynatune.run.config import load_config

    model = make_tiny_onnx(str(tmp_path / "tiny.onnx"), batch=1)
    work = tmp_path / "work"
    cfg_yaml = tmp_path / "cfg.yaml"
    cfg_yaml.write_text(f"model: {{path: {model}}}\nbudget_s: 2\nslot_s: 1\nwork_dir: {work}\n")
    cfg = load_config(str(cfg_yaml))
    wd = _work_dir(tmp_path)
    with open(wd.config, "w") as f:
        json.dump(cfg.to_record(), f)
    with open(wd.run_state, "w") as f:
        json.dump({"config_hash": cfg.config_hash()}, f)
    return wd, cfg_yaml


@pytest.mark.slow
@pytest.mark.parametrize(
    "name, damage, expect",
    [
        ("session", b'{"tasks": ', r"session\.json is damaged: not JSON"),
        ("rounds", _lines(_round(0)) + b"garbage\n" + _lines(_round(2)), r"rounds\.jsonl line 2 is damaged"),
        ("config", b"{", r"config\.json is damaged: not JSON"),
    ],
)
def test_compile_on_damaged_state_exits_2_and_rewrites_nothing(tiny_work_dir, name, damage, expect):
    import re

    wd, _ = tiny_work_dir
    with open(getattr(wd, name), "wb") as f:
        f.write(damage)
    before = _tree(wd.path)
    p = _cli(["compile", wd.path], os.path.dirname(wd.path))
    assert p.returncode == 2, p.stderr[-2000:]
    lines = p.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and re.search(expect, lines[0]), p.stderr
    assert _tree(wd.path) == before  # nothing rewritten (config.json was rewritten first before)


@pytest.mark.slow
def test_tune_on_a_damaged_round_exits_2_before_tuning(tiny_work_dir):
    wd, cfg_yaml = tiny_work_dir
    with open(wd.rounds, "ab") as f:
        f.write(b"garbage\n" + _lines(_round(3)))
    before = _tree(wd.path)
    p = _cli(["tune", str(cfg_yaml)], os.path.dirname(wd.path))
    assert p.returncode == 2, p.stderr[-2000:]
    lines = p.stderr.strip().splitlines()
    assert len(lines) == 1 and "rounds.jsonl line 4 is damaged" in lines[0], p.stderr
    assert _tree(wd.path) == before
    p = _cli(["repair", wd.path], os.path.dirname(wd.path))
    assert p.returncode == 0 and "dropped line 4" in p.stdout, p.stderr
    assert [r["round"] for r in read_rounds(wd.rounds)] == [0, 1, 2, 3]


@pytest.mark.slow
def test_mlflow_never_gets_a_step_twice(tiny_onnx, tmp_path):
    """A resumed run whose rounds are replayed (its work dir lost them) logs no step again."""
    from mlflow import MlflowClient

    from dynatune.run.callbacks import RunStart
    from dynatune.run.config import load_config
    from dynatune.run.pipeline import load_model
    from dynatune.run.tuner import RoundRecord
    from dynatune.tasks.tracking import MlflowCallback

    cfg = load_config(None, model=tiny_onnx, work_dir=str(tmp_path / "w"), shapes={"x": (1, 3, 16, 16)})
    wd = WorkDir(cfg.work_dir)
    os.makedirs(wd.path)
    with open(wd.tasks, "w") as f:
        json.dump([{"index": 0, "name": "conv_a", "key": "ka"}], f)
    model, state = load_model(cfg), {}

    def rec(n):
        return RoundRecord(n, 0, "conv_a", _round(n)["result"], {}, 0.01 - n * 1e-3, n + 1.0, 0.0, 1.0)

    for rounds in (range(2), range(3)):  # the second process replays rounds 0 and 1, then round 2
        cb = MlflowCallback()
        cb.on_start(RunStart(cfg, model, [], state, 0.02, 0, 0.0))
        for n in rounds:
            cb.on_round(rec(n))
        cb.tracker.finish()
    assert cb.tracker.resumed
    history = MlflowClient(cfg.tracking.uri).get_metric_history(cb.tracker.run_id, "estimated_latency_ms")
    assert sorted(m.step for m in history) == [0, 1, 2]
    assert {m.step: m.value for m in history}[2] == pytest.approx(8.0)
