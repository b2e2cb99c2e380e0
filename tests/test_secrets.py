"""Secrets stay secret: a tracking URI with a password goes through `tune`, `serve` and the registry
watcher, and the password is found nowhere they record: the work dirs, MLflow (params, tags, artifacts,
its store), Prefect (the local API database: flow-run and deployment parameters, logs), the output."""

import json
import os
import subprocess
import sys

import pytest
from helpers import ROOT, make_tiny_onnx, prefect_home
from servers import free_port, register_model, stop_process, wait_for

from dynatune.errors import DynatuneError
from dynatune.run.config import load_config, validate_dict
from dynatune.secrets import mask, mask_text, reference, resolve

PASSWORD = "pw-S3cr3t-4711"


# -- unit ------------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "url, masked",
    [
        (f"https://alice:{PASSWORD}@mlflow.example/x?a=1", "https://alice:***@mlflow.example/x?a=1"),
        (f"postgresql://bob:{PASSWORD}@db/mlflow", "postgresql://bob:***@db/mlflow"),
        (f"http://{PASSWORD}@127.0.0.1:5000", "http://***@127.0.0.1:5000"),
        (f"https://h/api?token={PASSWORD}&b=2", "https://h/api?token=***&b=2"),
        ("sqlite:////tmp/runs/mlflow.db", "sqlite:////tmp/runs/mlflow.db"),
        ("not a url", "not a url"),
        # reserved characters in the password: it ends at the last "@" that a host follows
        (f"http://alice:{PASSWORD}/x@host:5000/api", "http://alice:***@host:5000/api"),
        (f"http://alice:{PASSWORD}#x@host", "http://alice:***@host"),
        (f"http://alice:{PASSWORD}@x@host/p", "http://alice:***@host/p"),
        (f"mysql://alice:{PASSWORD}%2F?y@[::1]:3306/db", "mysql://alice:***@[::1]:3306/db"),
        (f"https://{PASSWORD}/+=@host", "https://***@host"),  # a token with "/" (base64)
        (
            f"postgresql+psycopg://u:{PASSWORD}@/db?host=/run/pg",
            "postgresql+psycopg://u:***@/db?host=/run/pg",
        ),
        # no scheme
        (f"alice:{PASSWORD}@host", "alice:***@host"),
        (f"alice:{PASSWORD}/#@host:5432/db", "alice:***@host:5432/db"),
        # text around URLs
        (f"see http://a:{PASSWORD}@h and bob:{PASSWORD}@db!", "see http://a:***@h and bob:***@db!"),
        # not secrets: left alone
        ("sqlite:////tmp/a:b@c/mlflow.db", "sqlite:////tmp/a:b@c/mlflow.db"),
        ("alice@example.com", "alice@example.com"),
        ("git@github.com:org/repo.git", "git@github.com:org/repo.git"),
        ("at 10:30 on 2024-01-01T10:30:00", "at 10:30 on 2024-01-01T10:30:00"),
    ],
)
def test_mask(url, masked):
    assert mask(url) == masked


def test_mask_text_masks_a_command_line():
    cmd = (
        f"dynatune tune --set tracking.uri=http://alice:{PASSWORD}/#@host "
        f"--set 'library.url=u:{PASSWORD}@db' --set tracking.tags.src=(x:{PASSWORD}@h) "
        f"--url bob:{PASSWORD}%@h2"
    )
    assert mask_text(cmd) == (
        "dynatune tune --set tracking.uri=http://alice:***@host --set 'library.url=u:***@db' "
        "--set tracking.tags.src=(x:***@h) --url bob:***@h2"
    )


def test_the_lock_and_its_in_use_error_hold_no_password(tmp_path, monkeypatch):
    from dynatune.run.lock import WorkDirLock

    monkeypatch.setattr(sys, "argv", ["dynatune", "tune", "--set", f"tracking.uri=http://a:{PASSWORD}/#@h"])
    with WorkDirLock(str(tmp_path)):
        assert PASSWORD not in (tmp_path / ".lock").read_text()
        with pytest.raises(DynatuneError) as err:
            WorkDirLock(str(tmp_path)).check_free()
        assert "is in use by pid" in str(err.value) and "tracking.uri=http://a:***@h" in str(err.value)
    # a lock held by an older dynatune, its command line in clear: the message masks it
    import fcntl

    old = {"pid": os.getpid(), "host": "h", "since": "t", "cmd": f"dynatune tune --url u:{PASSWORD}@db"}
    (tmp_path / ".lock").write_text(json.dumps(old))
    with open(tmp_path / ".lock") as held:
        fcntl.flock(held, fcntl.LOCK_EX)
        with pytest.raises(DynatuneError) as err:
            WorkDirLock(str(tmp_path)).acquire()
    assert "u:***@db" in str(err.value) and PASSWORD not in str(err.value)


