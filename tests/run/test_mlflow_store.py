"""A new work dir's SQLite tracking store is seeded from an empty store MLflow migrated once per MLflow
version (:mod:`dynatune.tasks.mlflow_store`): the same schema and revision as a store MLflow creates,
experiments numbered as in a new store, and a store that exists, or a store elsewhere than SQLite, is never
touched."""

import os
import sqlite3

import pytest

from dynatune.tasks.mlflow_store import empty_store_template, seed_sqlite_store


@pytest.fixture
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("DYNATUNE_CACHE_DIR", str(tmp_path / "cache"))
    return tmp_path / "cache"


def _schema(path) -> tuple:
    """Every table, index and trigger a store defines, each definition's lines as a set (MLflow's
    migrations write a table's constraints in no fixed order: two stores it creates differ there), and
    the store's migration revision."""
    with sqlite3.connect(path) as conn:
        rows = conn.execute("SELECT type, name, sql FROM sqlite_master WHERE name NOT LIKE 'sqlite_%'")
        defined = sorted((kind, name, _lines(sql)) for kind, name, sql in rows)
        revision = conn.execute("SELECT version_num FROM alembic_version").fetchall()
    conn.close()
    return defined, revision


def _lines(sql) -> tuple:
    return tuple(sorted(line.strip().rstrip(",").strip() for line in (sql or "").splitlines()))


@pytest.mark.slow  # 5-7 s: the fast tier stays under 3 minutes on a Zen 4 core
def test_a_seeded_store_is_the_store_mlflow_creates(cache, tmp_path):
    from mlflow import MlflowClient

    fresh, seeded = tmp_path / "fresh.db", tmp_path / "seeded.db"
    assert seed_sqlite_store(f"sqlite:///{seeded}")
    assert os.path.dirname(empty_store_template()) == str(cache / "mlflow")
    listing = {}
    for path in (fresh, seeded):  # MLflow creates `fresh` itself, migrations and all
        client = MlflowClient(f"sqlite:///{path}")
        exp = client.create_experiment("dynatune/tiny", artifact_location=(tmp_path / "art").as_uri())
        run = client.create_run(exp, tags={"model": "tiny"})
        client.log_metric(run.info.run_id, "estimated_latency_ms", 1.0, step=2)
        client.set_terminated(run.info.run_id)
        assert client.get_metric_history(run.info.run_id, "estimated_latency_ms")[0].step == 2
        listing[path] = sorted((e.experiment_id, e.name) for e in client.search_experiments())
    assert _schema(seeded) == _schema(fresh)
    assert listing[seeded] == listing[fresh] == [("0", "Default"), ("1", "dynatune/tiny")]


def test_a_store_that_exists_and_other_stores_are_never_touched(cache, tmp_path):
    from mlflow import MlflowClient

    path = tmp_path / "mlflow.db"
    MlflowClient(f"sqlite:///{path}").create_experiment("kept")
    before = path.read_bytes()
    assert not seed_sqlite_store(f"sqlite:///{path}")
    assert path.read_bytes() == before
    assert not seed_sqlite_store(f"sqlite:///{path}?mode=ro")  # the same file, named with a query
    assert path.read_bytes() == before and os.listdir(tmp_path) == ["mlflow.db"]
    assert not seed_sqlite_store("sqlite:///:memory:")
    assert not seed_sqlite_store("http://localhost:5000")
    assert not seed_sqlite_store(f"postgresql://user@localhost/{tmp_path.name}")
    assert not cache.exists()  # no template made for them


def test_a_cache_it_cannot_write_leaves_the_new_store_to_mlflow(tmp_path, monkeypatch):
    from mlflow import MlflowClient

    blocker = tmp_path / "a-file"
    blocker.write_text("")
    monkeypatch.setenv("DYNATUNE_CACHE_DIR", str(blocker))  # no folder can be made below a file
    path = tmp_path / "mlflow.db"
    assert not seed_sqlite_store(f"sqlite:///{path}")
    assert not path.exists() and not [p for p in os.listdir(tmp_path) if p.startswith("mlflow.db")]
    assert MlflowClient(f"sqlite:///{path}").get_experiment("0").name == "Default"
