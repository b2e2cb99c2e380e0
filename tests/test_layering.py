"""Layering: the library runs without Prefect and MLflow; only the orchestration above it reaches them.

The installed package ``dynatune`` holds the library (``dynatune/``) and, above it, the orchestration: the
Prefect tasks and MLflow glue (``tasks/``, installed as ``dynatune.tasks``), the Prefect flows (``flows/``,
``dynatune.flows``) and the command line (``dynatune.cli``). No module of the library imports Prefect or
MLflow, nor anything of the orchestration."""

import pkgutil
import subprocess
import sys

from helpers import ROOT

import dynatune

# the rooms above the library: the only ones that may import Prefect or MLflow
ORCHESTRATION = ("dynatune.cli", "dynatune.tasks", "dynatune.flows")
# where each folder of the repository installs (pyproject.toml's package-dir)
FOLDERS = {"dynatune": "dynatune", "dynatune.tasks": "tasks", "dynatune.flows": "flows"}


def _orchestration(name: str) -> bool:
    return any(name == o or name.startswith(o + ".") for o in ORCHESTRATION)


def test_every_library_module_imports_without_prefect_or_mlflow():
    names = sorted(
        m.name for m in pkgutil.walk_packages(dynatune.__path__, "dynatune.") if not _orchestration(m.name)
    )
    assert "dynatune.run.pipeline" in names and "dynatune.schedulers.dynatune" in names
    code = (
        "import importlib, sys\n"
        f"for name in {names!r}:\n"
        "    importlib.import_module(name)\n"
        "bad = [m for m in ('prefect', 'mlflow') if m in sys.modules]\n"
        f"bad += [m for m in sys.modules if m.startswith({ORCHESTRATION!r})]\n"
        "assert not bad, bad\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, cwd=ROOT)


# The house, from the ground up (docs/architecture.md): a room imports only rooms on lower floors.
FLOORS = {
    "errors": 0,
    "runtime": 0,
    "files": 0,
    "secrets": 1,
    "machine": 1,
    "beliefs": 1,
    "model": 2,
    "schedulers": 2,
    "search": 3,
    "compiler": 4,
    "library": 4,
    "run": 5,
    "bench": 6,
    "tasks": 7,
    "flows": 8,
    "cli": 9,
}


def _imports() -> dict[str, set[str]]:
    """Every dynatune module and the dynatune modules it imports, at the top or inside a function."""
    import ast
    import pathlib

    root = pathlib.Path(ROOT)
    modules = {}
    for package, folder in FOLDERS.items():
        for path in sorted((root / folder).rglob("*.py")):
            parts = path.relative_to(root / folder).with_suffix("").parts
            modules[".".join((package, *parts)).removesuffix(".__init__")] = path
    graph = {}
    for name, path in modules.items():
        found = set()
        for node in ast.walk(ast.parse(path.read_text())):
            targets = []
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module:
                targets = [f"{node.module}.{a.name}" for a in node.names] + [node.module]
            for t in targets:
                while t and t not in modules:
                    t = t.rpartition(".")[0]
                if t and t != name and t != "dynatune":
                    found.add(t)
        graph[name] = found
    return graph


def _room(module: str) -> str:
    return module.split(".")[1]


def test_every_folder_of_the_library_has_a_floor():
    rooms = {_room(m) for m in _imports() if m != "dynatune"}
    assert rooms <= set(FLOORS), f"place these in FLOORS and docs/architecture.md: {rooms - set(FLOORS)}"


def test_imports_only_go_down_the_house():
    upward = [
        f"{a} imports {b}"
        for a, targets in _imports().items()
        for b in targets
        if a != "dynatune" and _room(a) != _room(b) and FLOORS[_room(a)] <= FLOORS[_room(b)]
    ]
    assert not upward, upward


def test_no_import_circle():
    graph = _imports()
    state: dict[str, int] = {}

    def visit(module, path):
        state[module] = 1
        for target in sorted(graph.get(module, ())):
            if state.get(target) == 1:
                raise AssertionError("import circle: " + " -> ".join([*path, module, target]))
            if target not in state:
                visit(target, [*path, module])
        state[module] = 2

    for module in sorted(graph):
        if module not in state:
            visit(module, [])
