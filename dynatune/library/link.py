"""A run's link to the schedule library: at the start, tasks the library knows start from their best
schedules and new tasks get a first batch transferred from similar ones; after every batch, the batch's
records go into the library.

- Matching (``library.match_keys``): for each task whose key the library holds for this machine's
  fingerprint, the library's best ``seed_records`` schedules are added to the run's own database. The task
  starts at its best known latency, and its evolutionary search starts from those schedules (it draws its
  initial population from the best measured records).
- Transfer (``library.transfer``): a task with a new key whose fused operators the library knows at other
  shapes gets, at the head of its first batch, the best schedules of the most similar library tasks
  re-applied to its workload (:mod:`.transfer`); the search's own candidates fill the batch, so the run
  reports how the transferred half compared with the cold half (:class:`CompareTransferred`).
- Writing: :class:`WriteToLibrary`, a batch callback after ``AddToDatabase``. Only candidates measured by
  this run are written (not the seeds), each batch in one transaction. A library that cannot be written
  (a server gone away) does not stop the tuning: the run says so in its summary and goes on; its records
  are still in its work dir.

A resumed run is not seeded twice (``<work_dir>/library.json``).
"""

from __future__ import annotations

import os
import statistics
import time
import warnings

from dynatune.files import WorkDir, atomic_write_json
from dynatune.library.store import LibraryRecord, ScheduleLibrary, db_error, kept, library_url
from dynatune.library.transfer import task_pattern, transferred_candidates
from dynatune.search.batch_callbacks import BatchCallback
from dynatune.search.database import mean_secs
from dynatune.search.state_files import read_json_file

TRANSFER_SOURCES = (3, 2)  # transfer from the 3 most similar library tasks, 2 best schedules each


