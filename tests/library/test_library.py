"""The schedule library: the store on a real SQLite file (fingerprints, duplicates, export/import, prune,
concurrent writers, a writer killed mid-transaction), its CLI, and real tuning runs sharing it."""

import json
import math
import os
import signal
import subprocess
import sys
import textwrap

import pytest
from helpers import ROOT, make_tiny_onnx

from dynatune.errors import DynatuneError
from dynatune.files import WorkDir
from dynatune.library.store import LibraryRecord, ScheduleLibrary

FP = "llvm/znver3/2c|AMD EPYC|sse4_2+avx+avx2+fma"
OTHER = "llvm/znver5/2c|AMD EPYC 9005|sse4_2+avx+avx2+fma+avx512f"


def rec(key: str, trace: int, mean_s: float, kind: str = "conv2d", flops: float = 1e6) -> LibraryRecord:
    """A record shaped as TVM's JSON is (trace first, then run seconds); the store never parses it."""
    return LibraryRecord(
        key, kind, f"fused_{kind}_add", flops, ["wl", key], [[["insts"], [trace]], [mean_s]], mean_s
    )


@pytest.fixture
def lib(tmp_path):
    lib = ScheduleLibrary(f"sqlite:///{tmp_path}/lib.db")
    yield lib
    lib.close()


def test_top_records_are_per_fingerprint_best_first_one_per_schedule(lib):
    run = lib.start_run(FP, "m")
    assert (
        lib.add(
            FP,
            run,
            [
                rec("a", 1, 3e-3),
                rec("a", 2, 1e-3),
                rec("a", 3, 2e-3),
                rec("b", 1, 5e-3),
                rec("a", 4, float("inf")),
            ],
        )
        == 4
    )  # a failed candidate is not kept
    lib.add(FP, lib.start_run(FP, "m"), [rec("a", 2, 1.5e-3)])  # the same schedule measured by another run
    top = lib.top_records(FP, ["a", "b", "c"], 2)
    assert set(top) == {"a", "b"}
    workload, best = top["a"]
    assert workload == ["wl", "a"]
    assert [m for m, _ in best] == [1e-3, 2e-3]  # schedule 2 once (its best), then schedule 3
    assert best[0][1][0][1] == [2]
    # records of another kind of machine are never returned
    assert lib.top_records(OTHER, ["a", "b"], 2) == {}


def test_similar_tasks_are_the_same_pattern_closest_in_flops(lib):
    run = lib.start_run(FP, "m")
    lib.add(
        FP,
        run,
        [
            rec("near", 1, 2e-3, flops=2e6),
            rec("near", 2, 1e-3, flops=2e6),
            rec("far", 1, 1e-3, flops=1e9),
            rec("self", 1, 1e-3, flops=1e6),
            rec("dense", 1, 1e-3, kind="dense", flops=1e6),
        ],
    )
    got = lib.similar(FP, "fused_conv2d_add", 1e6, exclude={"self"}, tasks=2, per_task=1)
    assert [(w[1], r[0][1]) for w, r in got] == [("near", [2]), ("far", [1])]
    assert lib.similar(OTHER, "fused_conv2d_add", 1e6) == []


def test_adding_the_same_run_record_twice_keeps_one(lib):
    run = lib.start_run(FP, "m")
    assert lib.add(FP, run, [rec("a", 1, 1e-3)]) == 1
    assert lib.add(FP, run, [rec("a", 1, 1e-3)]) == 0
    assert lib.summary()["fingerprints"][0]["records"] == 1


def test_a_schedule_measured_again_by_the_same_run_keeps_its_fastest_measurement(lib):
    """As the run's own database does: its best latency is the minimum over a schedule's repeats, and the
    next run must start at it (a repeat measured faster was once dropped)."""
    run = lib.start_run(FP, "m")
    assert lib.add(FP, run, [rec("a", 1, 3e-3), rec("a", 1, 2e-3)]) == 1  # twice in one batch
    assert lib.add(FP, run, [rec("a", 1, 1e-3)]) == 1  # again, faster, in a later batch
    assert lib.add(FP, run, [rec("a", 1, 5e-3)]) == 0  # slower: nothing changes
    _, best = lib.top_records(FP, ["a"], 2)["a"]
    assert [m for m, _ in best] == [1e-3] and best[0][1][1] == [1e-3]
    assert lib.summary()["fingerprints"][0]["records"] == 1


