"""Input that is refused, or explained, in one line with exit status 2, and nothing created: a shape that
contradicts the model, a model given where the config goes, the hint for a dynamic dim (which must itself
work), a tracking store that does not exist, an unreachable Prefect API."""

import os
import re
import subprocess
import sys

from helpers import ROOT, make_tiny_onnx

PASSWORD = "pw-S3cr3t-4711"


def _cli(*args, cwd):
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PREFECT_", "MLFLOW_", "DYNATUNE_DEBUG"))}
    # a Prefect home of its own, never the user's; refused input never starts Prefect, so it need not be a
    # migrated one (helpers.prefect_home: 11 s for the first of the session)
    env.update(PYTHONPATH=ROOT, PREFECT_HOME=str(cwd / ".prefect"))
    return subprocess.run(
        [sys.executable, "-m", "dynatune.cli", *map(str, args)],
        capture_output=True,
        text=True,
        env=env,
        cwd=str(cwd),
        timeout=300,
    )


def _cli_at_once(calls, cwd) -> list:
    """``_cli(*args)`` for each args of ``calls``, the processes side by side; their results in that order."""
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(len(calls)) as pool:
        return list(pool.map(lambda args: _cli(*args, cwd=cwd), calls))


def _one_line(p) -> str:
    assert p.returncode == 2, (p.returncode, p.stderr[-2000:])
    msg = p.stderr.strip()
    assert len(msg.splitlines()) == 1 and msg.startswith("error: ") and "Traceback" not in msg, msg
    return msg


def test_a_shape_that_contradicts_a_static_dim_is_refused(tmp_path):
    model = make_tiny_onnx(str(tmp_path / "tiny.onnx"), batch=1)  # x: 1x3x16x16, all static
    work = tmp_path / "work"
    p = _cli("tune", "--model", model, "--shape", "x=1x4x16x16", "--work-dir", work, cwd=tmp_path)
    msg = _one_line(p)
    assert "gives dim 1 as 4, but the model fixes it at 3" in msg and "use --shape x=1x3x16x16" in msg
    assert not work.exists()


def test_a_model_given_where_the_config_goes_says_use_model(tmp_path):
    model = make_tiny_onnx(str(tmp_path / "tiny.onnx"), batch=1)
    os.link(model, tmp_path / "tiny.bin")  # an ONNX file by its content, whatever its name
    for given in ("tiny.onnx", "tiny.bin"):
        msg = _one_line(_cli("tune", given, cwd=tmp_path))
        assert msg.startswith(f"error: {given} is an ONNX model, not a YAML config"), msg
        assert f"use --model {given}" in msg
    assert not (tmp_path / "runs").exists()


def test_the_hint_for_a_dynamic_dim_is_a_shape_that_works(tmp_path):
    model = make_tiny_onnx(str(tmp_path / "dynamic.onnx"), batch="N")
    msg = _one_line(_cli("tasks", model, cwd=tmp_path))
    hint = re.search(r"--shape (\S+?),? ", msg)
    assert "dynamic dim 0 ('N')" in msg and hint, msg
    p = _cli("tasks", model, "--shape", hint.group(1), "--json", cwd=tmp_path)
    assert p.returncode == 0, p.stderr


def test_report_on_a_store_that_does_not_exist_creates_nothing(tmp_path):
    uris = (f"sqlite:///{tmp_path}/wrong/path/mlflow.db", f"{tmp_path}/wrong/mlruns")
    calls = [("report", "0123abcd", "--tracking-uri", uri) for uri in uris]
    calls += [("compare", "0123abcd", "4567ef01", "--tracking-uri", uri) for uri in uris]
    for args, p in zip(calls, _cli_at_once(calls, tmp_path)):
        assert f"no MLflow store at {args[-1]}" in _one_line(p), args
    assert not (tmp_path / "wrong").exists()


def test_an_unreachable_prefect_api_is_one_line_and_leaves_no_work_dir(tmp_path):
    import socket

    model = make_tiny_onnx(str(tmp_path / "tiny.onnx"), batch=1)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # nothing listens there
    work = tmp_path / "work"
    passwords = ("", f"alice:{PASSWORD}@", f"alice:{PASSWORD}/#@")  # in clear, then with reserved chars
    tune = ("tune", "--model", model, "--work-dir", work, "--set")
    calls = [(*tune, f"prefect_api_url=http://{pw}127.0.0.1:{port}/api") for pw in passwords]
    for password, p in zip(passwords, _cli_at_once(calls, tmp_path)):
        msg = _one_line(p)
        shown = re.escape(f"http://{'alice:***@' if password else ''}127.0.0.1:{port}/api")
        assert re.search(f"Prefect API (URL )?{shown} (is unreachable|does not parse)", msg), msg
        assert PASSWORD not in p.stdout + p.stderr
    assert not work.exists()  # by none of them