class RunLibrary:
    """The library, as one run uses it."""

    def __init__(
        self,
        library: ScheduleLibrary,
        fingerprint: str,
        model: str,
        seed_records: int,
        match_keys: bool = True,
        transfer: bool = True,
    ):
        self.library, self.fingerprint, self.model, self.seed_records = (
            library,
            fingerprint,
            model,
            seed_records,
        )
        self.match_keys, self.transfer = match_keys, transfer
        self.writer = WriteToLibrary(self)
        self.comparison = CompareTransferred()
        self.seeded: dict = {}

    @classmethod
    def for_config(cls, cfg, target, model: str) -> "RunLibrary | None":
        """The library ``cfg.library`` asks for, or None when it is off. With a device farm
        (``measure.rpc``) the records are the remote devices', so ``library.fingerprint`` must name their
        kind; without it the run does not use the library."""
        from dynatune.machine.target import machine_fingerprint

        sec = cfg.library
        if not sec.enabled or (cfg.measure.rpc and not sec.fingerprint):
            return None
        return cls(
            ScheduleLibrary(library_url(sec.url)),
            sec.fingerprint or machine_fingerprint(target),
            model,
            sec.seed_records,
            sec.match_keys,
            sec.transfer,
        )

    def callbacks(self) -> list:
        """The batch callbacks a run using the library adds after the default ones."""
        return [self.writer, self.comparison]

    def seed(self, session) -> dict:
        """Seed ``session`` from the library (once per work dir): matched tasks' records into its database,
        transferred candidates into the first batch of new tasks."""
        done = WorkDir(session.work_dir).library_done
        if os.path.exists(done):
            self.seeded = read_json_file(done, dict)
            return self.seeded
        t0 = time.perf_counter()
        by_key = {t.key: t for t in session.tasks}
        found = (
            self.library.top_records(self.fingerprint, by_key, self.seed_records) if self.match_keys else {}
        )
        n, unreadable = self._add_records(session, by_key, found)
        transfer = (
            [t.name for t in session.tasks if t.key not in found and self._plan_transfer(session, t)]
            if self.transfer
            else []
        )
        self.seeded = {
            "matched_tasks": len(found),
            "seeded_records": n,
            "unreadable_records": unreadable,
            "matched": sorted(by_key[k].name for k in found),
            "transfer_tasks": len(transfer),
            "transfer": transfer,
            "seed_s": round(time.perf_counter() - t0, 3),
        }
        atomic_write_json(done, self.seeded)
        return self.seeded

    def _add_records(self, session, by_key, found) -> tuple[int, int]:
        from tvm.s_tir import meta_schedule as ms

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
        return n, unreadable

    def _plan_transfer(self, session, task) -> bool:
        """Queue a transferred head for ``task``'s first batch if the library has similar tasks."""
        tasks, per_task = TRANSFER_SOURCES
        sources = self.library.similar(
            self.fingerprint,
            task_pattern(task.name),
            task.flops,
            exclude={task.key},
            tasks=tasks,
            per_task=per_task,
        )
        if not sources:
            return False

        def head(ctx, batch_size: int) -> list:
            cands = transferred_candidates(
                task.mod, sources, ctx.space_generator.postprocs, limit=max(1, batch_size // 2)
            )
            self.comparison.expect(task.key, len(cands))
            return cands

        session.first_candidates[task.index] = head
        return True

    def report(self) -> dict:
        """For the summary, MLflow and the report."""
        return {
            "url": self.library.shown_url,
            "fingerprint": self.fingerprint,
            "matched_tasks": self.seeded.get("matched_tasks", 0),
            "seeded_records": self.seeded.get("seeded_records", 0),
            "transfer_tasks": self.seeded.get("transfer_tasks", 0),
            "seed_s": self.seeded.get("seed_s", 0.0),
            **self.comparison.summary(),
            "written_records": self.writer.written,
            "write_error": self.writer.error,
        }

    def close(self) -> None:
        self.library.close()


class WriteToLibrary(BatchCallback):
    """After each batch: its records that ran, into the library, in one transaction."""

    def __init__(self, link: RunLibrary):
        self.link = link
        self.run_id: str | None = None
        self.written = 0
        self.error: str | None = None
        self._sent: set[str] = set()  # task keys whose workload the library has from this run

    def apply(self, session, batch) -> None:
        from dynatune.beliefs.headroom import operator_kind

        if self.error is not None or not batch.records:
            return
        t = batch.task
        workload = None if t.key in self._sent else session.db.workload_json(t.key)  # once per task and run
        rows = kept(
            [
                LibraryRecord(
                    t.key,
                    operator_kind(t.name),
                    task_pattern(t.name),
                    t.flops,
                    workload,
                    rec,
                    mean_secs(secs),
                )
                for rec, secs in zip(batch.records, batch.timings)
                if secs is not None
            ]
        )
        if not rows:
            return
        lib = self.link.library
        try:
            if self.run_id is None:
                self.run_id = lib.start_run(self.link.fingerprint, self.link.model)
            self.written += lib.add(self.link.fingerprint, self.run_id, rows)
            self._sent.add(t.key)  # the library has its workload now
        except Exception as exc:  # the tuning goes on without the library; the summary says why
            self.error = db_error(exc)
            warnings.warn(
                f"schedule library {lib.shown_url} cannot be written, tuning goes on without it: "
                f"{self.error}",
                stacklevel=2,
            )


class CompareTransferred(BatchCallback):
    """In a transferred task's first batch: the best transferred candidate against the best of the batch's
    own (the analytic candidates ahead of them, the samples after them: what the batch would measure without
    the library), measured in the same batch."""

    def __init__(self):
        self.pending: dict[str, int] = {}  # task key -> transferred candidates at the head of its next batch
        self.first_batches: list[dict] = []

    def expect(self, key: str, n: int) -> None:
        self.pending[key] = n

    def apply(self, session, batch) -> None:
        n = self.pending.pop(batch.task.key, None)
        if n is None:
            return
        means = [mean_secs(secs) if secs is not None else float("inf") for secs in batch.timings]
        a = min(session.analytic_counts.get(batch.task.key, 0), len(means))  # the head's analytic part
        n = min(n, len(means) - a)
        self.first_batches.append(
            {
                "task": batch.task.name,
                "candidates": len(means),
                "analytic": a,
                "transferred": n,
                "searched": len(means) - a - n,  # the rest of the batch
                "transferred_best_s": _finite_min(means[a : a + n]),
                "search_best_s": _finite_min(means[:a] + means[a + n :]),  # the batch's own: analytic, rest
            }
        )

    def summary(self) -> dict:
        ratios = [
            b["search_best_s"] / b["transferred_best_s"]
            for b in self.first_batches
            if b["transferred_best_s"] and b["search_best_s"]
        ]
        return {
            "transferred_tasks": sum(1 for b in self.first_batches if b["transferred"]),
            "transfer_first_batches": self.first_batches,
            # > 1: the transferred schedules beat the batch's own first candidates
            "transfer_gain_median": statistics.median(ratios) if ratios else None,
        }


def _finite_min(values) -> float | None:
    finite = [v for v in values if v != float("inf")]
    return min(finite) if finite else None