def test_a_batch_without_its_workload_is_kept_under_the_one_sent_before(lib):
    run = lib.start_run(FP, "m")
    lib.add(FP, run, [rec("a", 1, 2e-3)])
    later = rec("a", 2, 1e-3)
    later.workload = None  # a run sends a task's workload with its first batch only
    assert lib.add(FP, run, [later]) == 1
    workload, best = lib.top_records(FP, ["a"], 2)["a"]
    assert workload == ["wl", "a"] and [m for m, _ in best] == [1e-3, 2e-3]


def test_summary_lists_fingerprints_tasks_records_runs(lib):
    lib.add(FP, lib.start_run(FP, "squeezenet"), [rec("a", 1, 1e-3), rec("b", 1, 1e-3, kind="dense")])
    lib.add(OTHER, lib.start_run(OTHER, "mnasnet"), [rec("a", 1, 1e-3)])
    held = {f["fingerprint"]: f for f in lib.summary()["fingerprints"]}
    assert held[FP]["tasks"] == 2 and held[FP]["records"] == 2 and held[FP]["runs"] == 1
    assert held[FP]["kinds"] == {"conv2d": 1, "dense": 1}
    assert held[FP]["newest_runs"][0]["model"] == "squeezenet"
    assert held[OTHER]["tasks"] == 1


def test_prune_keeps_each_tasks_best_schedules(lib):
    run = lib.start_run(FP, "m")
    lib.add(FP, run, [rec("a", i, (i + 1) * 1e-3) for i in range(10)] + [rec("b", 1, 1e-3)])
    lib.add(FP, lib.start_run(FP, "m"), [rec("a", 0, 5e-3)])  # a worse measurement of the best schedule
    assert lib.prune(keep=3) == 8
    best = lib.top_records(FP, ["a", "b"], 10)
    assert [m for m, _ in best["a"][1]] == [1e-3, 2e-3, 3e-3]
    assert len(best["b"][1]) == 1
    with pytest.raises(DynatuneError, match="at least 1"):
        lib.prune(keep=0)


def test_export_then_import_carries_one_fingerprint(lib, tmp_path):
    lib.add(FP, lib.start_run(FP, "m"), [rec("a", 1, 1e-3), rec("a", 2, 2e-3)])
    lib.add(OTHER, lib.start_run(OTHER, "m"), [rec("z", 1, 1e-3)])
    path = str(tmp_path / "fp.jsonl")
    assert lib.export(FP, path) == 2
    other = ScheduleLibrary(f"sqlite:///{tmp_path}/other.db")
    got = other.import_file(path)
    assert got == {"fingerprint": FP, "tasks": 1, "records": 2, "skipped": 0}
    assert other.import_file(path)["skipped"] == 2  # importing twice adds nothing
    assert other.top_records(FP, ["a"], 5) == lib.top_records(FP, ["a"], 5)
    assert other.top_records(OTHER, ["z"], 5) == {}
    other.close()
    with pytest.raises(DynatuneError, match="holds nothing for fingerprint"):
        lib.export("nope", str(tmp_path / "x.jsonl"))


@pytest.mark.parametrize(
    "text, message",
    [
        ("", "not a dynatune library export"),
        ("not json\n", "not JSON lines"),
        ('{"format": "dynatune-library", "version": 99, "fingerprint": "x"}\n', "format version 99"),
        (
            '{"format": "dynatune-library", "version": 1, "fingerprint": "x"}\n'
            '{"record": {"task_key": "a"}}\n',
            "damaged",
        ),
    ],
)
def test_a_bad_import_file_is_one_line_and_adds_nothing(lib, tmp_path, text, message):
    lib.add(FP, lib.start_run(FP, "m"), [rec("a", 1, 1e-3)])
    bad = tmp_path / "bad.jsonl"
    bad.write_text(text)
    with pytest.raises(DynatuneError, match=message):
        lib.import_file(str(bad))
    assert lib.summary()["fingerprints"][0]["records"] == 1


def test_an_unreachable_library_is_one_line_without_its_password(tmp_path):
    with pytest.raises(DynatuneError) as err:
        ScheduleLibrary("postgresql+psycopg://tuner:hunter2@127.0.0.1:9/lib")
    assert "hunter2" not in str(err.value) and "tuner:***@127.0.0.1" in str(err.value)
    with pytest.raises(DynatuneError, match="not a database URL"):
        ScheduleLibrary("just words")
    not_db = tmp_path / "not.db"
    not_db.write_text("this is not a database" * 100)
    with pytest.raises(DynatuneError, match="cannot open the schedule library"):
        ScheduleLibrary(f"sqlite:///{not_db}")


