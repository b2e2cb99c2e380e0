"""What an installed dynatune puts in site-packages: the package ``dynatune`` and nothing else. The
repository's flows/ and tasks/ install as ``dynatune.flows`` and ``dynatune.tasks`` (pyproject.toml's
package-dir), so a user's own ``tasks`` or ``flows`` package is never shadowed by ours, nor ours by
theirs."""

import json
import os
import subprocess
import sys
import tomllib

import pytest
from helpers import ROOT


def _setuptools() -> dict:
    with open(os.path.join(ROOT, "pyproject.toml"), "rb") as f:
        return tomllib.load(f)["tool"]["setuptools"]


def _source(package: str, package_dir: dict) -> str:
    """The folder a package installs from, as setuptools maps it."""
    for prefix in sorted(package_dir, key=len, reverse=True):
        if package == prefix or package.startswith(prefix + "."):
            rest = package[len(prefix) :].lstrip(".").split(".")
            return os.path.join(ROOT, package_dir[prefix], *filter(None, rest))
    return os.path.join(ROOT, *package.split("."))


def test_every_package_folder_installs_under_dynatune_and_nothing_else_at_the_top():
    cfg = _setuptools()
    packages, package_dir = cfg["packages"], cfg["package-dir"]
    assert {p.split(".")[0] for p in packages} == {"dynatune"}
    assert package_dir == {"dynatune.flows": "flows", "dynatune.tasks": "tasks"}
    listed = {os.path.realpath(_source(p, package_dir)) for p in packages}
    assert all(os.path.isfile(os.path.join(d, "__init__.py")) for d in listed)
    folders = {
        os.path.realpath(d)
        for top in ("dynatune", "flows", "tasks")
        for d, _, files in os.walk(os.path.join(ROOT, top))
        if "__init__.py" in files
    }
    assert folders == listed, f"list these in pyproject.toml's packages: {sorted(folders - listed)}"


def test_an_editable_install_resolves_dynatune_tasks_and_flows_and_not_tasks_or_flows(tmp_path):
    """In a process started outside the repository (no PYTHONPATH), as a user's would be."""
    code = (
        "import importlib.util, json, dynatune\n"
        "print(json.dumps([dynatune.__file__, importlib.util.find_spec('tasks') is not None,\n"
        "                  importlib.util.find_spec('flows') is not None]))\n"
        "import dynatune.tasks, dynatune.flows\n"
        "print(json.dumps([dynatune.tasks.__file__, dynatune.flows.__file__]))\n"
    )
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    out = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, env=env, capture_output=True, text=True)
    lines = out.stdout.splitlines()
    if not lines:
        pytest.skip(f"dynatune is not installed in this interpreter: {out.stderr.strip()[-200:]}")
    lib, top_tasks, top_flows = json.loads(lines[0])
    installed_from = os.path.dirname(os.path.dirname(lib))
    if os.path.realpath(installed_from) != os.path.realpath(ROOT):
        pytest.skip(f"dynatune is installed from another checkout ({installed_from})")
    assert out.returncode == 0, out.stderr
    tasks, flows = json.loads(lines[1])
    assert os.path.realpath(tasks) == os.path.realpath(os.path.join(ROOT, "tasks", "__init__.py"))
    assert os.path.realpath(flows) == os.path.realpath(os.path.join(ROOT, "flows", "__init__.py"))
    assert not top_tasks and not top_flows
