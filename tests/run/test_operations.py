"""Operations: registry-triggered tuning, warm start across versions, compare, nightly deployments on a
real Prefect server, measurement through a TVM RPC tracker with two device servers.

All real: Prefect flows (local ephemeral mode, and a server started here on loopback), MLflow on SQLite
(tracking and Model Registry), TVM tuning of a tiny model with budgets of a few seconds.
"""

import json
import math
import os
import subprocess
import sys
import threading
import time
import urllib.request
from datetime import datetime, timezone

import pytest
from helpers import ROOT, make_tiny_onnx, prefect_home
from servers import free_port as _free_port
from servers import mlflow_uris_kept, register_model
from servers import stop_process as _stop
from servers import wait_for as _wait_for

pytestmark = pytest.mark.slow  # real tuning, servers or subprocesses

NAME = "tiny-net"
FAST = {
    "budget_s": 2,  # a round or two: the tests look at what was tuned and recorded, not how well
    "slot_s": 2,
    "search": {"trials_per_iter": 4, "population_size": 32},
    "measure": {"repeat": 3, "min_repeat_ms": 5},
    # the promotion's side-by-side timing: once, even beside the Prefect server these tests start
    "compile": {
        "measure_untuned": False,
        "measure_onnxruntime": False,
        "profile": False,
        "timing_attempts": 1,
    },
}


@pytest.fixture(scope="module")
def registry(tmp_path_factory, prefect_stack):
    """Two model versions registered one after the other, with watcher iterations in between.

    (It asks for ``prefect_stack`` only so that the Prefect server starts in the background meanwhile.)
    """
    d = tmp_path_factory.mktemp("registry")

    # everything set here is put back afterwards (MLflow's URIs by mlflow_uris_kept): later tests'
    # subprocesses copy this environment
    saved = {
        k: os.environ.get(k)
        for k in (
            "PREFECT_HOME",
            "PREFECT_API_URL",
            "PREFECT_SERVER_ANALYTICS_ENABLED",
            "PREFECT_LOGGING_LEVEL",
        )
    }
    with mlflow_uris_kept():  # (MLflow's URIs: register_model and the watcher set them)
        os.environ["PREFECT_HOME"] = prefect_home(d / ".prefect")  # Prefect's local mode, in a temp dir
        os.environ.pop("PREFECT_API_URL", None)
        os.environ.pop("MLFLOW_TRACKING_URI", None)
        os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
        os.environ.setdefault("PREFECT_LOGGING_LEVEL", "WARNING")
        try:
            from dynatune.flows.watch_registry import watch_registry

            uri = f"sqlite:///{d / 'mlflow.db'}"
            v1 = make_tiny_onnx(str(d / "v1.onnx"), batch=1, channels=8)
            v2 = make_tiny_onnx(str(d / "v2.onnx"), batch=1, channels=8, extra_layer=True)
            out = {"dir": d, "uri": uri, "v1_path": v1, "v2_path": v2}

            def watch():
                return watch_registry([NAME], dict(FAST), uri, work_root=str(d / "runs"))

            t0 = time.perf_counter()
            out["version1"] = register_model(uri, NAME, v1, str(d / "artifacts"))
            out["pass1"] = watch()  # tunes version 1
            from dynatune.tasks.registry import champion

            out["champion_after_pass1"] = champion(uri, NAME)  # version 2's pass may move it
            out["pass2"] = watch()  # nothing new
            out["version2"] = register_model(uri, NAME, v2, str(d / "artifacts"))
            out["pass3"] = watch()  # tunes version 2, warm-started from version 1
            out["wall_s"] = time.perf_counter() - t0
            yield out
        finally:
            for k, v in saved.items():
                if v is None:
                    os.environ.pop(k, None)
                else:
                    os.environ[k] = v