def test_tags_are_recorded_masked_and_passed_as_references():
    tags = [f"tracking.tags.src=http://alice:{PASSWORD}/#@host/x", f"tracking.tags.db=bob:{PASSWORD}@dbhost"]
    cfg = load_config(None, tags)
    assert cfg.tracking.tags["db"] == f"bob:{PASSWORD}@dbhost"  # what the run has
    assert cfg.to_record()["tracking"]["tags"] == {"src": "http://alice:***@host/x", "db": "bob:***@dbhost"}
    passed = cfg.to_dict()
    assert PASSWORD not in repr(passed)
    assert passed["tracking"]["tags"]["db"] == "env:DYNATUNE_TRACKING_TAGS_DB"
    assert validate_dict(passed) == cfg


def test_log_records_are_masked_whichever_logger_writes_them():
    import logging

    from dynatune.secrets import mask_log_records

    mask_log_records()
    log = logging.getLogger("prefect.flow_runs.test")
    # the record as the logger makes it, what each of its handlers (Prefect's too) would be given: made, not
    # emitted, so however an earlier test's flow left Prefect's loggers in this process (levels, disabled,
    # filters, propagation) does not decide what the test sees
    try:
        raise RuntimeError(f"cannot reach http://a:{PASSWORD}@h")
    except RuntimeError:
        args = (f"bob:{PASSWORD}/x@db",)
        record = log.makeRecord(
            log.name, logging.ERROR, __file__, 0, "flow failed for %s", args, sys.exc_info()
        )
    text = logging.Formatter().format(record)
    assert "bob:***@db" in text and "http://a:***@h" in text and PASSWORD not in text


def test_mask_text_masks_urls_inside_messages():
    msg = f"MLflow tracking server https://a:{PASSWORD}@h:5000 is unreachable (refused)"
    assert PASSWORD not in mask_text(msg) and "https://a:***@h:5000" in mask_text(msg)


def test_env_references_resolve_and_fail_in_one_line(monkeypatch):
    monkeypatch.setenv("MY_URI", "https://u:p@h")
    assert resolve("env:MY_URI") == "https://u:p@h" and resolve("plain") == "plain"
    monkeypatch.delenv("MY_URI")
    with pytest.raises(DynatuneError, match="MY_URI, which is not set"):
        resolve("env:MY_URI", "tracking.uri")
    assert reference("sqlite:///x.db", "X") == "sqlite:///x.db"  # no credentials: passed as it is


def test_config_records_masked_and_passes_references(monkeypatch):
    uri = f"https://alice:{PASSWORD}@mlflow.example"
    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
    cfg = load_config(None, [f"prefect_api_url=http://p:{PASSWORD}@127.0.0.1:4200/api"])
    assert cfg.tracking.uri == uri  # what the run uses
    assert PASSWORD not in repr(cfg.to_record()) and cfg.to_record()["tracking"]["uri"] == mask(uri)
    passed = cfg.to_dict()  # what a Prefect flow parameter gets
    assert PASSWORD not in repr(passed) and passed["tracking"]["uri"].startswith("env:")
    assert validate_dict(passed) == cfg  # and what the flow makes of it


# -- end to end ------------------------------------------------------------------------------------
def _files_with(root, needle: bytes) -> list[str]:
    hits = []
    for d, _, files in os.walk(root):
        for f in files:
            p = os.path.join(d, f)
            try:
                with open(p, "rb") as fh:
                    if needle in fh.read():
                        hits.append(p)
            except OSError:
                pass
    return hits


@pytest.fixture(scope="module")
def mlflow_server(tmp_path_factory):
    d = tmp_path_factory.mktemp("mlflow-server")
    port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("MLFLOW_")}
    # no job consumer beside it (MLflow's background jobs, for GenAI evaluation): a huey process per
    # worker, 40 s of CPU over the suite for nothing this test reads
    env["MLFLOW_SERVER_ENABLE_JOB_EXECUTION"] = "false"
    log = open(d / "server.log", "w")
    proc = subprocess.Popen(
        [
            os.path.join(os.path.dirname(sys.executable), "mlflow"),
            "server",
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
            "--backend-store-uri",
            f"sqlite:///{d / 'store.db'}",
            "--default-artifact-root",
            str(d / "artifacts"),
            "--workers",
            "1",
        ],
        env=env,
        stdout=log,
        stderr=subprocess.STDOUT,
        cwd=str(d),
    )
    import urllib.request

    try:
        wait_for(
            lambda: urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2).read(),
            120,
            "the MLflow server",
            proc,
        )
        yield {"dir": d, "uri": f"http://alice:{PASSWORD}@127.0.0.1:{port}"}
    finally:
        stop_process(proc)
        log.close()


