"""File utilities shared by the work directory's writers: the work directory's layout (:class:`WorkDir`),
atomic JSON, and clean-up after a kill."""

from __future__ import annotations

import json
import os
from dataclasses import dataclass


@dataclass(frozen=True)
class WorkDir:
    """A run's work directory: every file and folder dynatune keeps there, named in this one place.

    ``WorkDir(path).rounds`` is ``<path>/rounds.jsonl``; a WorkDir is also a path (``os.fspath``). Nothing is
    created or read here: the writers are the modules each name points to.
    """

    path: str

    BUILD_DIR_PREFIX = "tmp-build-"  # + the pid of the process that builds there

    def __post_init__(self):
        object.__setattr__(self, "path", os.fspath(self.path))

    def __fspath__(self) -> str:
        return self.path

    def __str__(self) -> str:
        return self.path

    def _at(self, *parts: str) -> str:
        return os.path.join(self.path, *parts)

    # -- the run (dynatune.run) -----------------------------------------------------------------------
    @property
    def config(self) -> str:
        """``config.json``: the run's resolved config (what ``dynatune compile`` reads back)."""
        return self._at("config.json")

    @property
    def tasks(self) -> str:
        """``tasks.json``: the model's tuning tasks."""
        return self._at("tasks.json")

    @property
    def run_state(self) -> str:
        """``run.json``: the run's state (config hash, scheduler state, MLflow run id, measurements)."""
        return self._at("run.json")

    @property
    def anchors(self) -> str:
        """``anchors.json``: ONNX Runtime's time per task's operator, measured at the run's start."""
        return self._at("anchors.json")

    @property
    def rounds(self) -> str:
        """``rounds.jsonl``: one line per finished round."""
        return self._at("rounds.jsonl")

    @property
    def lock(self) -> str:
        """``.lock``: the flock that allows one run at a time (dynatune.run.lock)."""
        return self._at(".lock")

    @property
    def warm_start_done(self) -> str:
        """``warm_start.json``: the warm-start sources already imported."""
        return self._at("warm_start.json")

    @property
    def library_done(self) -> str:
        """``library.json``: what the schedule library seeded (a resumed run is not seeded twice)."""
        return self._at("library.json")

    @property
    def cache(self) -> str:
        """``cache/``: extracted tasks, keyed on model, shapes and target (dynatune.model.cache)."""
        return self._at("cache")

    @property
    def model_dir(self) -> str:
        """``model/``: a registered model version downloaded for tuning (flows/watch_registry.py)."""
        return self._at("model")

    @property
    def model_so(self) -> str:
        """``model.so``: the compiled model (the default artifact)."""
        return self._at("model.so")

    # -- the search (dynatune.search) -----------------------------------------------------------------
    @property
    def session(self) -> str:
        """``session.json``: each task's untuned latency, tuning seconds, trials, history and note."""
        return self._at("session.json")

    @property
    def cost_model(self) -> str:
        """``cost_model``: the search's cost model, saved between rounds."""
        return self._at("cost_model")

    @property
    def db(self) -> str:
        """``db/``: the tuning database (dynatune.search.database)."""
        return self._at("db")

    @property
    def workloads(self) -> str:
        """``db/workloads.jsonl``: every task's TVM workload (its records name it by task key)."""
        return self._at("db", "workloads.jsonl")

    @property
    def records(self) -> str:
        """``db/records.jsonl``: every measured candidate."""
        return self._at("db", "records.jsonl")

    @property
    def measurements(self) -> str:
        """``db/measurements.jsonl``: per measured candidate, the repeats used and why timing stopped."""
        return self._at("db", "measurements.jsonl")

    def build_dir(self, pid: int) -> str:
        """``tmp-build-<pid>``: process ``pid``'s candidate builds (removed after a kill)."""
        return self._at(f"{self.BUILD_DIR_PREFIX}{pid}")

    # -- the report -------------------------------------------------------------------------------------
    @property
    def report_dir(self) -> str:
        """``report/``: plots, markdown report, profile and summary."""
        return self._at("report")

    @property
    def summary(self) -> str:
        """``report/summary.json``: the run's summary (dynatune.run.summary.RunSummary)."""
        return self._at("report", "summary.json")

    @property
    def report_md(self) -> str:
        """``report/report.md``: the markdown report."""
        return self._at("report", "report.md")

    @property
    def convergence_png(self) -> str:
        """``report/convergence.png``: the estimate over tuning time."""
        return self._at("report", "convergence.png")

    @property
    def beliefs_png(self) -> str:
        """``report/beliefs.png``: each task's history and belief."""
        return self._at("report", "beliefs.png")

    @property
    def profile_json(self) -> str:
        """``report/profile.json``: the per-kernel profile (dynatune.compiler.profile writes it)."""
        return self._at("report", "profile.json")

    @property
    def profile_md(self) -> str:
        """``report/profile.md``: the profile as markdown."""
        return self._at("report", "profile.md")

    # -- MLflow's local store (when no tracking URI is set) -----------------------------------------------
    @property
    def mlflow_db(self) -> str:
        """``mlflow.db``: the SQLite MLflow store."""
        return self._at("mlflow.db")

    @property
    def mlartifacts(self) -> str:
        """``mlartifacts/``: that store's artifacts."""
        return self._at("mlartifacts")

    # -- retunes (dynatune.run.pipeline.retune_config) ----------------------------------------------------
    @property
    def retune_root(self) -> str:
        """``retune/``: the work dirs of this run's retunes."""
        return self._at("retune")

    def retune(self, stamp: str) -> str:
        """``retune/<stamp>``: the work dir of the retune started at ``stamp``."""
        return self._at("retune", stamp)


def cache_root(*parts: str) -> str:
    """dynatune's cache on this machine (the schedule library, roofline figures): ``$DYNATUNE_CACHE_DIR``,
    else ``~/.cache/dynatune``; ``parts`` name a path below it."""
    root = os.environ.get("DYNATUNE_CACHE_DIR") or os.path.join(os.path.expanduser("~"), ".cache", "dynatune")
    return os.path.join(root, *parts)


def atomic_write_json(path: str, obj) -> None:
    """Write JSON so that a kill leaves either the old or the new file, never half of one."""
    tmp = f"{path}.tmp{os.getpid()}"
    with open(tmp, "w") as f:
        json.dump(obj, f, default=lambda x: x.item() if hasattr(x, "item") else str(x))
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def remove_leftovers(work_dir: str) -> None:
    """Delete what a killed process left half-done: ``NAME.tmp<pid>`` files of :func:`atomic_write_json`
    and ``tmp-build-<pid>`` candidate directories, of processes that are no longer running."""
    import re
    import shutil

    wd = WorkDir(work_dir)
    for d in (wd.path, wd.report_dir):
        try:
            names = os.listdir(d)
        except OSError:
            continue
        for name in names:
            m = re.fullmatch(r".+\.tmp(\d+)|" + WorkDir.BUILD_DIR_PREFIX + r"(\d+)", name)
            if not m or _pid_alive(int(m.group(1) or m.group(2))):
                continue
            path = os.path.join(d, name)
            if os.path.isdir(path):
                shutil.rmtree(path, ignore_errors=True)
            else:
                try:
                    os.remove(path)
                except OSError:
                    pass


def _pid_alive(pid: int) -> bool:
    if pid == os.getpid():
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:  # exists, not ours
        return True
    return True