def test_new_model_version_triggers_a_tuning_run_linked_back(registry):
    from mlflow import MlflowClient

    uri, v1 = registry["uri"], registry["version1"]
    assert [(r["version"], r["status"]) for r in registry["pass1"]] == [(v1, "tuned")], registry["pass1"]
    run_id = registry["pass1"][0]["run_id"]
    client = MlflowClient(tracking_uri=uri, registry_uri=uri)
    run = client.get_run(run_id)
    assert run.info.status == "FINISHED"
    assert run.data.tags["model_version"] == v1 and run.data.tags["registered_model"] == NAME
    assert run.data.tags["trigger"] == "registry"
    assert client.get_experiment(run.info.experiment_id).name == f"dynatune/{NAME}"
    assert run.data.metrics["numerics_ok"] == 1.0
    # exactly that version was tuned: version 1's graph (5 tasks, with the NHWC transpose before its
    # classifier; its first convolution reads the NCHW input itself; version 2 adds a conv)
    work = registry["dir"] / "runs" / NAME / f"v{v1}"
    assert len(json.load(open(work / "tasks.json"))) == 5
    assert json.load(open(work / "config.json"))["model"]["version"] == v1
    # the tuned model is registered as version 1 of NAME-tuned, and the first one is the champion
    tuned = f"{NAME}-tuned"
    linked = registry["pass1"][0]
    assert linked["tuned_model"] == tuned and linked["promoted"] is True, linked
    assert linked["promotion_reason"] == "there was no champion"
    mv = client.get_model_version(tuned, linked["tuned_version"])
    assert mv.run_id == run_id
    assert str(registry["champion_after_pass1"]["version"]) == linked["tuned_version"]
    # linked both ways: the ONNX version names the tuned version and its run, and the other way round
    tags = client.get_model_version(NAME, v1).tags
    assert tags["dynatune.tuned_run_id"] == run_id and tags["dynatune.status"] == "tuned"
    assert tags["dynatune.tuned_model"] == tuned and tags["dynatune.tuned_model_version"] == str(mv.version)
    assert tags["dynatune.artifact_uri"] == f"runs:/{run_id}/tuned_model"
    assert float(tags["dynatune.latency_ms"]) > 0
    assert mv.tags["dynatune.source_model"] == NAME and mv.tags["dynatune.source_version"] == v1
    assert mv.tags["dynatune.tuned_run_id"] == run_id and mv.tags["dynatune.promoted"] == "true"
    assert client.get_run(run_id).data.tags["dynatune.tuned_model_version"] == f"{tuned}/{mv.version}"


def test_the_champion_alias_loads_the_tuned_model(registry):
    """``models:/NAME-tuned@champion`` is the tuned library, run by pyfunc: ONNX Runtime's outputs."""
    import mlflow
    import numpy as np
    import onnxruntime as ort

    from dynatune.tasks.registry import champion

    uri = registry["uri"]
    mlflow.set_tracking_uri(uri)
    mlflow.set_registry_uri(uri)
    model = mlflow.pyfunc.load_model(f"models:/{NAME}-tuned@champion")
    source = registry["v1_path"] if champion(uri, NAME)["source_version"] == registry["version1"] else None
    source = source or registry["v2_path"]
    x = np.random.default_rng(2).standard_normal((1, 3, 16, 16)).astype(np.float32)
    ref = ort.InferenceSession(source).run(None, {"x": x})[0]
    y = model.predict({"x": x})["y"]
    assert np.abs(y - ref).max() / np.abs(ref).max() <= 1e-4


def test_second_pass_does_not_retune_and_the_champion_moves_only_when_earned(registry):
    from mlflow import MlflowClient

    uri = registry["uri"]
    assert registry["pass2"] == []  # version 1 already tuned: nothing to do
    v2 = registry["version2"]
    assert [(r["version"], r["status"]) for r in registry["pass3"]] == [(v2, "tuned")], registry["pass3"]
    client = MlflowClient(tracking_uri=uri, registry_uri=uri)
    runs = client.search_runs([client.get_experiment_by_name(f"dynatune/{NAME}").experiment_id])
    assert sorted(r.data.tags["model_version"] for r in runs) == sorted([registry["version1"], v2])
    assert len(json.load(open(registry["dir"] / "runs" / NAME / f"v{v2}" / "tasks.json"))) == 6
    from dynatune.tasks.registry import champion

    # version 2 (one more conv) was timed side by side with version 1's tuned model: the champion moved
    # to it only if it was not slower, and either way its tuned version says why
    linked = registry["pass3"][0]
    tags = client.get_model_version(f"{NAME}-tuned", linked["tuned_version"]).tags
    assert tags["dynatune.promoted"] == str(linked["promoted"]).lower()
    assert tags["dynatune.promotion_reason"] == linked["promotion_reason"] != ""
    promotion = json.load(open(registry["dir"] / "runs" / NAME / f"v{v2}" / "report" / "promotion.json"))
    assert promotion["promoted"] == linked["promoted"] and promotion["ratio_vs_champion"] > 0
    if promotion["under_load"]:  # a timing under load never promotes
        assert not linked["promoted"] and "under load" in promotion["reason"]
    else:
        from types import SimpleNamespace

        from dynatune.compiler.promotion import is_slower

        timing = SimpleNamespace(
            ratio_median=promotion["ratio_vs_champion"],
            ratio_min=promotion["ratio_vs_champion_min"],
            ratio_max=promotion["ratio_vs_champion_max"],
            ratio=promotion["ratio_vs_champion_fastest"],
        )
        assert linked["promoted"] == (not is_slower(timing))
    expected = v2 if linked["promoted"] else registry["version1"]
    assert champion(uri, NAME)["source_version"] == expected


