"""Layering: the library (``dynatune/``) runs without Prefect and MLflow; only the CLI reaches them."""

import pkgutil
import subprocess
import sys

from helpers import ROOT

import dynatune


def test_every_library_module_imports_without_prefect_or_mlflow():
    names = sorted(
        m.name
        for m in pkgutil.walk_packages(dynatune.__path__, "dynatune.")
        if m.name not in ("dynatune.cli",)
    )
    assert "dynatune.run.pipeline" in names and "dynatune.schedulers.dynatune" in names
    code = (
        "import importlib, sys\n"
        f"for name in {names!r}:\n"
        "    importlib.import_module(name)\n"
        "bad = [m for m in ('prefect', 'mlflow') if m in sys.modules]\n"
        "assert not bad, bad\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, cwd=ROOT)
