import atexit
import os
import shutil
import sys
import tempfile

import pytest

TESTS = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(TESTS)
for _path in (ROOT, TESTS):  # the tests live in folders by concept; their shared helpers live here
    if _path not in sys.path:
        sys.path.insert(0, _path)
# measurement workers (separate processes) import dynatune too
os.environ["PYTHONPATH"] = ROOT + (
    os.pathsep + os.environ["PYTHONPATH"] if os.environ.get("PYTHONPATH") else ""
)

# Prefect's local API server can take longer than its default 20 s to start on a loaded 2-core machine
os.environ.setdefault("PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS", "180")

from helpers import cli_environment, make_tiny_onnx, make_winograd_cnn, prepare_prefect_home_template  # noqa: E402
from servers import mlflow_uris_kept  # noqa: E402

# The schedule library (on by default) is never the user's (~/.cache/dynatune): a session-wide one for
# session fixtures, one per module for module fixtures (a registry fixture's v2 run starts from its v1 run,
# as it would for a user), and one per test, so no test starts from another test's records.
_SESSION_LIBRARY = tempfile.mkdtemp(prefix="dynatune-library-")
atexit.register(shutil.rmtree, _SESSION_LIBRARY, True)  # (one was left in /tmp by every test session)
os.environ["DYNATUNE_LIBRARY_URL"] = f"sqlite:///{_SESSION_LIBRARY}/library.db"


# The test files that take longest (their tests' wall seconds in a run of the suite: bench.suite_cpu),
# longest first. pytest-xdist's ``--dist loadfile`` hands files to its workers in collection order
# (pyproject's addopts turn its reordering by test count off: that put these files, each a few long tests,
# last), so they start first and the many short files fill the end: neither worker idles long while the
# other finishes a long file.
LONGEST_FILES = [
    "tests/test_benchmarks.py",
    "tests/test_secrets.py",
    "tests/run/test_operations.py",
    "tests/run/test_pipeline.py",
    "tests/run/test_reliability.py",
    "tests/compiler/test_winograd_choice.py",
    "tests/compiler/test_vs_onnxruntime.py",
    "tests/bench/test_livebench.py",
    "tests/library/test_library.py",
    "tests/compiler/test_artifact.py",
    "tests/model/test_model.py",
]
# The files that read the session fixtures ``tiny_run`` (a real run: 90 s) and ``compiled_tiny`` (30 s): one
# unit of ``--dist loadfile`` (:func:`pytest_xdist_make_scheduler`), so one worker makes each fixture once.
SESSION_RUN_FILES = {
    "tests/test_benchmarks.py",  # both
    "tests/run/test_pipeline.py",  # tiny_run
    "tests/compiler/test_artifact.py",  # compiled_tiny, as the two below
    "tests/run/test_tracking.py",
    "tests/run/test_tuned_model.py",
}


def pytest_collection_modifyitems(session, config, items):
    """The longest files first (:data:`LONGEST_FILES`), the others in their order; each file's tests in
    theirs."""
    rank = {name: i for i, name in enumerate(LONGEST_FILES)}
    items.sort(key=lambda item: rank.get(item.nodeid.split("::")[0], len(rank)))


def pytest_xdist_make_scheduler(config, log):
    """``--dist loadfile`` with the :data:`SESSION_RUN_FILES` as one unit, handed to one worker where the
    first of them comes in the collection order. (``--dist loadgroup`` would group them by a mark, but does
    not under pytest 9: pytest-xdist 3.8 renames the tests through ``item._nodeid``, which pytest 9 no longer
    reads.)"""
    if config.getvalue("dist") != "loadfile":
        return None
    from xdist.scheduler import LoadFileScheduling

    class SessionRunFilesTogether(LoadFileScheduling):
        def _split_scope(self, nodeid: str) -> str:
            scope = super()._split_scope(nodeid)
            return "session-run-files" if scope in SESSION_RUN_FILES else scope

    return SessionRunFilesTogether(config, log)


def pytest_collection_finish(session):
    """The end-to-end tests (all in the slow tier) run Prefect in a migrated Prefect home
    (helpers.prefect_home): its template is built in the background while the first tests run."""
    if any(item.get_closest_marker("slow") for item in session.items):
        prepare_prefect_home_template()


@pytest.fixture(scope="session", autouse=True)
def tensor_intrinsics_imported_fast():
    """TVM's tensor intrinsics, imported the fast way (~1 s) once per test process, before any test: the
    first ``TuneContext`` a test makes would otherwise import them the slow way (60 s seen;
    dynatune.search.intrinsics says why), whichever test happens to run first in the process."""
    from dynatune.search.intrinsics import import_tensor_intrinsics

    import_tensor_intrinsics()


@pytest.fixture(scope="session", autouse=True)
def spare_tuning_workers():
    """The tuning sessions a test process opens hand their builder and runner workers on to the next
    (dynatune.search.spare_workers): each worker's TVM import is about 3 s of CPU, and in-process tests start
    about 170 of them in a run of the suite. Subprocesses (the CLI's runs) start their own, as a user's do."""
    from dynatune.search import spare_workers

    spare_workers.enable()