@pytest.mark.slow
def test_a_password_in_every_url_setting_and_in_tags_is_recorded_nowhere(
    mlflow_server, tmp_path, monkeypatch
):
    """One real short `dynatune tune` on the command line, with the password (and the reserved characters a
    password may hold) in every setting that takes a URL (a live Prefect API is left to the refusal tests):
    the tracking server's URI, the library's URL, and tags, with and without a scheme. Meanwhile the registry
    watcher tunes a registered version with the server's URI from the environment, and `serve` builds its
    deployments. The work dirs (their .lock too), the MLflow server's store and artifacts, Prefect's
    databases (flow-run and deployment parameters, logs), the console and `dynatune report` see only ***."""
    from concurrent.futures import ThreadPoolExecutor

    uri = mlflow_server["uri"]
    home = tmp_path / "prefect-home"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PREFECT_", "MLFLOW_"))}
    env.update(
        PYTHONPATH=ROOT,
        # the CLI tunes while the registry watcher does (below): each with its own Prefect home and schedule
        # library, both in tmp_path, which is searched for the password
        PREFECT_HOME=prefect_home(tmp_path / "prefect-home-cli"),
        PREFECT_SERVER_ANALYTICS_ENABLED="false",
    )
    prefect_home(home)
    model = make_tiny_onnx(str(tmp_path / "tiny.onnx"), batch=1)
    cfg = tmp_path / "tiny.yaml"
    cfg.write_text(
        f"model: {{path: {model}}}\nbudget_s: 2\nslot_s: 2\nwork_dir: {tmp_path / 'work'}\n"
        "search: {trials_per_iter: 4, population_size: 32}\n"
        "compile: {measure_untuned: false, measure_onnxruntime: false, profile: false}\n"
    )
    settings = [
        f"tracking.uri={uri}",
        f"library.url=sqlite:///{tmp_path / 'cli-library.db'}?password={PASSWORD}",
        f"tracking.tags.source=http://alice:{PASSWORD}/#@host/x",
        f"tracking.tags.database=bob:{PASSWORD}%@dbhost:5432/db",
    ]

    def cli(*a):
        return subprocess.run(
            [sys.executable, "-m", "dynatune.cli", *a],
            env=env,
            cwd=str(tmp_path),
            capture_output=True,
            text=True,
            timeout=900,
        )

    # tune: the CLI, as a user runs it (Prefect's local mode, MLflow on the server), in the background
    tune = ["tune", str(cfg), "--json"] + [a for s in settings for a in ("--set", s)]
    tuning = ThreadPoolExecutor(1)
    tuned = tuning.submit(cli, *tune)
    # the registry watcher: a registered version, tuned by the flow (a subflow run with its parameters)
    monkeypatch.setenv("PREFECT_HOME", str(home))
    monkeypatch.setenv("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
    monkeypatch.delenv("PREFECT_API_URL", raising=False)
    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)

    try:  # (MLflow's URIs, which register_model and the watcher set: conftest's mlflow_uris_restored)
        register_model(uri, "secret-net", model, str(mlflow_server["dir"] / "artifacts"))
        from dynatune.flows.watch_registry import watch_registry

        done = watch_registry(
            ["secret-net"], str(cfg), "env:MLFLOW_TRACKING_URI", work_root=str(tmp_path / "reg")
        )
        assert [d["status"] for d in done] == ["tuned"], done
        # serve: the deployments' parameters (what the Prefect UI shows)
        from dynatune.flows.serve import build_deployments

        deps = build_deployments([str(cfg)], watch=["secret-net"], tracking_uri=uri)
        assert all(PASSWORD not in repr(d.parameters) for d in deps)
        assert deps[-1].parameters["tracking_uri"].startswith("env:")
    finally:
        tuning.shutdown()  # waits for the CLI's run
    out = tuned.result()
    assert out.returncode == 0, out.stderr[-3000:]
    summary = json.loads(out.stdout.strip().splitlines()[-1])
    rep = cli("report", summary["mlflow_run_id"], "--tracking-uri", uri, "--out", str(tmp_path / "report"))
    assert rep.returncode == 0, rep.stderr[-3000:]
    from mlflow import MlflowClient

    tags = MlflowClient(uri).get_run(summary["mlflow_run_id"]).data.tags
    assert tags["source"] == "http://alice:***@host/x" and tags["database"] == "bob:***@dbhost:5432/db"
    for p in (out, rep):
        assert PASSWORD not in p.stdout + p.stderr
    assert os.path.exists(tmp_path / "cli-library.db")  # the library the command line named was used
    assert os.path.exists(tmp_path / "work" / ".lock")
    needle = PASSWORD.encode()
    assert _files_with(tmp_path, needle) == []  # work dirs, reports, Prefect's database and logs
    assert _files_with(mlflow_server["dir"], needle) == []  # MLflow's store: params, tags, artifacts
