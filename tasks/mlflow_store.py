"""A new SQLite tracking store, seeded from an empty one migrated once per MLflow version.

MLflow creates a SQLite store's tables by running its schema migrations, about 1-1.6 s on these cores,
and a run's default store is new with every work dir (``<work_dir>/mlflow.db``). :func:`seed_sqlite_store`
copies an empty migrated store into place instead (milliseconds): the same schema at the same revision,
with no experiment in it (MLflow adds its "Default" experiment when it opens the copy, as it does a store
it has just migrated). The template lives in dynatune's cache, one per MLflow version. A store that exists
is never touched, and anything that fails here leaves the path to MLflow, which creates the store itself.
"""

from __future__ import annotations

import logging
import os
import shutil
import sqlite3
import tempfile

from dynatune.files import cache_root

log = logging.getLogger(__name__)

_SCHEME = "sqlite:///"


def point_mlflow_at(uri: str) -> None:
    """MLflow's fluent API (``mlflow.log_*``, ``mlflow.start_run``) on the store ``uri``, without leaving
    it in the environment: MLflow exports the URI there, and a later run in this process (a flow tuning
    several models) would take this run's store, and its work dir, for its own."""
    import mlflow

    exported = os.environ.get("MLFLOW_TRACKING_URI")
    mlflow.set_tracking_uri(uri)
    if exported is None:
        os.environ.pop("MLFLOW_TRACKING_URI", None)
    else:
        os.environ["MLFLOW_TRACKING_URI"] = exported


def sqlite_path(uri: str) -> str | None:
    """The file a ``sqlite:///`` ``uri`` names, without its query (``None`` for another kind of store)."""
    if not uri.startswith(_SCHEME):
        return None
    return uri[len(_SCHEME) :].partition("?")[0]


def seed_sqlite_store(uri: str) -> bool:
    """Put an empty migrated store at the path of a ``sqlite:///`` ``uri`` if nothing is there; whether
    it did."""
    path = sqlite_path(uri)
    if path is None or path == ":memory:" or os.path.exists(path):
        return False
    try:
        template = empty_store_template()
        staged = f"{path}.seed{os.getpid()}"
        shutil.copyfile(template, staged)
        try:
            os.link(staged, path)  # never over a store another process created meanwhile
        except FileExistsError:
            return False
        finally:
            os.remove(staged)
    except (OSError, sqlite3.Error) as exc:
        log.debug("MLflow creates the store at %s itself: %s", path, exc)
        return False
    return True


def empty_store_template() -> str:
    """The cache's empty store for this MLflow version, made now if missing: migrated by MLflow, its
    "Default" experiment removed."""
    import mlflow

    path = cache_root("mlflow", f"empty-store-{mlflow.__version__}.db")
    if os.path.exists(path):
        return path
    from mlflow.store.tracking.sqlalchemy_store import SqlAlchemyStore

    folder = os.path.dirname(path)
    os.makedirs(folder, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=folder) as work:
        db = os.path.join(work, "store.db")
        SqlAlchemyStore(_SCHEME + db, os.path.join(work, "artifacts")).engine.dispose()
        with sqlite3.connect(db) as conn:
            conn.execute("DELETE FROM experiment_tags")
            conn.execute("DELETE FROM experiments")
        conn.close()
        os.replace(db, path)  # whole or not at all, whoever finishes first
    return path
