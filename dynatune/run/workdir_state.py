"""A work dir's state, checked before a run writes anything there.

Every file a run reads back is read strictly (:mod:`dynatune.search.state_files`): a damaged one stops the
run with one line naming the file (and the line, in a log), before ``config.json`` or anything else is
rewritten. :mod:`dynatune.run.repair` mends what can be mended.
"""

from __future__ import annotations

from dynatune.errors import DynatuneError
from dynatune.files import WorkDir
from dynatune.search.database import check_record_line, check_workload_line
from dynatune.search.session_state import read_session_state
from dynatune.search.state_files import DamagedFile, needs, read_json_file, read_jsonl, scan_jsonl, warn_torn


def check_work_dir_state(work_dir: str) -> None:
    """Read every state file of ``work_dir`` (the tuning records as JSON; TVM reads them when the session
    opens, naming a line it cannot load); raises :class:`~dynatune.search.state_files.DamagedFile`."""
    wd = WorkDir(work_dir)
    read_json_file(wd.config, dict)
    read_tasks_file(wd.tasks)
    read_run_state(wd.run_state)
    read_json_file(wd.warm_start_done, dict)
    read_json_file(wd.library_done, dict)
    read_session_state(wd.session)
    read_rounds(wd.rounds)
    for path, check in ((wd.workloads, check_workload_line), (wd.records, check_record_line)):
        scan = scan_jsonl(path, check)
        scan.raise_if_damaged()
        if scan.torn is not None:
            warn_torn(scan)


def check_same_run(work_dir: str, config_hash: str) -> None:
    """Refuse (before anything is written) a work directory whose state is damaged, or that holds a run of
    a different config."""
    check_work_dir_state(work_dir)
    prev = read_run_state(WorkDir(work_dir).run_state).get("config_hash")
    if prev and prev != config_hash:
        raise DynatuneError(
            f"work directory {work_dir} holds a run of a different config",
            "use another --work-dir for a different model, target, scheduler or search",
        )


def read_run_state(path: str) -> dict:
    """``run.json`` ({} when there is none yet)."""
    return read_json_file(path, dict) or {}


def read_tasks_file(path: str) -> list[dict] | None:
    """``tasks.json``: the model's tasks as the run extracted them (None when there is none yet)."""
    return read_json_file(path, list, _tasks_problem)


def _tasks_problem(tasks: list) -> str | None:
    for i, t in enumerate(tasks):
        problem = "not an object" if not isinstance(t, dict) else needs(t, index=int, name=str, key=str)
        if problem:
            return f"task {i}: {problem}"
    return None


def read_rounds(path: str) -> list[dict]:
    """``rounds.jsonl``: every finished round, in order. A torn last line is dropped with a warning; any
    other damaged line (or one out of order) raises :class:`~dynatune.search.state_files.DamagedFile`
    naming the file and the line."""
    rounds, last = [], -1
    for no, line in read_jsonl(path, check_round_line, numbered=True):
        if line["round"] <= last:
            raise DamagedFile(path, f"round {line['round']} follows round {last}", no)
        last = line["round"]
        rounds.append(line)
    return rounds


def check_round_line(obj: dict) -> str | None:
    """Why a ``rounds.jsonl`` line is not a finished round (None: it is)."""
    number = (int, float)
    problem = needs(obj, round=int, task=int, result=dict, elapsed_s=number, estimated_latency_s=number)
    return problem or needs(obj["result"], trials=int)
