"""The tuning database: every measured record, durable on disk, served to MetaSchedule from memory.

Two append-only JSON-lines files in the work directory:

- ``workloads.jsonl``: one line per task (its key and the TVM workload JSON);
- ``records.jsonl``: one line per measured candidate (task key, trace, run seconds, target, args).

Lines are written with a single ``write`` on an ``O_APPEND`` file (a batch's records together), flushed
and fsync'ed before the call returns, so a record that ``commit`` or ``commit_many`` returned for survives
``kill -9``. One fsync per batch, not per record: about 1 ms each on the work dirs' disk here. A last
line cut short by a kill is dropped with a warning (and trimmed) when the file is next opened, so it can
never merge with the next line; any other damaged line stops the load, naming the file and the line
(:mod:`dynatune.search.state_files`).
Loading replays everything into a ``MemoryDatabase``, which is what the search and the compiler query.
"""

from __future__ import annotations

import json
import math
import os

from dynatune.errors import DynatuneError
from dynatune.search.state_files import DamagedFile, needs, read_jsonl, scan_jsonl, warn_torn

__all__ = ["FAILED", "JsonlWriter", "TuningDatabase", "mean_secs", "read_jsonl", "record_json"]

FAILED = 1e10  # run seconds recorded for a candidate that failed to build or run (as MetaSchedule does)


def _trim_partial_line(path: str) -> None:
    """Cut a trailing incomplete line (left by a kill mid-write)."""
    if not os.path.exists(path):
        return
    with open(path, "rb+") as f:
        f.seek(0, os.SEEK_END)
        size = f.tell()
        if size == 0:
            return
        f.seek(size - 1)
        if f.read(1) == b"\n":
            return
        # find the last newline and truncate after it
        pos = size - 1
        block = 4096
        while pos > 0:
            start = max(0, pos - block)
            f.seek(start)
            chunk = f.read(pos - start)
            nl = chunk.rfind(b"\n")
            if nl >= 0:
                f.truncate(start + nl + 1)
                return
            pos = start
        f.truncate(0)


def check_workload_line(obj: dict) -> str | None:
    """Why a ``workloads.jsonl`` line is not one (None: it is)."""
    return needs(obj, key=str, workload=list)


def check_record_line(obj: dict) -> str | None:
    """Why a ``records.jsonl`` line is not one (None: it is)."""
    return needs(obj, key=str, record=list)


class JsonlWriter:
    """Durable appends: one fsync'ed ``write`` per call, of one line or several."""

    def __init__(self, path: str):
        _trim_partial_line(path)
        self.path = path
        self.fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)

    def append(self, obj: dict) -> None:
        self.append_many([obj])

    def append_many(self, objs: list[dict]) -> None:
        data = "".join(json.dumps(obj, separators=(",", ":"), default=_plain) + "\n" for obj in objs).encode()
        view = memoryview(data)
        start = os.fstat(self.fd).st_size
        try:
            while view:  # a write may be short (a signal, a full disk): finish the line
                view = view[os.write(self.fd, view) :]
        except OSError:  # e.g. the disk is full: cut the half line, so the next append starts a clean one
            try:
                os.ftruncate(self.fd, start)
            except OSError:
                pass
            raise
        os.fsync(self.fd)

    def close(self) -> None:
        if self.fd is not None:
            os.close(self.fd)
            self.fd = None


