"""The `dynatune tasks` command: table and JSON, and its one-line errors."""

import json
import os
import subprocess
import sys

import pytest
from helpers import ROOT, light_model, make_tiny_onnx


def _cli(*args):
    env = dict(os.environ, PYTHONPATH=ROOT)
    return subprocess.run(
        [sys.executable, "-m", "dynatune.cli", *args], capture_output=True, text=True, env=env, timeout=300
    )


@pytest.mark.slow  # 5-7 s: the fast tier stays under 3 minutes on a Zen 4 core
def test_tasks_json_and_table(tmp_path):
    model = make_tiny_onnx(str(tmp_path / "tiny.onnx"))
    p = _cli("tasks", model, "--shape", "x=1x3x16x16", "--json")
    assert p.returncode == 0, p.stderr
    rows = json.loads(p.stdout)
    assert rows and {"name", "key", "weight", "flops"} <= set(rows[0])
    assert any(r["flops"] > 0 for r in rows)
    p = _cli("tasks", light_model("squeezenet"))
    assert p.returncode == 0, p.stderr
    assert "light_squeezenet:" in p.stdout and "fused_conv2d" in p.stdout


def test_tasks_errors_are_one_line(tmp_path):
    model = make_tiny_onnx(str(tmp_path / "tiny.onnx"))
    p = _cli("tasks", model)  # dynamic batch dim, no --shape
    assert p.returncode == 2
    assert p.stderr.strip().count("\n") == 0 and p.stderr.startswith("error: input 'x' has dynamic dim 0")
    p = _cli("tasks", model, "--shape", "x=1x3xbad")
    assert p.returncode == 2 and "bad shape" in p.stderr


def test_bench_help_prints_help_and_runs_nothing(capsys):
    import pytest

    from dynatune.cli import main

    for argv in (["bench", "replay", "--help"], ["bench", "live", "--help"]):
        with pytest.raises(SystemExit) as exc:
            main(argv)
        assert exc.value.code == 0
        out = capsys.readouterr().out
        assert out.startswith(f"usage: dynatune bench {argv[1]}") and "{" not in out.split("\n")[0][:30]