WRITER = textwrap.dedent("""
    import os, signal, sys
    sys.path.insert(0, {root!r})
    from dynatune.library.store import LibraryRecord, ScheduleLibrary, records
    lib = ScheduleLibrary({url!r})
    name, batches = sys.argv[1], int(sys.argv[2])
    run = lib.start_run({fp!r}, name)
    for b in range(batches):
        lib.add({fp!r}, run, [LibraryRecord("k" + str(b % 7), "conv2d", "conv2d", 1e6, ["wl"],
                                            [[name, b, i], [1e-3]], 1e-3 + i * 1e-6) for i in range(25)])
    if len(sys.argv) > 3:  # die in the middle of a transaction
        with lib.engine.begin() as conn:
            conn.execute(records.insert().values(fingerprint={fp!r}, task_key="k0", run_id=run,
                                                 trace_hash="dying", mean_s=1e-3, record="[]", created=0.0))
            os.kill(os.getpid(), signal.SIGKILL)
""")


def _writer(tmp_path, url, name, batches, die=False):
    script = tmp_path / "writer.py"
    script.write_text(WRITER.format(root=ROOT, url=url, fp=FP))
    return subprocess.Popen([sys.executable, str(script), name, str(batches)] + (["die"] if die else []))


@pytest.fixture(scope="module")
def postgres():
    """A real PostgreSQL server on loopback, for this module."""
    from postgres import LoopbackPostgres

    with LoopbackPostgres() as pg:
        yield pg


@pytest.fixture(params=["sqlite", "postgresql"])
def shared_url(request, tmp_path, monkeypatch):
    """One library URL shared by several processes: a SQLite file, or the PostgreSQL server (password in
    ``PGPASSWORD``, as a farm passes it)."""
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path}/shared.db"
    pg = request.getfixturevalue("postgres")
    monkeypatch.setenv("PGPASSWORD", pg.password)
    lib = ScheduleLibrary(pg.url)
    with lib.engine.begin() as conn:  # each test starts from an empty library
        for table in ("dt_records", "dt_workloads", "dt_runs"):
            conn.exec_driver_sql(f"DELETE FROM {table}")
    lib.close()
    return pg.url


def test_two_concurrent_writers_lose_no_record_and_a_killed_one_loses_only_its_open_transaction(
    tmp_path, shared_url
):
    url = shared_url
    ScheduleLibrary(url).close()  # created once, as the first run would
    procs = [_writer(tmp_path, url, "one", 40), _writer(tmp_path, url, "two", 40)]
    assert [p.wait(timeout=300) for p in procs] == [0, 0]
    lib = ScheduleLibrary(url)
    assert lib.summary()["fingerprints"][0]["records"] == 2 * 40 * 25
    dying = _writer(tmp_path, url, "three", 2, die=True)
    assert dying.wait(timeout=300) == -signal.SIGKILL
    held = lib.summary()["fingerprints"][0]
    assert held["records"] == 2 * 40 * 25 + 2 * 25  # its committed batches are kept, the open one is not
    assert held["runs"] == 3
    lib.add(FP, lib.start_run(FP, "after"), [rec("k0", 99, 1e-3)])  # and the library is still writable
    lib.close()


