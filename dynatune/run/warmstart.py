"""Warm start: begin a run from earlier runs' tuning records (same model, an older version, another model).

Tasks are matched by their stable key (structural hash of the PrimFunc). A matched task gets the earlier
records (so it starts at its best known latency and its search starts from those schedules), its untuned
latency (also when it was measured but never tuned there, so it is not measured again), and its history
(so its belief carries over). Only new or changed operators need real tuning.
Runs already warm-started from a directory are not imported twice.
"""

from __future__ import annotations

import os
from dataclasses import asdict

from dynatune.errors import DynatuneError
from dynatune.files import WorkDir, atomic_write_json
from dynatune.search.database import TuningDatabase
from dynatune.search.session_state import read_session_state
from dynatune.search.state_files import read_json_file


def warm_start(session, sources: list[str]) -> dict:
    keys = {t.key for t in session.tasks}
    done_path = WorkDir(session.work_dir).warm_start_done
    done = read_json_file(done_path, dict) or {}
    report = {"sources": [], "matched_tasks": 0, "records": 0}
    matched: set[str] = set()
    for src in sources:
        src = os.path.abspath(src)
        src_wd = WorkDir(src)  # an earlier run's work dir, or a bare tuning database
        db_dir = src_wd.db if os.path.isdir(src_wd.db) else src
        if not os.path.exists(os.path.join(db_dir, "records.jsonl")):
            raise DynatuneError(
                f"warm_start source {src} has no tuning records", "give an earlier run's work_dir"
            )
        if src in done:
            report["sources"].append({"path": src, "skipped": "already imported"})
            continue
        other = TuningDatabase(db_dir, read_only=True)
        n = session.import_records(other, keys & set(other.keys()))
        states = _states(src_wd.session)
        # matched: tuned there (records), or only measured there (its untuned latency is still valid)
        common = keys & (set(other.keys()) | set(states))
        for key in common:
            if states.get(key):
                session.adopt_progress(key, states[key])
        matched |= common
        done[src] = {"records": n, "tasks": len(common)}
        report["sources"].append({"path": src, "records": n, "tasks": len(common)})
        report["records"] += n
    report["matched_tasks"] = len(matched)
    session.save_state()
    atomic_write_json(done_path, done)  # a kill mid-write must not leave a file the next run cannot read
    return report


def _states(path: str) -> dict:
    return {key: asdict(st) for key, st in read_session_state(path).items()}
