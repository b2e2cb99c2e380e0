"""The runtime's loader, without a compiled model: which CPU features a library needs, the refusal of a CPU
that lacks one (before the library is touched), and the thread pool it sets (the user's settings kept)."""

import json
import os

import pytest

from dynatune import runtime
from dynatune.runtime import ArtifactError, load


def _artifact(tmp_path, **meta) -> str:
    """A library file that is no library, with metadata: whatever load() refuses must be refused before
    the library is loaded."""
    library = tmp_path / "model.so"
    library.write_bytes(b"not a library")
    doc = {
        "format": runtime.METADATA_FORMAT,
        "cpu": {"name": "Some CPU", "required_features": ["avx2", "fma", "avx512f", "avx512bw"]},
        "target": "llvm -mcpu=skylake-avx512",
        "inputs": [{"name": "x", "shape": [1, 3], "dtype": "float32"}],
        "outputs": [{"name": "y", "shape": [1, 2], "dtype": "float32"}],
        "thread_pool": {"TVM_NUM_THREADS": "2"},
    } | meta
    (tmp_path / "model.json").write_text(json.dumps(doc))
    return str(library)


def test_a_cpu_without_a_feature_the_library_needs_is_refused_in_one_line(tmp_path):
    lib = _artifact(tmp_path)
    with pytest.raises(ArtifactError) as e:
        load(lib, cpu_features_available={"sse4_2", "avx", "avx2", "fma"})
    msg = str(e.value)
    assert "\n" not in msg
    assert "avx512f, avx512bw" in msg and "model.so" in msg and "Some CPU" in msg
    # the directory that holds model.so is the same artifact
    with pytest.raises(ArtifactError, match="avx512f"):
        load(str(tmp_path), cpu_features_available={"avx2", "fma"})


def test_missing_or_damaged_metadata_is_one_line(tmp_path):
    (tmp_path / "model.so").write_bytes(b"x")
    with pytest.raises(ArtifactError, match="no metadata file .*model.json"):
        load(str(tmp_path / "model.so"))
    (tmp_path / "model.json").write_text("{not json")
    with pytest.raises(ArtifactError, match="cannot read"):
        load(str(tmp_path / "model.so"))
    (tmp_path / "model.json").write_text(json.dumps({"format": 99}))
    with pytest.raises(ArtifactError, match="format 99"):
        load(str(tmp_path / "model.so"))
    with pytest.raises(ArtifactError, match="no compiled model"):
        load(str(tmp_path / "elsewhere.so"))


def test_required_features_follow_the_target_not_this_machine():
    import tvm
    from tvm.target import codegen

    def needs(mcpu):
        target = tvm.target.Target({"kind": "llvm", "mcpu": mcpu})
        return set(runtime.required_features(codegen.llvm_get_cpu_features(target)))

    assert {"avx512f", "avx512bw", "avx512vl", "avx2", "fma"} <= needs("skylake-avx512")
    assert {"avx2", "fma"} <= needs("znver3") and not {f for f in needs("znver3") if f.startswith("avx512")}
    assert runtime.missing_features({"cpu": {"required_features": ["avx2"]}}, None) == []  # nothing to check


def test_the_thread_pool_it_was_timed_with_unless_the_user_set_it(monkeypatch):
    meta = {
        "thread_pool": {"TVM_NUM_THREADS": "2", "TVM_THREAD_POOL_SPIN_COUNT": "1000", "TVM_BIND_THREADS": "0"}
    }
    monkeypatch.setattr(runtime, "usable_cores", lambda: 8)
    env = {}
    assert runtime.apply_thread_pool(meta, env) == meta["thread_pool"] and env == meta["thread_pool"]
    # the user's own setting is kept; one that dynatune's import defaulted is not the user's
    env = {"TVM_NUM_THREADS": "1", "TVM_BIND_THREADS": "1", runtime.DEFAULTED_VARS_MARK: "TVM_BIND_THREADS"}
    runtime.apply_thread_pool(meta, env)
    assert env["TVM_NUM_THREADS"] == "1" and env["TVM_BIND_THREADS"] == "0"
    # never more threads than this machine's usable cores
    monkeypatch.setattr(runtime, "usable_cores", lambda: 1)
    env = {}
    runtime.apply_thread_pool(meta, env)
    assert env["TVM_NUM_THREADS"] == "1"


@pytest.mark.slow  # a subprocess
def test_dynatune_marks_the_thread_pool_it_defaulted():
    import subprocess
    import sys

    env = {
        k: v for k, v in os.environ.items() if not k.startswith("TVM_") and k != runtime.DEFAULTED_VARS_MARK
    }
    env["TVM_BIND_THREADS"] = "1"
    code = "import dynatune, os; print(os.environ['DYNATUNE_DEFAULTED_THREAD_POOL_VARS'])"
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["TVM_NUM_THREADS,TVM_THREAD_POOL_SPIN_COUNT"]


def test_the_runtime_imports_nothing_else_of_dynatune_nor_mlflow_nor_prefect():
    """It ships alone inside the MLflow model (tasks.tuned_model): only the standard library, numpy, TVM."""
    import ast

    tree = ast.parse(open(runtime.__file__).read())
    imported = {
        (n.module if isinstance(n, ast.ImportFrom) else a.name).split(".")[0]
        for n in ast.walk(tree)
        if isinstance(n, (ast.Import, ast.ImportFrom))
        for a in n.names
    }
    assert imported <= {"__future__", "json", "os", "collections", "threading", "numpy", "tvm"}, imported