@pytest.fixture(autouse=True)
def mlflow_uris_restored():
    """MLflow's fluent URIs and their variables put back after each test (:func:`servers.mlflow_uris_kept`):
    a test that points MLflow at its server must not point the next tests of its process there."""
    with mlflow_uris_kept():
        yield


@pytest.fixture(scope="module", autouse=True)
def module_schedule_library(tmp_path_factory):
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("DYNATUNE_LIBRARY_URL", f"sqlite:///{tmp_path_factory.mktemp('library')}/library.db")
        yield


@pytest.fixture(autouse=True)
def per_test_schedule_library(tmp_path, monkeypatch):
    monkeypatch.setenv("DYNATUNE_LIBRARY_URL", f"sqlite:///{tmp_path}/schedule-library.db")


@pytest.fixture(scope="session")
def cpu_target():
    from dynatune.machine.target import make_target

    return make_target()


@pytest.fixture
def tiny_onnx(tmp_path):
    """A small conv net written with onnx.helper (conv-relu-conv-add-globalpool-gemm), a dynamic batch."""
    return make_tiny_onnx(str(tmp_path / "tiny.onnx"))


# The shared tiny models: made once per test session, read (never changed) by every test that takes them.
@pytest.fixture(scope="session")
def tiny_model(tmp_path_factory):
    """The tiny conv net (:func:`helpers.make_tiny_onnx`: batch 1, 8 channels) imported."""
    from dynatune.model.importer import load_model

    return load_model(make_tiny_onnx(str(tmp_path_factory.mktemp("tiny-model") / "tiny.onnx"), batch=1))


@pytest.fixture(scope="session")
def tiny_tasks(tiny_model, cpu_target):
    """:func:`tiny_model`'s tasks for this machine's CPU, as a run extracts them."""
    from dynatune.model.extract import extract_tasks

    return extract_tasks(tiny_model, cpu_target)


@pytest.fixture(scope="session")
def winograd_cnn(tmp_path_factory):
    """3x3 convolutions, some eligible for Winograd, imported (:func:`helpers.make_winograd_cnn`)."""
    import numpy as np

    from dynatune.model.importer import load_model

    return load_model(make_winograd_cnn(tmp_path_factory.mktemp("winograd"), np.random.default_rng(0)))


TINY_RUN_CONFIG = """
model: {{path: {model}, shapes: {{x: [1, 3, 16, 16]}}}}  # a dynamic batch, bound by the config
budget_s: 6
slot_s: 3
work_dir: {work}
search: {{trials_per_iter: 4, population_size: 32}}
measure: {{repeat: 3, min_repeat_ms: 5}}
# the final timing at once (waiting for a quiet machine is tests/machine/test_load.py's part); the untuned
# model's timing and the profile are tests/compiler/test_vs_onnxruntime.py's
compile: {{timing_attempts: 1, timing_processes: 1, measure_untuned: false, profile: false,
  # its 16->16 convolution at 16x16 would be a Winograd task (5 s to build a batch: one round in 6 s);
  # a run with Winograd is tests/compiler/test_winograd_choice.py's
  winograd: false}}
tracking: {{run_name: e2e, tags: {{purpose: test}}}}
"""


@pytest.fixture(scope="session")
def tiny_run(tmp_path_factory):
    """A finished ``dynatune tune`` of the tiny conv net (16 channels), as a user runs it (Prefect flow,
    MLflow on SQLite, real tuning, :func:`bench.harness.tune_cli`): ``{"dir", "config", "model", "work",
    "summary" (the ``--json`` line), "stderr", "static_model"}`` (``static_model``: the same model with its
    batch fixed at 1, as tuned). Tests read it; ``tests/run/test_pipeline.py`` resumes it with a larger
    budget (a finished run still)."""
    from bench.harness import tune_cli

    d = tmp_path_factory.mktemp("tiny-run")
    model = make_tiny_onnx(str(d / "tiny.onnx"), batch="N", channels=16)
    cfg, work = d / "cfg.yaml", d / "work"
    cfg.write_text(TINY_RUN_CONFIG.format(model=model, work=work))
    run = tune_cli(model, 6, str(work), str(cfg), env=cli_environment(d), cwd=str(d), timeout=900)
    return {
        "dir": d,
        "config": cfg,
        "model": model,
        "work": str(work),
        "summary": run.summary.to_dict(),
        "stderr": run.stderr,
        "static_model": make_tiny_onnx(str(d / "tiny-static.onnx"), batch=1, channels=16),
    }


@pytest.fixture(scope="session")
def compiled_tiny(tmp_path_factory, cpu_target):
    """The tiny model compiled untuned, checked and timed against ONNX Runtime as a run compiles its model:
    ``{"library": model.so, "metadata": model.json, "onnx": the model, "report": CompileReport}``."""
    from dynatune.compiler.compile import compile_and_verify
    from dynatune.model.importer import load_model

    d = tmp_path_factory.mktemp("compiled-tiny")
    onnx_path = make_tiny_onnx(str(d / "tiny.onnx"), batch=1, channels=8)
    report = compile_and_verify(
        load_model(onnx_path),
        cpu_target,
        None,
        str(d / "model.so"),
        threads=2,
        measure_untuned=False,
        repeat=2,
        timing_processes=1,
    )
    return {"library": report.artifact, "metadata": report.metadata, "onnx": onnx_path, "report": report}
