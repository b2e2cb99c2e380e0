"""A run's link to the schedule library: at the start, tasks the library knows start from their best
schedules; after every batch, the batch's records go into the library.

- Seeding: for each task whose key the library holds for this machine's fingerprint, the library's best
  ``seed_records`` schedules are added to the run's own database. The task then starts at its best known
  latency, and its evolutionary search starts from those schedules (it draws its initial population from
  the best measured records). A resumed run is not seeded twice (``<work_dir>/library.json``).
- Writing: :class:`WriteToLibrary`, a batch callback after ``AddToDatabase``. Only candidates measured by
  this run are written (not the seeds), each batch in one transaction. A library that cannot be written
  (a server gone away) does not stop the tuning: the run says so in its summary and goes on; its records
  are still in its work dir.
"""

from __future__ import annotations

import json
import os
import warnings

from ..batch_callbacks import BatchCallback
from ..database import mean_secs
from ..files import atomic_write_json
from .store import LibraryRecord, ScheduleLibrary, db_error, library_url


class RunLibrary:
    """The library, as one run uses it."""

    def __init__(self, library: ScheduleLibrary, fingerprint: str, model: str, seed_records: int):
        self.library, self.fingerprint, self.model, self.seed_records = library, fingerprint, model, seed_records
        self.writer = WriteToLibrary(self)
        self.seeded: dict = {}

    @classmethod
    def for_config(cls, cfg, target, model: str) -> "RunLibrary | None":
        """The library ``cfg.library`` asks for, or None when it is off. With a device farm
        (``measure.rpc``) the records are the remote devices', so ``library.fingerprint`` must name their
        kind; without it the run does not use the library."""
        from ..target import machine_fingerprint

        sec = cfg.library
        if not sec.enabled or (cfg.measure.rpc and not sec.fingerprint):
            return None
        return cls(ScheduleLibrary(library_url(sec.url)), sec.fingerprint or machine_fingerprint(target), model,
                   sec.seed_records)

    def seed(self, session) -> dict:
        """Add the library's best records of every task it knows to ``session``'s database (once per work dir)."""
        from tvm.s_tir import meta_schedule as ms

        done = os.path.join(session.work_dir, "library.json")
        if os.path.exists(done):
            with open(done) as f:
                self.seeded = json.load(f)
            return self.seeded
        by_key = {t.key: t for t in session.tasks}
        found = self.library.top_records(self.fingerprint, by_key, self.seed_records)
        n = unreadable = 0
        for key, (_, best) in found.items():
            wl = session.db.workload(key, by_key[key].mod)
            for _, rec in best:
                try:
                    record = ms.database.TuningRecord.from_json(rec, wl)
                except Exception:  # written by another TVM version: of no use here
                    unreadable += 1
                    continue
                session.db.commit(key, record)
                n += 1
        self.seeded = {"matched_tasks": len(found), "seeded_records": n, "unreadable_records": unreadable,
                       "matched": sorted(by_key[k].name for k in found)}
        atomic_write_json(done, self.seeded)
        return self.seeded

    def report(self) -> dict:
        """For the summary, MLflow and the report."""
        return {"url": self.library.shown_url, "fingerprint": self.fingerprint,
                "matched_tasks": self.seeded.get("matched_tasks", 0),
                "seeded_records": self.seeded.get("seeded_records", 0),
                "written_records": self.writer.written, "write_error": self.writer.error}

    def close(self) -> None:
        self.library.close()


class WriteToLibrary(BatchCallback):
    """After each batch: its records that ran, into the library, in one transaction."""

    def __init__(self, link: RunLibrary):
        self.link = link
        self.run_id: str | None = None
        self.written = 0
        self.error: str | None = None
        self._workloads: dict[str, object] = {}

    def apply(self, session, batch) -> None:
        from ..beliefs.headroom import operator_kind

        if self.error is not None or not batch.records:
            return
        t = batch.task
        if t.key not in self._workloads:
            self._workloads[t.key] = session.db.workload_json(t.key)
        rows = [LibraryRecord(t.key, operator_kind(t.name), self._workloads[t.key], rec, mean_secs(secs))
                for rec, secs in zip(batch.records, batch.timings) if secs is not None]
        lib = self.link.library
        try:
            if self.run_id is None:
                self.run_id = lib.start_run(self.link.fingerprint, self.link.model)
            self.written += lib.add(self.link.fingerprint, self.run_id, rows)
        except Exception as exc:  # the tuning goes on without the library; the summary says why
            self.error = db_error(exc)
            warnings.warn(f"schedule library {lib.shown_url} cannot be written, tuning goes on without it: "
                          f"{self.error}", stacklevel=2)
