"""A work dir's ``session.json``: each task's state between slots and processes (:class:`TaskState`: its
untuned latency, measured once; the tuning seconds and trials spent on it; its history of best latency
after every slot, what the belief model learns from; whether it was retired and why), keyed by task key.
Written whole and atomically after every slot; read strictly: a damaged file is named, with what is wrong
in it, never half-used."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

from dynatune.files import atomic_write_json
from dynatune.search.state_files import needs, read_json_file


@dataclass
class TaskState:
    seconds: float = 0.0
    trials: int = 0
    errors: int = 0
    default_s: float | None = None
    history: list = field(default_factory=list)  # [seconds, trials, best_s] after each slot
    exhausted: bool = False
    note: str = ""
    fail_streak: int = 0  # candidates in a row that failed to build or run (across slots and processes)


_NUMBER = (int, float)
_TASK_STATE_TYPES = {
    "seconds": _NUMBER,
    "trials": int,
    "errors": int,
    "default_s": (*_NUMBER, type(None)),
    "history": list,
    "exhausted": bool,
    "note": str,
    "fail_streak": int,
}


def read_session_state(path: str) -> dict[str, TaskState]:
    """``session.json``'s task states by task key ({} when there is none yet); raises
    :class:`~dynatune.search.state_files.DamagedFile` naming the file when it is not one."""
    doc = read_json_file(path, dict, _session_problem)
    return {key: TaskState(**st) for key, st in (doc or {}).get("tasks", {}).items()}


def _session_problem(doc: dict) -> str | None:
    tasks = doc.get("tasks", {})
    if not isinstance(tasks, dict):
        return "'tasks' is not an object"
    for key, st in tasks.items():
        if not isinstance(st, dict):
            return f"task {key} is not an object"
        if unknown := set(st) - set(_TASK_STATE_TYPES):
            return f"task {key} has unknown fields {sorted(unknown)}"
        types = {k: v for k, v in _TASK_STATE_TYPES.items() if k in st}
        if problem := needs(st, **types):
            return f"task {key}: {problem}"
        if any(not isinstance(h, list) or len(h) != 3 for h in st.get("history", [])):
            return f"task {key}: its history is not [seconds, trials, best] rows"
    return None


def write_session_state(path: str, states: dict[str, TaskState]) -> None:
    """``session.json`` written whole, atomically: the task states by task key."""
    atomic_write_json(path, {"tasks": {key: asdict(st) for key, st in states.items()}})