def test_cli_show_export_import_prune(tmp_path, capsys):
    from dynatune.cli import main

    url = f"sqlite:///{tmp_path}/cli.db"
    lib = ScheduleLibrary(url)
    lib.add(FP, lib.start_run(FP, "squeezenet"), [rec("a", i, (i + 1) * 1e-3) for i in range(5)])
    lib.close()
    assert main(["library", "show", "--url", url]) == 0
    out = capsys.readouterr().out
    assert FP in out and "1 tasks (conv2d 1), 5 records, 1 runs" in out and "squeezenet" in out
    assert main(["library", "show", "--url", url, "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["fingerprints"][0]["records"] == 5
    path = str(tmp_path / "carry.jsonl")
    assert main(["library", "export", path, "--fingerprint", FP, "--url", url]) == 0
    assert "wrote 5 records" in capsys.readouterr().out
    url2 = f"sqlite:///{tmp_path}/cli2.db"
    assert main(["library", "import", path, "--url", url2]) == 0
    assert "imported 5 records (0 already here) of 1 tasks" in capsys.readouterr().out
    assert main(["library", "prune", "--keep", "2", "--url", url2]) == 0
    assert "deleted 3 records" in capsys.readouterr().out
    assert main(["library", "import", str(tmp_path / "missing.jsonl"), "--url", url2]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: cannot read library file") and err.count("\n") == 1


# -- real tuning runs sharing a library -------------------------------------------------------------------
def _config(model, work, *extra, budget=10):
    from dynatune.run.config import load_config

    return load_config(
        None,
        [
            "slot_s=2",
            "warmup_trials=4",
            "search.trials_per_iter=4",
            "search.population_size=16",
            "measure.repeat=2",
            "measure.min_repeat_ms=2",
            "compile.verify=false",
            "compile.profile=false",
            "measure_every_s=0",
            "anchors=false",  # ONNX Runtime's per-operator times: not what these tests look at
            *extra,
        ],
        model=model,
        budget=budget,
        work_dir=str(work),
    )


def assert_starts_at_first_runs_best(r, first):
    """Every task the first run measured starts at the best latency the first run measured for it."""
    from dynatune.search.database import TuningDatabase

    before = TuningDatabase(WorkDir(first.work_dir).db, read_only=True)
    measured = [t for t in r.tasks if before.num_records(t.key)]
    assert measured
    for t in measured:
        assert r.session.db.best_latency(t.key) == pytest.approx(before.best_latency(t.key), rel=1e-9), t.name


@pytest.fixture(scope="module")
def tuned_once(tmp_path_factory):
    """One run of a tiny model into a fresh library: what the next runs start from."""
    from dynatune.run.pipeline import run

    d = tmp_path_factory.mktemp("lib")
    url = f"sqlite:///{d}/library.db"
    model = make_tiny_onnx(str(d / "tiny.onnx"), batch=1, channels=8)
    summary = run(_config(model, d / "first", f"library.url={url}"))
    return d, url, model, summary


@pytest.mark.slow
def test_a_run_writes_its_records_and_the_next_run_starts_tuned(tuned_once):
    from dynatune.run.pipeline import TuningRun

    d, url, model, first = tuned_once
    assert first.library["matched_tasks"] == 0 and first.library["written_records"] > 0
    assert first.library["write_error"] is None
    report = open(WorkDir(first.work_dir).report_md).read()
    assert "Schedule library" in report and "this run wrote" in report
    with TuningRun(_config(model, d / "second", f"library.url={url}")) as r:
        got = r.library.report()
        held = ScheduleLibrary(url).summary()["fingerprints"]
        assert len(held) == 1 and got["fingerprint"] == held[0]["fingerprint"]
        assert got["matched_tasks"] == held[0]["tasks"] > 0 and got["seeded_records"] > 0
        assert_starts_at_first_runs_best(r, first)


@pytest.mark.slow
def test_records_of_another_kind_of_machine_are_not_used(tuned_once):
    from dynatune.run.pipeline import TuningRun

    d, url, model, _ = tuned_once
    with TuningRun(_config(model, d / "other", f"library.url={url}", f"library.fingerprint='{OTHER}'")) as r:
        assert r.library.report()["matched_tasks"] == 0
        assert r.session.db.num_records() == 0


@pytest.mark.slow
def test_a_run_with_the_library_off_neither_reads_nor_writes_it(tuned_once):
    from dynatune.run.pipeline import TuningRun

    d, url, model, _ = tuned_once
    before = ScheduleLibrary(url).summary()
    with TuningRun(_config(model, d / "off", f"library.url={url}", "library.enabled=false")) as r:
        assert r.library is None and r.session.db.num_records() == 0
        r.tuner.step()
    assert ScheduleLibrary(url).summary() == before


@pytest.mark.slow
def test_two_runs_share_a_library_on_postgresql_and_its_password_is_never_recorded(
    postgres, tmp_path, monkeypatch
):
    """The farm's set-up: a database server. The first run names the password in its URL (masked wherever
    it is recorded), the second takes it from PGPASSWORD; it is in no file of either run, MLflow's store
    included."""
    from dynatune.run.pipeline import TuningRun, run
    from dynatune.tasks.tracking import MlflowCallback

    model = make_tiny_onnx(str(tmp_path / "tiny.onnx"), batch=1, channels=8, seed=3)
    with_password = postgres.url.replace(f"{postgres.user}@", f"{postgres.user}:{postgres.password}@")
    first = run(  # a short run: it need only write some records
        _config(model, tmp_path / "first", f"library.url={with_password}", budget=4),
        callbacks=[MlflowCallback()],
    )
    assert first.library["written_records"] > 0 and first.library["write_error"] is None
    assert postgres.password not in first.library["url"] and "***" in first.library["url"]
    monkeypatch.setenv("PGPASSWORD", postgres.password)
    with TuningRun(_config(model, tmp_path / "second", f"library.url={postgres.url}")) as r:
        assert r.library.report()["matched_tasks"] > 0
        assert_starts_at_first_runs_best(r, first)
    leaks = [
        os.path.join(d, f)
        for d, _, files in os.walk(tmp_path)
        for f in files
        if postgres.password.encode() in open(os.path.join(d, f), "rb").read()
    ]
    assert leaks == []


def test_nightly_retunes_and_registry_runs_use_the_library_by_default(tmp_path):
    from dynatune.flows.watch_registry import version_config
    from dynatune.run.config import load_config, validate_dict
    from dynatune.run.pipeline import retune_config

    cfg = load_config(None, work_dir=str(tmp_path / "w"))
    assert cfg.library.enabled and cfg.library.url is None
    assert retune_config(cfg).library == cfg.library
    d = version_config(
        cfg.to_dict(), "resnet", "3", str(tmp_path / "m.onnx"), str(tmp_path / "v3"), "sqlite:///x.db", None
    )
    assert validate_dict({k: v for k, v in d.items() if k != "_source"}).library.enabled
    # a URL with a password is passed on as a reference to the environment, never as text
    cfg = load_config(
        None, ["library.url=postgresql+psycopg://tuner:pw123@db.internal/lib"], work_dir=str(tmp_path)
    )
    assert "pw123" not in json.dumps(cfg.to_dict()) and "pw123" not in json.dumps(cfg.to_record())


@pytest.mark.parametrize(
    "old, extent, inner, want",
    [
        ([4, 7, 2], 56, -1, [4, 7, 2]),  # fits as it is
        ([2, 7, 4], 112, -1, [4, 7, 4]),  # a longer loop: the outermost tile takes the rest
        ([1, 16, 8], 24, -1, [1, 3, 8]),  # inner tiles kept where they divide, shrunk where not
        ([1, 1, 64], 96, 16, [6, 1, 16]),  # the innermost tile stays within max_innermost
        ([3, 5], 7, -1, [7, 1]),  # a prime extent
    ],
)
def test_refit_tiles_keeps_the_inner_tiles_and_multiplies_to_the_extent(old, extent, inner, want):
    from dynatune.library.transfer import refit_tiles

    got = refit_tiles(old, extent, inner)
    assert got == want and math.prod(got) == extent


def test_task_pattern_leaves_the_shapes_out():
    from dynatune.library.transfer import task_pattern

    assert (
        task_pattern("fused_conv2d7_add4_relu41")
        == task_pattern("fused_conv2d_add_relu1")
        == "fused_conv2d_add_relu"
    )
    assert task_pattern("fused_matmul3_add2") == "fused_matmul_add" != task_pattern("fused_conv2d_add")


@pytest.mark.slow
def test_a_new_task_gets_a_first_batch_transferred_from_similar_library_tasks(tuned_once):
    """The same network, twice as wide: no key matches, and the convolutions' first batches start with the
    narrow network's best schedules, refitted to the new shapes, next to the search's own candidates."""
    from dynatune.run.pipeline import TuningRun

    d, url, _, _ = tuned_once
    wide = make_tiny_onnx(str(d / "wide.onnx"), batch=1, channels=16)
    with TuningRun(_config(wide, d / "wide", f"library.url={url}")) as r:
        assert r.library.report()["transfer_tasks"] > 0
        while r.session.first_candidates and not r.tuner.done():
            r.tuner.step()
        got = r.library.report()
        analytic = {t.name: r.session.analytic_counts.get(t.key, 0) for t in r.session.tasks}
    assert got["transferred_tasks"] > 0
    batches = [b for b in got["transfer_first_batches"] if b["transferred"]]
    convs = [b for b in batches if "conv2d" in b["task"]]
    assert convs, batches
    # built and ran on the new shapes: pre-packed weights too (the candidates take the rewritten layout)
    assert all(b["transferred_best_s"] is not None for b in convs), convs
    # the analytic candidates head the batch, the transferred ones follow, then the rest: each counted as
    # what it is, and the transferred best compared with the best of the batch's own candidates
    assert any(b["analytic"] > 0 for b in convs)
    for b in batches:
        assert b["analytic"] == min(analytic[b["task"]], b["candidates"]), b
        assert b["analytic"] + b["transferred"] + b["searched"] == b["candidates"] <= r.cfg.warmup_trials, b
    assert all(b["search_best_s"] is not None for b in convs), convs