class TuningDatabase:
    """Durable store of tuning records, keyed by task key; wraps a ``MemoryDatabase``."""

    def __init__(self, directory: str, read_only: bool = False, skip_damaged: bool = False):
        """``skip_damaged`` (read-only, for ``dynatune repair``): damaged lines are skipped and listed in
        :attr:`damaged` (path -> ``[(line, why)]``) instead of stopping the load."""
        from tvm.s_tir import meta_schedule as ms

        self.directory = directory
        self.workloads_path = os.path.join(directory, "workloads.jsonl")
        self.records_path = os.path.join(directory, "records.jsonl")
        self.memory = ms.database.MemoryDatabase(module_equality="structural")
        self._workloads: dict[str, object] = {}  # key -> ms Workload
        self._best: dict[str, float] = {}
        self._counts: dict[str, int] = {}
        self.damaged: dict[str, list[tuple[int, str]]] = {}
        self._load(skip_damaged)
        self.read_only = read_only
        if not read_only:
            try:
                os.makedirs(directory, exist_ok=True)
                self._wl_writer = JsonlWriter(self.workloads_path)
                self._rec_writer = JsonlWriter(self.records_path)
            except OSError as exc:
                raise DynatuneError(
                    f"cannot write the tuning database in {directory}: {exc.strerror}"
                ) from None

    # -- loading ---------------------------------------------------------------------------------
    def _load(self, skip_damaged: bool) -> None:
        """Both logs into memory. A damaged line (not JSON, not a line of its log, or one TVM cannot read)
        stops the load naming its file and number, or with ``skip_damaged`` is listed in :attr:`damaged`."""
        for path, check, load in (
            (self.workloads_path, check_workload_line, self._load_workload),
            (self.records_path, check_record_line, self._load_record),
        ):
            scan = scan_jsonl(path, check)
            if scan.torn is not None:
                warn_torn(scan)
            if not skip_damaged:
                scan.raise_if_damaged()
            damaged = list(scan.damaged)
            for no, line in scan.lines:
                try:
                    load(line)
                except Exception as exc:  # e.g. a TVMError on a trace that is valid JSON
                    reason = (str(exc).strip().splitlines() or [type(exc).__name__])[-1][:200]
                    if not skip_damaged:
                        raise DamagedFile(path, reason, no) from None
                    damaged.append((no, reason))
            self.damaged[path] = sorted(damaged)

    def _load_workload(self, line: dict) -> None:
        from tvm.s_tir import meta_schedule as ms

        if line["key"] not in self._workloads:
            wl = ms.database.Workload.from_json(line["workload"])
            self._workloads[line["key"]] = self.memory.commit_workload(wl.mod)

    def _load_record(self, line: dict) -> None:
        from tvm.s_tir import meta_schedule as ms

        wl = self._workloads.get(line["key"])
        if wl is None:
            raise ValueError(f"task {line['key']} has no workload in {self.workloads_path}")
        rec = ms.database.TuningRecord.from_json(line["record"], wl)
        self.memory.commit_tuning_record(rec)
        self._note(line["key"], line["record"])

    def _note(self, key: str, record_json) -> None:
        self._counts[key] = self._counts.get(key, 0) + 1
        secs = record_json[1] if isinstance(record_json, list) and len(record_json) > 1 else None
        lat = mean_secs(secs)
        if lat < self._best.get(key, math.inf):
            self._best[key] = lat

    # -- writing ---------------------------------------------------------------------------------
    def workload(self, key: str, mod):
        """The MetaSchedule workload for a task, committed (durably) the first time it is seen."""
        if key not in self._workloads:
            wl = self.memory.commit_workload(mod)
            self._workloads[key] = wl
            if not self.read_only:
                self._wl_writer.append({"key": key, "workload": wl.as_json()})
        return self._workloads[key]

    def commit(self, key: str, record):
        """Add a record to memory and to disk; returns (only once it is on disk) the record as plain JSON."""
        return self.commit_many(key, [record])[0]

    def commit_many(self, key: str, records: list) -> list:
        """Add a task's records to memory and to disk in one write; returns (only once they are on disk)
        the records as plain JSON."""
        out = []
        for record in records:
            self.memory.commit_tuning_record(record)
            out.append(record_json(record))
        if not self.read_only and out:
            self._rec_writer.append_many([{"key": key, "record": rec_json} for rec_json in out])
        for rec_json in out:
            self._note(key, rec_json)
        return out

    def workload_json(self, key: str):
        """A known task's workload as plain JSON (as ``workloads.jsonl`` holds it)."""
        return _tvm_to_plain(self._workloads[key].as_json())

    def close(self) -> None:
        if not self.read_only:
            self._wl_writer.close()
            self._rec_writer.close()

    # -- queries ---------------------------------------------------------------------------------
    def best_latency(self, key: str) -> float:
        """Best mean latency (seconds) recorded for a task key; ``inf`` if none."""
        return self._best.get(key, math.inf)

    def num_records(self, key: str | None = None) -> int:
        return sum(self._counts.values()) if key is None else self._counts.get(key, 0)

    def keys(self) -> list[str]:
        return list(self._workloads)

    def import_records(self, other: "TuningDatabase", keys: set[str] | None = None, mods=None) -> int:
        """Copy records of ``other`` (optionally only for ``keys``) into this database (warm start).

        ``mods``: key -> this run's own module of the task, its workload here (else ``other``'s). A record
        is copied only if its trace replays on that workload: a task of another model version can share a
        key while its blocks are named after that model's variables, and MetaSchedule's search and compile
        stop on a record whose trace names blocks the task lacks."""
        from tvm.s_tir import meta_schedule as ms

        n, mods = 0, mods or {}
        for line in read_jsonl(other.records_path, check_record_line):
            key = line["key"]
            if keys is not None and key not in keys:
                continue
            src = other._workloads.get(key)
            if src is None:
                continue
            wl = self.workload(key, mods.get(key, src.mod))
            try:
                record = ms.database.TuningRecord.from_json(line["record"], wl)  # replays the trace on wl
            except Exception:
                continue
            self.commit(key, record)
            n += 1
        return n


def record_json(record):
    """A tuning record as plain JSON, as MetaSchedule's own JSON database writes it.

    ``TuningRecord.as_json`` fails on a trace that rewrote a weight layout (``TransformLayout`` takes an
    ``IndexMap``); such objects are written as TVM's JSON string of the object, which
    ``TuningRecord.from_json`` reads back.
    """
    from tvm.s_tir.meta_schedule import _ffi_api

    return _tvm_to_plain(_ffi_api.TuningRecordAsJSON(record))


def _tvm_to_plain(obj):
    """TVM's JSON containers (arrays, maps, immediates) as plain Python; any other object as TVM's JSON
    string of it. The imports are paid once per call, not once per node (a trace has thousands)."""
    import tvm
    from tvm.tirx import FloatImm, IntImm
    from tvm_ffi import Array, Map

    def plain(x):
        if x is None or isinstance(x, (bool, int, float, str)):
            return x
        if isinstance(x, (IntImm, FloatImm)):
            return x.value
        if isinstance(x, (Array, list, tuple)):
            return [plain(y) for y in x]
        if isinstance(x, Map):
            return {plain(k): plain(v) for k, v in x.items()}
        return tvm.ir.save_json(x)

    return plain(obj)


def _plain(x):
    """JSON for numpy scalars (beliefs are computed with numpy)."""
    if hasattr(x, "item"):
        return x.item()
    raise TypeError(f"not JSON serializable: {type(x).__name__}")


def mean_secs(secs) -> float:
    if not secs:
        return math.inf
    vals = [float(s) for s in secs]
    m = sum(vals) / len(vals)
    return math.inf if m >= FAILED else m
