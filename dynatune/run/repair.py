"""``dynatune repair WORK_DIR``: mend a work dir that a run refuses as damaged.

Every file it changes is first copied to ``NAME.bak`` (``NAME.bak1``, ... when that exists); nothing is
changed while a run holds the work dir.

- ``rounds.jsonl`` and the tuning database's logs (``db/workloads.jsonl``, ``db/records.jsonl``,
  ``db/measurements.jsonl``): damaged lines, and a torn last line, are dropped (the records of a dropped
  workload with it). The rounds kept keep their numbers: the next round follows the last one, so an
  MLflow step is never logged twice; when the last rounds were dropped, ``run.json`` forgets its MLflow
  run and the next run starts a new one.
- ``session.json``: rebuilt from ``tasks.json`` and ``rounds.jsonl`` (each task's seconds, trials,
  history and retirement); the next run measures the untuned latencies again.
- ``run.json``, ``tasks.json``, ``warm_start.json``, ``library.json``: set aside; the next run writes them
  again (it starts a new MLflow run, since ``run.json`` held the old run's id).
- ``config.json``: set aside; the next ``dynatune tune`` of the run's config writes it again.
"""

from __future__ import annotations

import math
import os
import shutil
from dataclasses import asdict

from dynatune.errors import DynatuneError
from dynatune.files import WorkDir, atomic_write_json
from dynatune.run.lock import WorkDirLock
from dynatune.run.workdir_state import check_round_line, read_rounds, read_run_state, read_tasks_file
from dynatune.search.session_state import TaskState, read_session_state
from dynatune.search.state_files import DamagedFile, read_json_file, scan_jsonl


def repair_work_dir(work_dir: str) -> list[str]:
    """Repair ``work_dir``; returns one line per change (empty when nothing was damaged)."""
    wd = WorkDir(work_dir)
    if not os.path.isdir(wd.path) or not any(
        os.path.exists(p) for p in (wd.config, wd.run_state, wd.session, wd.rounds, wd.records)
    ):
        raise DynatuneError(f"{work_dir} is not a dynatune work directory", "give the work_dir of a run")
    with WorkDirLock(wd.path):
        done = _repair_rounds(wd)
        done += _repair_database(wd)
        done += _repair_log(wd.measurements, _unreadable(scan_jsonl(wd.measurements)))
        for path, read in (
            (wd.config, lambda p: read_json_file(p, dict)),
            (wd.run_state, read_run_state),
            (wd.tasks, read_tasks_file),
            (wd.warm_start_done, lambda p: read_json_file(p, dict)),
            (wd.library_done, lambda p: read_json_file(p, dict)),
        ):
            done += _set_aside_if_damaged(path, read)
        done += _rebuild_session_if_damaged(wd)
    return done


def _unreadable(scan) -> set[int]:
    """The numbers of a log's lines a run cannot read: damaged, or a torn last line."""
    return {no for no, _ in scan.damaged} | ({scan.torn} if scan.torn is not None else set())


def _repair_rounds(wd: WorkDir) -> list[str]:
    """Drop damaged rounds (and rounds out of order: the first of each number is kept). When rounds at the
    end go, the next round's number goes back below steps the MLflow run already has: the next run then
    starts a new MLflow run."""
    scan = scan_jsonl(wd.rounds, check_round_line)
    drop, last = _unreadable(scan), -1
    for no, line in scan.lines:
        if line["round"] <= last:
            drop.add(no)
        else:
            last = line["round"]
    done = _repair_log(wd.rounds, drop)
    logged = drop - {scan.torn}  # a torn round never reached MLflow
    if logged and max(logged) > max((no for no, _ in scan.lines if no not in drop), default=0):
        done += _forget_mlflow_run(wd)
    return done


def _forget_mlflow_run(wd: WorkDir) -> list[str]:
    try:
        state = read_run_state(wd.run_state)
    except DamagedFile:
        return []  # set aside next: the next run starts a new MLflow run anyway
    run_id = state.pop("mlflow_run_id", None)
    if run_id is None:
        return []
    backup = _backup(wd.run_state)
    atomic_write_json(wd.run_state, state)
    return [
        f"{wd.run_state}: the next run starts a new MLflow run (run {run_id} has steps of rounds this work"
        f" dir no longer has; the old file is {backup})"
    ]


def _repair_database(wd: WorkDir) -> list[str]:
    """Drop the log lines a run cannot load (read with TVM, as a run reads them; the records of a damaged
    workload are damaged with it)."""
    from dynatune.search.database import TuningDatabase

    if not os.path.isdir(wd.db):
        return []
    damaged = TuningDatabase(wd.db, read_only=True, skip_damaged=True).damaged
    done = []
    for path in (wd.workloads, wd.records):
        done += _repair_log(path, {no for no, _ in damaged.get(path, [])} | _unreadable(scan_jsonl(path)))
    return done


def _repair_log(path: str, drop: set[int]) -> list[str]:
    """Rewrite a JSON-lines log without the lines ``drop`` (1-based), after a ``.bak`` copy."""
    if not drop:
        return []
    with open(path, "rb") as f:
        pieces = f.read().split(b"\n")
    kept = [raw + b"\n" for no, raw in enumerate(pieces[:-1], start=1) if no not in drop]
    backup = _backup(path)
    tmp = f"{path}.tmp{os.getpid()}"
    with open(tmp, "wb") as f:
        f.writelines(kept)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    lines = ", ".join(str(n) for n in sorted(drop))
    return [f"{path}: dropped line{'s' if len(drop) > 1 else ''} {lines} (the old file is {backup})"]


def _set_aside_if_damaged(path: str, read) -> list[str]:
    try:
        read(path)
        return []
    except DamagedFile as exc:
        backup = _backup(path)
        os.remove(path)
        return [f"{path}: {exc.reason}; set aside as {backup}, the next run writes it again"]


def _rebuild_session_if_damaged(wd: WorkDir) -> list[str]:
    try:
        read_session_state(wd.session)
        return []
    except DamagedFile as exc:
        reason = exc.reason
    tasks = read_tasks_file(wd.tasks) or []  # set aside above when damaged
    keys = {t["index"]: t["key"] for t in tasks}
    states = {key: TaskState() for key in keys.values()}
    for r in read_rounds(wd.rounds):  # repaired above
        key, res = keys.get(r["task"]), r["result"]
        if key is None:
            continue
        st = states[key]
        st.seconds += float(res.get("wall_s", 0.0))
        st.trials += int(res["trials"])
        st.errors += int(res.get("build_errors", 0)) + int(res.get("run_errors", 0))
        best = res.get("best_after_s")
        st.history.append([round(st.seconds, 4), st.trials, best if _finite(best) else None])
        st.exhausted, st.note = bool(res.get("exhausted")), str(res.get("note") or "")
    backup = _backup(wd.session)
    atomic_write_json(wd.session, {"tasks": {k: asdict(v) for k, v in states.items()}})
    return [
        f"{wd.session}: {reason}; rebuilt from {len(tasks)} tasks and their rounds (the old file is {backup};"
        " untuned latencies are measured again)"
    ]


def _finite(x) -> bool:
    return isinstance(x, (int, float)) and math.isfinite(x)


def _backup(path: str) -> str:
    backup, n = f"{path}.bak", 0
    while os.path.exists(backup):
        n += 1
        backup = f"{path}.bak{n}"
    shutil.copy2(path, backup)
    return backup