def test_a_slower_tuned_model_does_not_take_the_champion_alias(registry, tmp_path):
    """A new version whose tuned model is slower than the champion's (here: eight times the channels) is
    registered, tagged with why it was not promoted, and the champion stays."""
    from helpers import calm_policy
    from mlflow import MlflowClient

    from dynatune.compiler.compile import compile_and_verify
    from dynatune.machine.target import make_target
    from dynatune.model.importer import load_model
    from dynatune.run.summary import RunSummary
    from dynatune.tasks.registry import champion, link_tuned_version
    from dynatune.tasks.tuned_model import log_tuned_model

    uri = registry["uri"]
    before = champion(uri, NAME)
    wide = make_tiny_onnx(str(tmp_path / "wide.onnx"), batch=1, channels=64)
    version = register_model(uri, NAME, wide, str(registry["dir"] / "artifacts"))
    report = compile_and_verify(
        load_model(wide),
        make_target(),
        None,
        str(tmp_path / "model.so"),
        threads=2,
        measure_onnxruntime=False,
        measure_untuned=False,
    )
    client = MlflowClient(uri)
    run_id = client.create_run(client.get_experiment_by_name(f"dynatune/{NAME}").experiment_id).info.run_id
    info = log_tuned_model(report.artifact, run_id, uri)
    summary = RunSummary(
        mlflow_run_id=run_id,
        tuned_model_id=info.model_id,
        tuned_model_uri=f"runs:/{run_id}/tuned_model",
        artifact=report.artifact,
        numerics_ok=report.numerics_ok,
        work_dir=str(tmp_path),
    )
    # timed whatever the load (the Prefect server these tests start shares the cores): its speed decides
    linked = link_tuned_version.fn(uri, NAME, version, summary, calm_policy())
    assert linked["promoted"] is False and linked["promotion_reason"].startswith(
        "it is slower than the champion"
    )
    tags = client.get_model_version(f"{NAME}-tuned", linked["tuned_version"]).tags
    assert (
        tags["dynatune.promoted"] == "false"
        and tags["dynatune.promotion_reason"] == linked["promotion_reason"]
    )
    assert client.get_run(run_id).data.tags["dynatune.promoted"] == "false"
    assert champion(uri, NAME)["version"] == before["version"]  # the alias did not move
    assert json.load(open(tmp_path / "report" / "promotion.json"))["promoted"] is False


def _block_names(mod) -> set[str]:
    import re

    return set(re.findall(r'T\.s?block\("([^"]+)"', mod.script()))


