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
