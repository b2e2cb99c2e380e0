"""The trace recorder: several search seeds per task, resumable after a kill, and refused on other
settings."""

import json

import pytest

from dynatune.bench.replay import replay
from dynatune.bench.traces import load_traces, record, traces_per_task
from dynatune.errors import DynatuneError
from dynatune.run.config import load_config
from dynatune.schedulers import make_scheduler


class Killed(Exception):
    pass


@pytest.mark.slow
def test_recorder_adds_seeds_resumes_after_a_kill_and_refuses_other_settings(tmp_path, tiny_onnx):
    cfg = load_config(
        None,
        [
            "search.trials_per_iter=4",
            "search.population_size=32",
            "measure.repeat=3",
            "measure.min_repeat_ms=5",
        ],
        model=tiny_onnx,
        shapes={"x": (1, 3, 16, 16)},
        work_dir=str(tmp_path / "unused"),
    )
    out, work = str(tmp_path / "tiny.json"), str(tmp_path / "work")
    doc = record(cfg, [0], 0.5, out, work, log=lambda m: None)
    assert traces_per_task(doc) == 1 and doc["seeds"] == [0]
    seed0 = [r["traces"][0] for r in doc["tasks"]]
    for t in seed0:
        assert t["seed"] == 0 and t["trace"][0] == [0.0, 0, t["default_s"]] and len(t["trace"]) >= 2

    def kill_after_first(message):
        raise Killed(message)

    with pytest.raises(Killed):  # killed after seed 1's first task was written
        record(cfg, [0, 1], 0.5, out, work, log=kill_after_first)
    on_disk = load_traces(out)
    assert [len(r["traces"]) for r in on_disk["tasks"]].count(2) == 1

    doc = record(cfg, [0, 1], 0.5, out, work, log=lambda m: None)  # goes on where it stopped
    assert traces_per_task(doc) == 2 and doc["seeds"] == [0, 1]
    assert [r["traces"][0] for r in doc["tasks"]] == seed0  # seed 0 was not recorded again
    assert all([x["seed"] for x in r["traces"]] == [0, 1] for r in doc["tasks"])
    assert json.loads(open(out).read()) == doc
    assert (
        replay(doc, make_scheduler("round_robin"), 5.0, 0.5).final
        <= replay(doc, make_scheduler("round_robin"), 0.0, 0.5).final
    )

    with pytest.raises(DynatuneError, match="other settings .*seconds_per_task"):
        record(cfg, [2], 1.0, out, work, log=lambda m: None)