def test_warm_start_across_versions(registry, cpu_target, tmp_path):
    """Version 2 (one extra conv) warm-started from version 1's work dir: matched tasks start at their old
    best latency, only the new task has no records; a matched task whose blocks version 2 names otherwise
    (the pooling's, after the model's variables) keeps its history but not records that would not replay."""
    from dynatune.model.extract import extract_tasks
    from dynatune.model.importer import load_model
    from dynatune.run.warmstart import warm_start
    from dynatune.search.measure import MeasureConfig
    from dynatune.search.session import SearchConfig, TuningSession

    d = registry["dir"]
    old_dir = str(d / "runs" / NAME / f"v{registry['version1']}")
    old_tasks = extract_tasks(load_model(registry["v1_path"]), cpu_target)
    new_tasks = extract_tasks(load_model(registry["v2_path"]), cpu_target)
    from dynatune.search.database import TuningDatabase

    old_db = TuningDatabase(os.path.join(old_dir, "db"), read_only=True)
    old_state = json.load(open(os.path.join(old_dir, "session.json")))["tasks"]
    old_best = {t.key: min(old_db.best_latency(t.key), old_state[t.key]["default_s"]) for t in old_tasks}
    assert any(old_db.num_records(k) for k in old_best)

    s = TuningSession(
        new_tasks,
        cpu_target,
        str(tmp_path / "v2"),
        search=SearchConfig(trials_per_iter=4, population_size=32),
        measure=MeasureConfig(repeat=3),
    )
    try:
        rep = warm_start(s, [old_dir])
        matched = [t for t in new_tasks if t.key in old_best]
        new = [t for t in new_tasks if t.key not in old_best]
        # the extra 1x1 conv is new; so is the pooling after it where the target's register blocks pad its
        # channels (AVX2: the mean slices them back, one kernel); every other task is version 1's
        assert any(t.name.startswith("fused_conv2d2") for t in new), [t.name for t in new]
        assert all(t.name.startswith(("fused_conv2d2", "fused_mean")) for t in new), [t.name for t in new]
        assert len(matched) == len(new_tasks) - len(new) >= len(old_tasks) - 1
        old_blocks = {t.key: _block_names(t.mod) for t in old_tasks}
        renamed = {t.key for t in matched if _block_names(t.mod) != old_blocks[t.key]}
        assert {t.name for t in matched if t.key in renamed} <= {"mean1"}
        kept = sum(old_db.num_records(t.key) for t in matched if t.key not in renamed)
        assert rep["matched_tasks"] == len(matched) and rep["records"] == kept
        for t in matched:
            assert s.state(t.index).history == old_state[t.key]["history"]
            if t.key in renamed:
                assert s.db.num_records(t.key) == 0
                continue
            assert s.best_latency(t.index) == pytest.approx(old_best[t.key], rel=1e-12), t.name
            assert s.db.num_records(t.key) == old_db.num_records(t.key)
        for t in new:
            assert s.db.num_records(t.key) == 0 and not s.state(t.index).history
            assert s.state(t.index).default_s is None  # still to be measured, then tuned
        # importing the same source again adds nothing
        assert warm_start(s, [old_dir])["records"] == 0
    finally:
        s.close()

    # and the registry-triggered run of version 2 was warm-started from version 1 the same way
    v2_dir = d / "runs" / NAME / f"v{registry['version2']}"
    assert old_dir in json.load(open(v2_dir / "warm_start.json"))
    st2 = json.load(open(v2_dir / "session.json"))["tasks"]
    for t in matched:
        assert st2[t.key]["history"][: len(old_state[t.key]["history"])] == old_state[t.key]["history"]


def test_compare_two_runs(registry, tmp_path):
    runs = [registry["pass1"][0]["run_id"], registry["pass3"][0]["run_id"]]
    out = tmp_path / "compare.png"
    env = dict(os.environ, PYTHONPATH=ROOT)
    p = subprocess.run(
        [
            sys.executable,
            "-m",
            "dynatune.cli",
            "compare",
            *runs,
            "--tracking-uri",
            registry["uri"],
            "--out",
            str(out),
        ],
        capture_output=True,
        text=True,
        timeout=300,
        env=env,
    )
    assert p.returncode == 0, p.stderr[-2000:]
    for rid in runs:
        assert rid[:8] in p.stdout
    assert "wrote" in p.stdout
    with open(out, "rb") as f:
        assert f.read(8) == b"\x89PNG\r\n\x1a\n"
    assert out.stat().st_size > 5000
    assert len(list(tmp_path.glob("*.png"))) == 1


