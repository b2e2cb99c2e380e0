"""The docs name what is there: every module path and dotted name the README and docs/ give exists, every
module of the architecture's table is in its folder, and every command of the CLI is in the README's list."""

import ast
import functools
import glob
import os
import re

from helpers import ROOT

DOCS = [os.path.join(ROOT, "README.md"), *sorted(glob.glob(os.path.join(ROOT, "docs", "*.md")))]
# where each dotted package lives in the repository (pyproject.toml's package-dir)
PACKAGES = {"dynatune.flows": "flows", "dynatune.tasks": "tasks", "dynatune": "dynatune"}
PATH = re.compile(r"(?<![\w./~-])((?:dynatune|tasks|flows|bench|tests)/[\w./-]*)")
DOTTED = re.compile(r"(?<![\w./-])(dynatune(?:\.\w+)+)")


def _texts():
    for path in DOCS:
        with open(path) as f:
            yield os.path.relpath(path, ROOT), f.read()


def _module_file(dotted: str) -> str | None:
    """The file of a module or package named ``dotted``, or None."""
    for prefix, folder in PACKAGES.items():
        if dotted == prefix or dotted.startswith(prefix + "."):
            base = os.path.join(ROOT, folder, *dotted[len(prefix) :].lstrip(".").split(".")).rstrip(os.sep)
            for candidate in (base + ".py", os.path.join(base, "__init__.py")):
                if os.path.isfile(candidate):
                    return candidate
            return None
    return None


@functools.cache
def _names_in(path: str) -> set[str]:
    """What a module defines at its top and in its classes: what ``module.name`` can name."""
    names = set()
    for node in ast.walk(ast.parse(open(path).read())):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, (ast.Assign, ast.AnnAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            names |= {t.id for t in targets if isinstance(t, ast.Name)}
    return names


@functools.cache
def _strings_in_code() -> set[str]:
    """Every string constant of the package: the MLflow tags and keys it writes."""
    out = set()
    for folder in PACKAGES.values():
        for path in glob.glob(os.path.join(ROOT, folder, "**", "*.py"), recursive=True):
            for node in ast.walk(ast.parse(open(path).read())):
                if isinstance(node, ast.Constant) and isinstance(node.value, str):
                    out.add(node.value)
    return out


def _resolves(dotted: str) -> bool:
    parts = dotted.split(".")
    for k in range(len(parts), 0, -1):
        path = _module_file(".".join(parts[:k]))
        if path is not None:
            rest = parts[k:]
            return not rest or rest[0] in _names_in(path)
    return False


def test_every_module_path_the_docs_name_exists():
    missing = []
    for doc, text in _texts():
        for path in PATH.findall(text):
            if re.search(r"[<>*{}]|/[A-Z]+\b", path):  # a placeholder: dynatune/<model>, runs/NAME
                continue
            if not os.path.exists(os.path.join(ROOT, path.rstrip("."))):
                missing.append(f"{doc}: {path}")
    assert not missing, missing


def _tag(name: str) -> bool:
    """An MLflow tag the code writes: ``dynatune.status`` as a string, or as ``"dynatune." + "status"``."""
    strings = _strings_in_code()
    parts = name.split(".")
    return name in strings or (len(parts) == 2 and "dynatune." in strings and parts[1] in strings)


def test_every_dotted_name_the_docs_give_is_a_module_its_name_or_a_tag_the_code_writes():
    wrong = [
        f"{doc}: {name}"
        for doc, text in _texts()
        for name in DOTTED.findall(text)
        if not _resolves(name) and not _tag(name)
    ]
    assert not wrong, wrong


def _architecture_rows():
    """``(folder, [module names])`` of docs/architecture.md's table: each folder's modules as it lists them
    (the first name of each item, outside the parentheses that say what it is)."""
    with open(os.path.join(ROOT, "docs", "architecture.md")) as f:
        rows = [line.split("|")[1:-1] for line in f if re.match(r"\| \d+ \|", line)]
    for cells in rows:
        folder = re.search(r"`([\w/]+/)`", cells[1])
        if not folder:
            continue
        text, depth, flat = cells[3], 0, ""
        for ch in text:  # drop what the parentheses say
            depth += ch == "("
            flat += ch if depth == 0 else ""
            depth -= ch == ")" and depth > 0
        yield folder.group(1), re.findall(r"`([\w/]+)`", flat)


def test_every_module_of_the_architecture_table_is_in_its_folder():
    rows = list(_architecture_rows())
    assert len(rows) >= 10
    missing = []
    for folder, names in rows:
        base = os.path.join(
            ROOT, folder if folder in ("tasks/", "flows/") else os.path.join("dynatune", folder)
        )
        for name in names:
            if not (
                os.path.isfile(os.path.join(base, name + ".py")) or os.path.isdir(os.path.join(base, name))
            ):
                missing.append(f"{folder}{name}")
    assert not missing, missing


def test_every_command_of_the_cli_is_in_the_readmes_list():
    import argparse

    from dynatune.cli import build_parser

    with open(os.path.join(ROOT, "README.md")) as f:
        use = f.read().split("## Use", 1)[1].split("```", 2)[1]  # the list: the section's first block

    def commands(parser, prefix):
        for action in parser._actions:
            if isinstance(action, argparse._SubParsersAction):
                for name, sub in action.choices.items():
                    yield f"{prefix} {name}"
                    yield from commands(sub, f"{prefix} {name}")

    listed = list(commands(build_parser(), "dynatune"))
    assert "dynatune repair" in listed and "dynatune bench calibration" in listed

    # a command's subcommands may be listed together: `dynatune library show|export|import|prune`
    def in_list(command: str) -> bool:
        parent, name = command.rsplit(" ", 1)
        return re.search(re.escape(parent) + r" (?:[\w-]+\|)*" + re.escape(name) + r"\b", use) is not None

    absent = [c for c in listed if not in_list(c)]
    assert not absent, f"add these to the README's list of commands: {absent}"
