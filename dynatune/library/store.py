"""The schedule library's store: measured tuning records of every run on a kind of machine, in one database.

Three tables, through SQLAlchemy, so the same code serves the embedded default (SQLite, in the user's cache
directory) and a farm's PostgreSQL server:

- ``dt_workloads``: one row per (machine fingerprint, task key): the task's operator kind and its TVM
  workload;
- ``dt_records``: one row per measured candidate that ran: its trace, run seconds and mean, and the run that
  measured it;
- ``dt_runs``: one row per run that wrote, with its model and when it last wrote.

Records are only ever read for one fingerprint (:func:`dynatune.machine.target.machine_fingerprint`:
target, CPU model and ISA features), so schedules measured on one kind of machine are never applied on
another.

Safe under concurrency: every write is one transaction (SQLite: WAL journal, ``BEGIN IMMEDIATE`` and a busy
timeout, so a second writer waits instead of failing; PostgreSQL: its own row locking), and inserts ignore
rows that already exist, so two runs adding the same workload, or an import done twice, never conflict. A
run that dies mid-write loses only the transaction it had open.

The store does not import TVM: workloads and records are TVM's JSON, kept as text.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import time
import uuid
from dataclasses import dataclass

import sqlalchemy as sa

from dynatune import secrets
from dynatune.errors import DynatuneError
from dynatune.files import cache_root

FORMAT = "dynatune-library"  # the first line of an exported file
FORMAT_VERSION = 1
SQLITE_BUSY_TIMEOUT_MS = 120_000

metadata = sa.MetaData()
workloads = sa.Table(
    "dt_workloads",
    metadata,
    sa.Column("fingerprint", sa.String(400), primary_key=True),
    sa.Column("task_key", sa.String(128), primary_key=True),
    sa.Column("kind", sa.String(64), nullable=False),  # the operator: conv2d, matmul, ...
    sa.Column("pattern", sa.String(200), nullable=False),  # the fused operators, shapes left out (transfer)
    sa.Column("flops", sa.Float, nullable=False),
    sa.Column("workload", sa.Text, nullable=False),
    sa.Index("dt_workloads_by_pattern", "fingerprint", "pattern"),
)
records = sa.Table(
    "dt_records",
    metadata,
    sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
    sa.Column("fingerprint", sa.String(400), nullable=False),
    sa.Column("task_key", sa.String(128), nullable=False),
    sa.Column("run_id", sa.String(64), nullable=False),
    sa.Column("trace_hash", sa.String(64), nullable=False),
    sa.Column("mean_s", sa.Float, nullable=False),
    sa.Column("record", sa.Text, nullable=False),
    sa.Column("created", sa.Float, nullable=False),
    sa.UniqueConstraint("fingerprint", "task_key", "run_id", "trace_hash", name="dt_records_once"),
    sa.Index("dt_records_by_task", "fingerprint", "task_key", "mean_s"),
)
runs = sa.Table(
    "dt_runs",
    metadata,
    sa.Column("run_id", sa.String(64), primary_key=True),
    sa.Column("fingerprint", sa.String(400), nullable=False),
    sa.Column("model", sa.String(256), nullable=False),
    sa.Column("started", sa.Float, nullable=False),
    sa.Column("last_write", sa.Float, nullable=False),
)


@dataclass
class LibraryRecord:
    """One measured candidate of one task, as the library keeps it (TVM's JSON for workload and record)."""

    task_key: str
    kind: str
    pattern: str
    flops: float
    workload: object  # MetaSchedule's Workload.as_json(); None: the library has it already
    record: object  # dynatune.search.database.record_json(TuningRecord)
    mean_s: float


URL_ENV = "DYNATUNE_LIBRARY_URL"  # the library's URL when the config names none


def library_url(url: str | None = None) -> str:
    """The library to use: ``url``, else ``$DYNATUNE_LIBRARY_URL``, else the embedded default."""
    return url or os.environ.get(URL_ENV) or default_url()


def default_url(cache_dir: str | None = None) -> str:
    """The embedded library: ``<cache>/library.db``, the cache being ``$DYNATUNE_CACHE_DIR`` or
    ``~/.cache/dynatune``."""
    return "sqlite:///" + os.path.join(cache_dir or cache_root(), "library.db")


def kept(batch: list[LibraryRecord]) -> list[LibraryRecord]:
    """The records a library keeps: failed candidates (no finite mean) are not."""
    return [r for r in batch if math.isfinite(r.mean_s)]


def trace_hash(record) -> str:
    """What identifies a schedule within a task: its trace (the record's first field)."""
    trace = record[0] if isinstance(record, list) and record else record
    return hashlib.sha256(json.dumps(trace, sort_keys=True).encode()).hexdigest()


class ScheduleLibrary:
    """A library at ``url`` (a SQLAlchemy URL, or ``env:NAME`` naming one): created on first use."""

    def __init__(self, url: str):
        self.url = secrets.resolve(url, "library.url")
        self.shown_url = secrets.mask(self.url)  # what logs and reports may print
        try:
            self.engine = _engine(self.url)
            try:
                metadata.create_all(self.engine)
            except (
                sa.exc.SQLAlchemyError
            ):  # another run created the tables at the same moment: they are there now
                metadata.create_all(self.engine)
        except DynatuneError:
            raise
        except (
            Exception
        ) as exc:  # a server that is down, a driver not installed, a file that is not a database
            raise DynatuneError(
                f"cannot open the schedule library at {self.shown_url}: {db_error(exc)}",
                "check library.url, or set library.enabled: false",
            ) from None

    def close(self) -> None:
        self.engine.dispose()

    # -- writing ---------------------------------------------------------------------------------------
    def start_run(self, fingerprint: str, model: str) -> str:
        run_id = uuid.uuid4().hex
        now = time.time()
        with self.engine.begin() as conn:
            conn.execute(
                runs.insert().values(
                    run_id=run_id, fingerprint=fingerprint, model=model[:256], started=now, last_write=now
                )
            )
        return run_id

    def add(self, fingerprint: str, run_id: str, batch: list[LibraryRecord]) -> int:
        """Add a batch of measured records in one transaction; returns how many were new or faster. Failed
        candidates (no finite mean) are not kept."""
        rows = kept(batch)
        if not rows:
            return 0
        now = time.time()
        with self.engine.begin() as conn:
            seen = set()
            wl_rows = []
            for r in rows:
                if r.workload is not None and r.task_key not in seen:
                    seen.add(r.task_key)
                    wl_rows.append(
                        {
                            "fingerprint": fingerprint,
                            "task_key": r.task_key,
                            "kind": r.kind,
                            "pattern": r.pattern,
                            "flops": float(r.flops),
                            "workload": json.dumps(r.workload),
                        }
                    )
            _insert_ignoring_existing(conn, workloads, wl_rows)
            n = _insert_keeping_fastest(
                conn,
                [
                    {
                        "fingerprint": fingerprint,
                        "task_key": r.task_key,
                        "run_id": run_id,
                        "trace_hash": trace_hash(r.record),
                        "mean_s": float(r.mean_s),
                        "record": json.dumps(r.record),
                        "created": now,
                    }
                    for r in rows
                ],
            )
            conn.execute(runs.update().where(runs.c.run_id == run_id).values(last_write=now))
        return n

    # -- reading ---------------------------------------------------------------------------------------
    def top_records(self, fingerprint: str, keys, k: int) -> dict[str, list]:
        """Per task key (of ``keys``) held for ``fingerprint``: its workload and its ``k`` best records, one
        per schedule, fastest first: ``{key: (workload, [(mean_s, record), ...])}``."""
        keys = list(keys)
        out: dict[str, tuple] = {}
        with self.engine.connect() as conn:
            for chunk in _chunks(keys, 500):
                wl = conn.execute(
                    sa.select(workloads.c.task_key, workloads.c.workload).where(
                        workloads.c.fingerprint == fingerprint, workloads.c.task_key.in_(chunk)
                    )
                ).all()
                for key, text in wl:
                    best: dict[str, tuple] = {}
                    for trace, mean_s, rec in conn.execute(
                        sa.select(records.c.trace_hash, records.c.mean_s, records.c.record)
                        .where(records.c.fingerprint == fingerprint, records.c.task_key == key)
                        .order_by(records.c.mean_s, records.c.id)
                        .limit(8 * k)
                    ):  # repeats are rare
                        if trace not in best:
                            best[trace] = (mean_s, json.loads(rec))
                            if len(best) >= k:
                                break
                    if best:
                        out[key] = (json.loads(text), list(best.values()))
        return out

    def similar(
        self, fingerprint: str, pattern: str, flops: float, exclude=(), tasks: int = 3, per_task: int = 2
    ) -> list[tuple]:
        """The best records of up to ``tasks`` library tasks with the same operator ``pattern`` (other
        shapes), the closest in FLOPs first: ``[(workload, record), ...]``."""
        with self.engine.connect() as conn:
            rows = conn.execute(
                sa.select(workloads.c.task_key, workloads.c.flops).where(
                    workloads.c.fingerprint == fingerprint, workloads.c.pattern == pattern
                )
            ).all()
        exclude = set(exclude)
        nearest = sorted(
            (r for r in rows if r.task_key not in exclude),
            key=lambda r: abs(math.log(max(r.flops, 1.0) / max(flops, 1.0))),
        )[:tasks]
        found = self.top_records(fingerprint, [r.task_key for r in nearest], per_task)
        return [
            (found[r.task_key][0], rec)
            for r in nearest
            if r.task_key in found
            for _, rec in found[r.task_key][1]
        ]

    def summary(self, newest: int = 5) -> dict:
        """What the library holds: per fingerprint its tasks, records and runs, and its newest runs."""
        out = []
        with self.engine.connect() as conn:
            fps = conn.execute(
                sa.select(workloads.c.fingerprint).distinct().order_by(workloads.c.fingerprint)
            )
            for (fp,) in fps.all():
                tasks = conn.execute(
                    sa.select(sa.func.count()).select_from(workloads).where(workloads.c.fingerprint == fp)
                ).scalar_one()
                recs = conn.execute(
                    sa.select(sa.func.count()).select_from(records).where(records.c.fingerprint == fp)
                ).scalar_one()
                kinds = dict(
                    conn.execute(
                        sa.select(workloads.c.kind, sa.func.count())
                        .where(workloads.c.fingerprint == fp)
                        .group_by(workloads.c.kind)
                    ).all()
                )
                newest_runs = [
                    {"run_id": r.run_id, "model": r.model, "started": r.started, "last_write": r.last_write}
                    for r in conn.execute(
                        sa.select(runs)
                        .where(runs.c.fingerprint == fp)
                        .order_by(runs.c.last_write.desc())
                        .limit(newest)
                    )
                ]
                n_runs = conn.execute(
                    sa.select(sa.func.count()).select_from(runs).where(runs.c.fingerprint == fp)
                ).scalar_one()
                out.append(
                    {
                        "fingerprint": fp,
                        "tasks": tasks,
                        "records": recs,
                        "runs": n_runs,
                        "kinds": kinds,
                        "newest_runs": newest_runs,
                    }
                )
        return {"url": self.shown_url, "fingerprints": out}

    def fingerprints(self) -> list[str]:
        with self.engine.connect() as conn:
            return [fp for (fp,) in conn.execute(sa.select(workloads.c.fingerprint).distinct())]

    # -- maintenance -----------------------------------------------------------------------------------
    def prune(self, keep: int, fingerprint: str | None = None) -> int:
        """Delete the records that are no longer among any task's ``keep`` best schedules (and repeated
        measurements of a kept schedule but its best); returns how many were deleted."""
        if keep < 1:
            raise DynatuneError(f"prune must keep at least 1 record per task, got {keep}")
        deleted = 0
        with self.engine.begin() as conn:
            q = sa.select(workloads.c.fingerprint, workloads.c.task_key)
            if fingerprint is not None:
                q = q.where(workloads.c.fingerprint == fingerprint)
            for fp, key in conn.execute(q).all():
                kept, drop, traces = 0, [], set()
                for rid, trace in conn.execute(
                    sa.select(records.c.id, records.c.trace_hash)
                    .where(records.c.fingerprint == fp, records.c.task_key == key)
                    .order_by(records.c.mean_s, records.c.id)
                ):
                    if trace in traces or kept >= keep:
                        drop.append(rid)
                    else:
                        traces.add(trace)
                        kept += 1
                for chunk in _chunks(drop, 500):
                    deleted += conn.execute(records.delete().where(records.c.id.in_(chunk))).rowcount
        return deleted

    def export(self, fingerprint: str, path: str) -> int:
        """Write every workload and record of ``fingerprint`` to a JSON-lines file; returns the record
        count."""
        if fingerprint not in self.fingerprints():
            raise DynatuneError(
                f"the library holds nothing for fingerprint {fingerprint!r}",
                "`dynatune library show` lists the fingerprints it holds",
            )
        n = 0
        tmp = path + ".tmp"
        try:
            f = open(tmp, "w")
        except OSError as exc:
            raise DynatuneError(f"cannot write {path}: {exc.strerror}") from None
        with self.engine.connect() as conn, f:
            f.write(
                json.dumps({"format": FORMAT, "version": FORMAT_VERSION, "fingerprint": fingerprint}) + "\n"
            )
            for row in conn.execute(sa.select(workloads).where(workloads.c.fingerprint == fingerprint)):
                f.write(json.dumps({"workload": {c: getattr(row, c) for c in WORKLOAD_FIELDS}}) + "\n")
            for row in conn.execute(
                sa.select(records).where(records.c.fingerprint == fingerprint).order_by(records.c.id)
            ):
                f.write(json.dumps({"record": {c: getattr(row, c) for c in RECORD_FIELDS}}) + "\n")
                n += 1
        os.replace(tmp, path)
        return n

    def import_file(self, path: str) -> dict:
        """Add an exported file's workloads and records (those already here are skipped), in one
        transaction."""
        fingerprint, wl_rows, rec_rows = read_export(path)
        with self.engine.begin() as conn:
            _insert_ignoring_existing(conn, workloads, [{"fingerprint": fingerprint, **w} for w in wl_rows])
            n = _insert_ignoring_existing(
                conn, records, [{"fingerprint": fingerprint, **r} for r in rec_rows]
            )
        return {"fingerprint": fingerprint, "tasks": len(wl_rows), "records": n, "skipped": len(rec_rows) - n}


WORKLOAD_FIELDS = ("task_key", "kind", "pattern", "flops", "workload")
RECORD_FIELDS = ("task_key", "run_id", "trace_hash", "mean_s", "record", "created")


def read_export(path: str) -> tuple[str, list, list]:
    """(fingerprint, workload rows, record rows) of an exported file, or a one-line error."""
    try:
        with open(path) as f:
            lines = [json.loads(line) for line in f if line.strip()]
    except OSError as exc:
        raise DynatuneError(f"cannot read library file {path}: {exc.strerror}") from None
    except ValueError:
        raise DynatuneError(f"{path} is not a dynatune library export (not JSON lines)") from None
    head = lines[0] if lines else {}
    if not isinstance(head, dict) or head.get("format") != FORMAT:
        raise DynatuneError(
            f"{path} is not a dynatune library export", "make one with `dynatune library export`"
        )
    if head.get("version") != FORMAT_VERSION:
        raise DynatuneError(
            f"{path} is library format version {head.get('version')}; this dynatune reads {FORMAT_VERSION}"
        )
    try:
        wl_rows = [
            {c: line["workload"][c] for c in WORKLOAD_FIELDS} for line in lines[1:] if "workload" in line
        ]
        for w in wl_rows:
            w["flops"] = float(w["flops"])
            w["task_key"], w["kind"], w["pattern"], w["workload"] = (
                str(w["task_key"]),
                str(w["kind"]),
                str(w["pattern"]),
                str(w["workload"]),
            )
        rec_rows = [{c: line["record"][c] for c in RECORD_FIELDS} for line in lines[1:] if "record" in line]
        for r in rec_rows:
            r["mean_s"], r["created"] = float(r["mean_s"]), float(r["created"])
            r["task_key"], r["run_id"], r["trace_hash"], r["record"] = (
                str(r["task_key"]),
                str(r["run_id"]),
                str(r["trace_hash"]),
                str(r["record"]),
            )
        fingerprint = str(head["fingerprint"])
    except (KeyError, TypeError, ValueError):
        raise DynatuneError(f"{path} is a damaged library export (a line lacks its fields)") from None
    return fingerprint, wl_rows, rec_rows


def _engine(url: str):
    try:
        parsed = sa.engine.make_url(url)
    except sa.exc.ArgumentError:
        raise DynatuneError(
            f"library.url is not a database URL: {secrets.mask(url)}",
            "e.g. sqlite:////path/library.db or postgresql+psycopg://user@host/db",
        ) from None
    if parsed.get_backend_name() != "sqlite":
        return sa.create_engine(url, pool_pre_ping=True)
    if parsed.database and parsed.database != ":memory:":
        os.makedirs(os.path.dirname(os.path.abspath(parsed.database)), exist_ok=True)
    engine = sa.create_engine(url, connect_args={"timeout": SQLITE_BUSY_TIMEOUT_MS / 1000})

    @sa.event.listens_for(engine, "connect")
    def _on_connect(dbapi_conn, _record):
        dbapi_conn.isolation_level = None  # transactions are begun below, IMMEDIATE: a writer waits its turn
        cur = dbapi_conn.cursor()
        cur.execute(f"PRAGMA busy_timeout={SQLITE_BUSY_TIMEOUT_MS}")
        cur.execute("PRAGMA journal_mode=WAL")
        cur.close()

    @sa.event.listens_for(engine, "begin")
    def _on_begin(conn):
        conn.exec_driver_sql("BEGIN IMMEDIATE")

    return engine


def _dialect_insert(conn):
    """The INSERT with ON CONFLICT of the library's database."""
    name = conn.dialect.name
    if name == "sqlite":
        from sqlalchemy.dialects.sqlite import insert
    elif name == "postgresql":
        from sqlalchemy.dialects.postgresql import insert
    else:
        raise DynatuneError(f"the schedule library supports SQLite and PostgreSQL, not {name}")
    return insert


def _insert_ignoring_existing(conn, table, rows: list[dict]) -> int:
    """Insert ``rows``, skipping those whose unique key is already there; returns how many were inserted."""
    if not rows:
        return 0
    insert = _dialect_insert(conn)
    first_key = table.primary_key.columns.values()[0]
    n = 0
    for chunk in _chunks(rows, 200):  # RETURNING counts the rows inserted (psycopg's rowcount here is -1)
        n += len(
            conn.execute(insert(table).values(chunk).on_conflict_do_nothing().returning(first_key)).all()
        )
    return n


def _insert_keeping_fastest(conn, rows: list[dict]) -> int:
    """Insert records; a schedule this run measured before (same trace) keeps its fastest measurement, as
    the run's own database does (its best latency is the minimum over repeats). Returns how many rows
    were inserted or made faster."""
    fastest: dict[tuple, dict] = {}
    for r in rows:
        key = (r["fingerprint"], r["task_key"], r["run_id"], r["trace_hash"])
        if key not in fastest or r["mean_s"] < fastest[key]["mean_s"]:
            fastest[key] = r
    rows = list(fastest.values())
    if not rows:
        return 0
    insert = _dialect_insert(conn)
    n = 0
    for chunk in _chunks(rows, 200):
        stmt = insert(records).values(chunk)
        stmt = stmt.on_conflict_do_update(
            index_elements=["fingerprint", "task_key", "run_id", "trace_hash"],
            set_={"mean_s": stmt.excluded.mean_s, "record": stmt.excluded.record},
            where=stmt.excluded.mean_s < records.c.mean_s,
        )
        n += len(conn.execute(stmt.returning(records.c.id)).all())
    return n


def _chunks(items: list, size: int):
    for i in range(0, len(items), size):
        yield items[i : i + size]


def db_error(exc) -> str:
    return secrets.mask_text(str(getattr(exc, "orig", None) or exc).splitlines()[0])[:200]