# -- nightly deployments on a real Prefect server --------------------------------------------------
class PrefectStack:
    """A Prefect server on loopback and `dynatune serve` registered with it, started in the background
    (a thread waits for the server's /api/health, then starts `serve`), so both start while the
    registry tests tune."""

    def __init__(self, d):
        self.dir = d
        self.api = f"http://127.0.0.1:{_free_port()}/api"
        env = {k: v for k, v in os.environ.items() if not k.startswith(("PREFECT_", "MLFLOW_"))}
        env.update(
            PYTHONPATH=ROOT,
            PREFECT_HOME=prefect_home(d / "prefect-home"),
            PREFECT_SERVER_ANALYTICS_ENABLED="false",
            PREFECT_LOGGING_LEVEL="WARNING",
            PREFECT_SERVER_LOGGING_LEVEL="WARNING",
        )
        self.env = env
        self.cfg = d / "tiny.yaml"
        model = make_tiny_onnx(str(d / "tiny.onnx"), batch=1)
        self.cfg.write_text(f"model: {{path: {model}}}\nbudget_s: 4\nslot_s: 2\nwork_dir: {d / 'work'}\n")
        self.logs = [open(d / "server.log", "w"), open(d / "serve.log", "w")]
        port = self.api.split(":")[-1].split("/")[0]
        self.server = subprocess.Popen(
            [
                os.path.join(os.path.dirname(sys.executable), "prefect"),
                "server",
                "start",
                "--host",
                "127.0.0.1",
                "--port",
                port,
            ],
            env=env,
            stdout=self.logs[0],
            stderr=subprocess.STDOUT,
            cwd=str(d),
        )
        self.serve = self.deploy = None
        self.error = None
        self.thread = threading.Thread(target=self._start_serve, daemon=True)
        self.thread.start()

    def _start_serve(self):
        try:
            _wait_for(
                lambda: urllib.request.urlopen(self.api + "/health", timeout=2).read() == b"true",
                150,
                "the Prefect server's /api/health",
                self.server,
            )
            # prefect.yaml's deployments, as a cluster gets them: a process work pool + prefect deploy (first:
            # `serve` then re-registers watch_registry/watch-registry with its own parameters)
            prefect = os.path.join(os.path.dirname(sys.executable), "prefect")
            env = dict(self.env, PREFECT_API_URL=self.api)
            for cmd in (
                [prefect, "work-pool", "create", "dynatune", "--type", "process"],
                [prefect, "--no-prompt", "deploy", "--all"],
            ):
                self.deploy = subprocess.run(
                    cmd, env=env, cwd=ROOT, capture_output=True, text=True, timeout=180
                )
                if self.deploy.returncode != 0:
                    break
            self.serve = subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "dynatune.cli",
                    "serve",
                    str(self.cfg),
                    "--watch",
                    NAME,
                    "--tracking-uri",
                    f"sqlite:///{self.dir / 'mlflow.db'}",
                    "--every",
                    "5",
                ],
                env=env,
                stdout=self.logs[1],
                stderr=subprocess.STDOUT,
                cwd=str(self.dir),
            )
        except BaseException as exc:
            self.error = exc

    def ready(self):
        self.thread.join(180)
        if self.error:
            raise self.error
        assert self.serve is not None, "`dynatune serve` did not start"
        return self

    def stop(self):
        self.thread.join(180)
        for p in (self.serve, self.server):
            if p is not None:
                _stop(p)
        for f in self.logs:
            f.close()


@pytest.fixture(scope="module")
def prefect_stack(tmp_path_factory):
    stack = PrefectStack(tmp_path_factory.mktemp("prefect"))
    yield stack
    stack.stop()


def test_nightly_deployments_registered_on_prefect_server(prefect_stack):
    st = prefect_stack.ready()
    api, env, serve = st.api, st.env, st.serve
    nightly_name, watcher_name = "tune_model/nightly-retune-tiny", "watch_registry/watch-registry"

    def registered():
        d = _deployments(api, env, nightly_name, watcher_name)
        # registered, and the server's scheduler has planned the coming nightly runs
        return d if d[nightly_name]["runs"] else None

    deps = _wait_for(registered, 150, "the deployments served by `dynatune serve`", serve)
    nightly = deps[nightly_name]
    assert nightly["schedules"] == [
        {"cron": "0 2 * * *", "interval": None, "timezone": "UTC", "active": True}
    ]
    assert nightly["parameters"] == {"config": str(st.cfg), "retune": True}
    starts = [r["start"] for r in nightly["runs"]]
    # the runs still ahead wait for their night (one due at 02:00 UTC while the suite runs may have started)
    ahead = [r for r in nightly["runs"] if datetime.fromisoformat(r["start"]) > datetime.now(timezone.utc)]
    assert ahead and all(r["state"] == "Scheduled" for r in ahead)
    assert all(x.endswith("T02:00:00+00:00") for x in starts), starts  # every night at 02:00 UTC
    assert len(set(x[:10] for x in starts)) == len(starts)  # one per night
    watcher = deps[watcher_name]
    assert [s["interval"] for s in watcher["schedules"]] == [300.0]
    assert watcher["parameters"]["names"] == [NAME] and watcher["parameters"]["tracking_uri"].startswith(
        "sqlite"
    )
    # the watcher's first run is due right after start-up: `dynatune serve` runs it by itself
    runs = []

    def watcher_ran():
        runs[:] = _deployments(api, env, watcher_name)[watcher_name]["runs"]
        assert not any(r["state"] in ("Failed", "Crashed") for r in runs), runs
        return any(r["state"] == "Completed" for r in runs)

    try:
        _wait_for(watcher_ran, 180, "the served watcher's first run to complete", serve)
    except AssertionError as exc:
        raise AssertionError(f"{exc}; watcher runs: {runs[:3]}") from None


