"""Reading a work dir's state strictly: JSON documents and append-only JSON-lines logs.

Nothing damaged passes silently:

- a log's last line cut short (no newline: a crash mid-write) is dropped, with a warning;
- any other line that is not JSON, or not what the log holds, stops the run with one line that names
  the file and the line (:class:`DamagedFile`);
- a JSON document that is not JSON, or not what it should hold, stops the run naming the file.

``dynatune repair WORK_DIR`` (:mod:`dynatune.run.repair`) drops damaged lines and rebuilds what can be
rebuilt, keeping a ``.bak`` copy of every file it changes.
"""

from __future__ import annotations

import json
import logging
import os
from dataclasses import dataclass, field

from dynatune.errors import DynatuneError

log = logging.getLogger(__name__)
REPAIR_HINT = "`dynatune repair WORK_DIR` drops or rebuilds what is damaged, keeping a .bak copy"
_warned: set[tuple[str, int, int]] = set()  # (path, line, size) of torn lines already warned about


class DamagedFile(DynatuneError):
    """A work-dir file that is not what dynatune wrote there; ``line`` is 1-based (None: the whole file)."""

    def __init__(self, path: str, reason: str, line: int | None = None):
        self.path, self.line, self.reason = path, line, reason
        where = f"{path} line {line}" if line is not None else path
        super().__init__(f"{where} is damaged: {reason}", REPAIR_HINT)


@dataclass
class LogScan:
    """A JSON-lines log read line by line: its good lines, its damaged ones, and a torn last line."""

    path: str
    lines: list[tuple[int, dict]] = field(default_factory=list)  # (line number, object)
    damaged: list[tuple[int, str]] = field(default_factory=list)  # (line number, why)
    torn: int | None = None  # the number of a last line cut short

    def raise_if_damaged(self) -> None:
        if self.damaged:
            line, reason = self.damaged[0]
            more = f" (and {len(self.damaged) - 1} more lines)" if len(self.damaged) > 1 else ""
            raise DamagedFile(self.path, reason + more, line)


def scan_jsonl(path: str, check=None) -> LogScan:
    """Every line of a JSON-lines log; ``check(obj)`` returns why a parsed line is wrong, or None. A missing
    file is an empty log. Blank lines are skipped."""
    scan = LogScan(path)
    try:
        with open(path, "rb") as f:
            data = f.read()
    except FileNotFoundError:
        return scan
    except OSError as exc:
        raise DynatuneError(f"cannot read {path} ({exc.strerror})") from None
    pieces = data.split(b"\n")
    if pieces[-1]:
        scan.torn = len(pieces)
    for no, raw in enumerate(pieces[:-1], start=1):
        if not raw.strip():
            continue
        try:
            obj = json.loads(raw)
        except ValueError:
            scan.damaged.append((no, "not JSON"))
            continue
        problem = "not a JSON object" if not isinstance(obj, dict) else (check(obj) if check else None)
        if problem:
            scan.damaged.append((no, problem))
        else:
            scan.lines.append((no, obj))
    return scan


def read_jsonl(path: str, check=None, numbered: bool = False) -> list:
    """The lines of a JSON-lines log (``numbered``: as ``(line number, object)``); raises
    :class:`DamagedFile` on a damaged line, warns about (and drops) a torn last line."""
    scan = scan_jsonl(path, check)
    scan.raise_if_damaged()
    if scan.torn is not None:
        warn_torn(scan)
    return scan.lines if numbered else [obj for _, obj in scan.lines]


def warn_torn(scan: LogScan) -> None:
    key = (scan.path, scan.torn, os.path.getsize(scan.path))
    if key not in _warned:
        _warned.add(key)
        log.warning("%s line %d was cut short (a crash mid-write): dropped", scan.path, scan.torn)


def read_json_file(path: str, expect: type, check=None):
    """A JSON document of type ``expect`` (None when the file does not exist); ``check(obj)`` returns why it
    is wrong, or None. Raises :class:`DamagedFile` naming the file."""
    try:
        with open(path, "rb") as f:
            obj = json.loads(f.read())
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise DynatuneError(f"cannot read {path} ({exc.strerror})") from None
    except ValueError:
        raise DamagedFile(path, "not JSON") from None
    if not isinstance(obj, expect):
        raise DamagedFile(path, f"not a JSON {'object' if expect is dict else 'array'}")
    problem = check(obj) if check else None
    if problem:
        raise DamagedFile(path, problem)
    return obj


def needs(obj: dict, **types) -> str | None:
    """Why ``obj`` lacks one of the keys ``types`` names, or holds a value of another type (None: fine)."""
    for key, kind in types.items():
        if key not in obj:
            return f"no {key!r}"
        value = obj[key]
        if not isinstance(value, kind) or (isinstance(value, bool) and bool not in _types(kind)):
            return f"{key!r} is not {_type_name(kind)}"
    return None


def _types(kind) -> tuple:
    return kind if isinstance(kind, tuple) else (kind,)


def _type_name(kind) -> str:
    names = {int: "an integer", float: "a number", str: "a string", list: "a list", dict: "an object"}
    return " or ".join(names.get(k, "null" if k is type(None) else k.__name__) for k in _types(kind))
