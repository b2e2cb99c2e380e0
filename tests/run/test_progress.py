"""The console says which stage runs as it starts, and a long stage says how long it has run."""

import time

from dynatune.run.config import load_config
from dynatune.run.progress import LiveView


def test_each_stage_is_announced_and_a_long_one_keeps_saying_so(capsys, tmp_path):
    cfg = load_config(None, work_dir=str(tmp_path / "work"))
    with LiveView(cfg, heartbeat_s=0.2) as view:
        view.on_stage("import", "model.onnx")
        view.on_stage("compile")
        time.sleep(0.75)
        view.on_stage("coverage pass")  # its rounds speak for it: no heartbeat
        time.sleep(0.5)
    lines = capsys.readouterr().err.splitlines()
    assert lines[:2] == ["import: model.onnx", "compile..."]
    beats = [x for x in lines if x.startswith("  compile: ")]
    assert 2 <= len(beats) <= 4 and beats[-1].endswith(" s")
    assert lines[-1] == "coverage pass..."  # nothing after it: the heartbeat stopped with the stage


def test_a_retune_says_whether_the_stop_it_carried_held_before_its_first_slot(capsys, tmp_path):
    """The console of a retune that carries its source's stop: whose checks count, over how many slots, and
    whether its own check before the first slot agreed (then tuning is over) or not (it tunes on)."""
    from types import SimpleNamespace as NS

    cfg = load_config(None, work_dir=str(tmp_path / "work"))
    carried = {"source": "runs/first", "streak": 3, "slots": 21.7, "reason": "..."}
    for agreed in (True, False):
        state = {"carried_stop": carried, "carried_check": {"stop": agreed}, "confirmed": {"t0": [1, 1]}}
        state["stop"] = {"elapsed_s": 0.0, "reason": "below the share"} if agreed else None
        run = NS(
            model=NS(name="m"), tasks=[0], cache_hit=False, warm_start=None, untuned_estimate_s=1e-3,
            rounds_done=0, elapsed_s=0.0, state=state,
        )  # fmt: skip
        with LiveView(cfg) as view:
            view.on_start(run)
    lines = capsys.readouterr().err.splitlines()
    said = [x for x in lines if x.startswith("runs/first stopped with the same tasks and stopping settings")]
    assert len(said) == 2 and all("its 3 checks in a row count here" in x for x in said)
    assert said[0].endswith(", over the 21.7 slots it had left, before its first slot agrees")
    assert said[1].endswith("before its first slot does not: tuning goes on, counting afresh")
    assert not any(x.startswith("stopped earlier") for x in lines)  # not a resumed run's stop