def test_prefect_yaml_deploys_to_a_process_work_pool(prefect_stack):
    st = prefect_stack.ready()
    assert st.deploy.returncode == 0, (st.deploy.stdout + st.deploy.stderr)[-3000:]
    name = "tune_model/nightly-retune-quickstart"
    nightly = _deployments(st.api, st.env, name)[name]
    assert nightly["work_pool"] == "dynatune" and nightly["entrypoint"] == "flows/tune_model.py:tune_model"
    assert nightly["schedules"] == [
        {"cron": "0 2 * * *", "interval": None, "timezone": "UTC", "active": True}
    ]
    assert nightly["parameters"] == {"config": "configs/quickstart.yaml", "retune": True}
    assert os.path.exists(os.path.join(ROOT, nightly["parameters"]["config"]))
    assert nightly["pull_steps"] == [
        {"prefect.deployments.steps.set_working_directory": {"directory": "{{ $DYNATUNE_HOME }}"}}
    ]
    # (the served watch_registry/watch-registry has since replaced prefect.yaml's, of the same name)
    out = " ".join(st.deploy.stdout.split())
    for dep in (name, "watch_registry/watch-registry"):
        assert f"Deployment '{dep}' successfully created" in out, out[-2000:]


_READ = r"""
import asyncio, json, sys
from prefect.client.orchestration import get_client
from prefect.client.schemas.filters import DeploymentFilter, DeploymentFilterId
from prefect.client.schemas.sorting import FlowRunSort

async def main(names):
    out = {}
    async with get_client() as c:
        for name in names:
            d = await c.read_deployment_by_name(name)
            runs = await c.read_flow_runs(
                deployment_filter=DeploymentFilter(id=DeploymentFilterId(any_=[d.id])),
                sort=FlowRunSort.EXPECTED_START_TIME_ASC, limit=20)
            out[name] = {
                "parameters": d.parameters,
                "schedules": [{"cron": getattr(s.schedule, "cron", None),
                               "interval": (s.schedule.interval.total_seconds()
                                            if hasattr(s.schedule, "interval") else None),
                               "timezone": getattr(s.schedule, "timezone", None), "active": s.active}
                              for s in d.schedules],
                "runs": [{"state": r.state_name, "start": r.expected_start_time.isoformat()} for r in runs],
                "work_pool": d.work_pool_name, "entrypoint": d.entrypoint, "pull_steps": d.pull_steps}
    print(json.dumps(out))

asyncio.run(main(sys.argv[1:]))
"""


def _client_query(api, env, *args):
    p = subprocess.run(
        [sys.executable, "-c", _READ, *args],
        env=dict(env, PREFECT_API_URL=api),
        capture_output=True,
        text=True,
        timeout=60,
    )
    if p.returncode != 0:
        raise RuntimeError(p.stderr[-1000:])
    return json.loads(p.stdout.strip().splitlines()[-1])


def _deployments(api, env, *names):
    return _client_query(api, env, *names)


# -- scale-out: measurements through a TVM RPC tracker and two device servers -----------------------
def test_rpc_tracker_farm_with_adaptive_measurement(cpu_target, tmp_path):
    from tvm import rpc
    from tvm.rpc.tracker import Tracker
    from tvm.s_tir.meta_schedule.runner import RPCRunner

    from dynatune.model.extract import extract_tasks
    from dynatune.model.importer import load_model
    from dynatune.search.measure import MeasureConfig, rpc_adaptive_evaluator
    from dynatune.search.session import SearchConfig, TuningSession

    tracker = Tracker(host="127.0.0.1", port=_free_port(), port_end=65000, silent=True)
    servers = []
    try:
        for _ in range(2):
            servers.append(
                rpc.Server(
                    host="127.0.0.1",
                    port=_free_port(),
                    port_end=65000,
                    key="farm",
                    silent=True,
                    tracker_addr=("127.0.0.1", tracker.port),
                )
            )

        def free_servers():
            q = rpc.connect_tracker("127.0.0.1", tracker.port).summary()["queue_info"].get("farm", {})
            return q.get("free", 0) == 2

        _wait_for(free_servers, 60, "two device servers registered with the tracker")
        model = load_model(make_tiny_onnx(str(tmp_path / "tiny.onnx"), batch=1))
        tasks = extract_tasks(model, cpu_target)
        mc = MeasureConfig(
            adaptive=True,
            min_repeat_ms=5,
            min_repeats=3,
            max_repeats=8,
            rpc={
                "tracker_host": "127.0.0.1",
                "tracker_port": tracker.port,
                "tracker_key": "farm",
                "max_workers": 2,
                "session_timeout_s": 60,
            },
        )
        s = TuningSession(
            tasks,
            cpu_target,
            str(tmp_path / "work"),
            search=SearchConfig(trials_per_iter=4, population_size=32),
            measure=mc,
        )
        try:
            assert type(s.runner.inner).__name__ == RPCRunner.__name__
            defaults = s.measure_defaults()
            assert all(math.isfinite(v) and v > 0 for v in defaults.values()), defaults
            i = max(range(len(tasks)), key=lambda k: defaults[k])
            r = s.tune(i, trials=4)
            # the adaptive evaluator is the one the RPC runner calls, with the task's incumbent for racing
            f = s.runner.inner.f_run_evaluator
            assert f.func is rpc_adaptive_evaluator and f.keywords["rel_tol"] == mc.rel_tol
            assert f.keywords["incumbent"] == pytest.approx(defaults[i])
        finally:
            s.close()
        assert r.trials >= 4 and r.run_errors == 0 and r.build_errors < r.trials, r.errors
        assert math.isfinite(r.best_after_s) and r.best_after_s <= r.best_before_s
        ok = r.trials - r.build_errors
        # adaptive: between min_repeats and max_repeats per candidate, but the race may stop one much slower
        # than the incumbent (e.g. measured beside another test worker) after its first repeat
        raced = r.stops.get("raced", 0)
        assert 3 * (ok - raced) + raced <= r.repeats <= 8 * ok, (r.repeats, r.stops)
        assert s.db.num_records(tasks[i].key) >= 4
    finally:
        for srv in servers:
            srv.terminate()
        tracker.terminate()


def test_retune_config_is_a_new_dated_run_warm_started_from_the_newest(tmp_path):
    """What each nightly run tunes: a new work dir, the same store, warm-started from the newest earlier
    run."""
    import datetime

    from dynatune.flows.tune_model import latest_run_dir, retune_config
    from dynatune.run.config import load_config

    base = tmp_path / "work"
    cfg_path = tmp_path / "c.yaml"
    cfg_path.write_text(
        f"work_dir: {base}\nwarm_start: [{tmp_path / 'older'}]\ntracking: {{tags: {{team: a}}}}\n"
    )
    cfg = load_config(str(cfg_path))
    assert latest_run_dir(str(base)) is None  # nothing tuned yet: no warm start from it
    night1 = datetime.datetime(2026, 1, 2, 2, 0, tzinfo=datetime.timezone.utc)
    r1 = retune_config(cfg, now=night1)
    assert r1.work_dir == str(base / "retune" / "20260102T020000Z")
    assert r1.warm_start == [str(tmp_path / "older")]
    assert r1.tracking.uri == cfg.tracking.uri and r1.tracking.experiment == cfg.tracking.experiment
    assert r1.tracking.tags == {"team": "a", "trigger": "retune", "retune_of": str(base)}
    assert r1.tracking.run_name is None  # the tracker names it: model, date and time, scheduler, "retune"
    assert r1.config_hash() == cfg.config_hash()  # same model, target, search: the same tuning problem

    def records(d):
        os.makedirs(d / "db", exist_ok=True)
        (d / "db" / "records.jsonl").write_text('{"key": "k", "record": []}\n')

    records(base)
    assert retune_config(cfg, now=night1).warm_start[-1] == str(base)
    records(base / "retune" / "20260102T020000Z")
    (base / "retune" / "20260103T020000Z").mkdir()  # a night that crashed before any record
    r3 = retune_config(cfg, now=night1 + datetime.timedelta(days=2))
    assert r3.warm_start == [str(tmp_path / "older"), str(base / "retune" / "20260102T020000Z")]
