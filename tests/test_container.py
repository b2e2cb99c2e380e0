"""The Dockerfile installs the same locked dependency set as the README (no Docker engine needed).

- the README's install command and the Dockerfile's are the same pip command: ``-c constraints.txt``,
  the project with the same extras, editable; the image runs the README's main job by default;
- the base image's Python is the one pyproject.toml and the README ask for;
- constraints.txt pins (``==``) every requirement of pyproject.toml, and every requirement of those,
  all the way down (the whole installed closure is locked), and each pin satisfies the requirement;
- ``.ci/run`` runs exactly the README's test command;
- nothing the image needs is excluded by .dockerignore.
"""

import fnmatch
import os
import re
import shlex
import tomllib

import pytest
from helpers import ROOT
from packaging.markers import default_environment
from packaging.requirements import Requirement
from packaging.version import Version


def _read(name):
    with open(os.path.join(ROOT, name)) as f:
        return f.read()


def _norm(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def _pins() -> dict[str, str]:
    pins = {}
    for line in _read("constraints.txt").splitlines():
        line = line.split("#")[0].strip()
        if not line:
            continue
        assert re.fullmatch(r"[A-Za-z0-9_.\-]+==[A-Za-z0-9_.+!\-]+", line), f"not an exact pin: {line!r}"
        name, version = line.split("==")
        assert _norm(name) not in pins, f"{name} pinned twice"
        pins[_norm(name)] = version
    return pins


def _pyproject():
    return tomllib.loads(_read("pyproject.toml"))


def _bash_blocks(markdown: str) -> list[str]:
    return re.findall(r"```bash\n(.*?)```", markdown, flags=re.S)


def _readme_commands():
    """The two set-up commands of the README: (main job, tests), each split on ``&&``."""
    setup = _read("README.md").split("## Set up", 1)[1].split("\n## ", 1)[0]
    blocks = [b.strip() for b in _bash_blocks(setup)]
    assert len(blocks) >= 2, "the README's Set up section should hold the main job and the test command"
    return [[shlex.split(part) for part in b.split("&&")] for b in blocks[:2]]


def _pip_install(argv: list[str]) -> dict:
    """A pip install command as what it installs: constraints file, targets (editable or not)."""
    assert os.path.basename(argv[0]) in ("pip", "pip3") and argv[1] == "install", argv
    out = {"constraints": [], "targets": []}
    args = iter(argv[2:])
    for a in args:
        if a in ("-c", "--constraint"):
            out["constraints"].append(next(args))
        elif a in ("-e", "--editable"):
            out["targets"].append(("editable", next(args)))
        elif a in ("-q", "--quiet", "--no-cache-dir"):
            continue  # output and caching only
        elif a.startswith("-"):
            raise AssertionError(f"unexpected pip option {a} in {argv}")
        else:
            out["targets"].append(("plain", a))
    return out


def _dockerfile():
    lines, cur = [], ""
    for raw in _read("Dockerfile").splitlines():
        s = raw.strip()
        if not s or s.startswith("#"):
            continue
        if s.endswith("\\"):
            cur += s[:-1] + " "
            continue
        lines.append(cur + s)
        cur = ""
    instr = [(ln.split(None, 1)[0].upper(), ln.split(None, 1)[1] if " " in ln else "") for ln in lines]
    return instr


def _exec_form(value: str) -> list[str]:
    import json

    v = json.loads(value)
    assert isinstance(v, list), f"use the exec form: {value}"
    return v


def test_dockerfile_and_readme_use_the_same_install_command():
    main, _ = _readme_commands()
    readme_pip = [c for c in main if len(c) > 1 and c[0].endswith("pip") and c[1] == "install"]
    assert len(readme_pip) == 1, main
    instr = _dockerfile()
    runs = [shlex.split(v) for k, v in instr if k == "RUN"]
    docker_pip = [r for r in runs if len(r) > 1 and r[0] in ("pip", "pip3") and r[1] == "install"]
    assert len(docker_pip) == 1, "the Dockerfile installs the project with exactly one pip command"
    a, b = _pip_install(readme_pip[0]), _pip_install(docker_pip[0])
    assert a == b == {"constraints": ["constraints.txt"], "targets": [("editable", ".")]}, (a, b)
    # the project (with its constraints file) is in the image before that install runs
    at = next(i for i, (k, v) in enumerate(instr) if k == "RUN" and shlex.split(v) == docker_pip[0])
    copies = [shlex.split(v) for k, v in instr[:at] if k in ("COPY", "ADD")]
    assert any(c[:1] == ["."] for c in copies), copies


def test_image_runs_the_readme_main_job_by_default():
    main, _ = _readme_commands()
    readme_run = [c for c in main if os.path.basename(c[0]) == "dynatune"]
    assert readme_run == [[main[-1][0], "tune", "configs/quickstart.yaml"]], main
    instr = dict((k, v) for k, v in _dockerfile())
    cmd = _exec_form(instr["ENTRYPOINT"]) + _exec_form(instr["CMD"])
    assert cmd == ["dynatune", "tune", "configs/quickstart.yaml"]
    assert os.path.exists(os.path.join(ROOT, "configs", "quickstart.yaml"))


def test_base_image_python_matches_pyproject_and_readme():
    base = [v for k, v in _dockerfile() if k == "FROM"]
    assert base == ["python:3.11-slim"], base
    m = re.match(r"python:(\d+\.\d+)", base[0])
    py = Version(m.group(1) + ".0")
    spec = _pyproject()["project"]["requires-python"]
    from packaging.specifiers import SpecifierSet

    assert py in SpecifierSet(spec), (py, spec)
    assert f"Python {m.group(1)}" in _read("README.md")


def test_constraints_pin_every_requirement_of_pyproject():
    pins = _pins()
    project = _pyproject()["project"]
    reqs = list(project["dependencies"])
    for extra, deps in project.get("optional-dependencies", {}).items():
        reqs += deps
    for text in reqs:
        r = Requirement(text)
        name = _norm(r.name)
        assert name in pins, f"{r.name} (pyproject.toml) is not pinned in constraints.txt"
        assert r.specifier.contains(pins[name], prereleases=True), (
            f"constraints.txt pins {r.name}=={pins[name]}, which pyproject.toml's {text!r} rejects"
        )


def test_constraints_lock_the_whole_dependency_closure():
    """Every package the project's requirements pull in, transitively, is pinned, and each pin satisfies
    all the requirements on it (the metadata of the pinned versions is what is installed here)."""
    import importlib.metadata as md

    pins = _pins()
    env = default_environment()
    project = _pyproject()["project"]
    todo = [(Requirement(t), "pyproject.toml") for t in project["dependencies"]]
    todo += [
        (Requirement(t), "pyproject.toml [test]")
        for t in project.get("optional-dependencies", {}).get("test", [])
    ]
    seen, problems = set(), []
    while todo:
        req, by = todo.pop()
        name = _norm(req.name)
        if name not in pins:
            problems.append(f"{req.name} (required by {by}) is not pinned")
            continue
        if not req.specifier.contains(pins[name], prereleases=True):
            problems.append(f"{req.name}=={pins[name]} does not satisfy {by}'s {req}")
        key = (name, tuple(sorted(req.extras)))
        if key in seen:
            continue
        seen.add(key)
        try:
            dist = md.distribution(req.name)
        except md.PackageNotFoundError:
            problems.append(f"{req.name} is pinned but not installed in this environment")
            continue
        if _norm(dist.version) != _norm(pins[name]):
            problems.append(f"{req.name}: installed {dist.version}, pinned {pins[name]}")
        for text in dist.requires or []:
            sub = Requirement(text)
            extras = req.extras or {""}
            if sub.marker is not None and not any(sub.marker.evaluate(env | {"extra": e}) for e in extras):
                continue
            todo.append((sub, f"{req.name}{'[' + ','.join(sorted(req.extras)) + ']' if req.extras else ''}"))
    assert not problems, "; ".join(sorted(set(problems)))


def test_ci_runs_the_readme_test_command():
    _, tests = _readme_commands()
    ci = [ln.strip() for ln in _read(".ci/run").splitlines() if ln.strip() and not ln.strip().startswith("#")]
    body = [ln for ln in ci if not ln.startswith(("set ", "cd "))]
    assert len(body) == 1 and [shlex.split(p) for p in body[0].split("&&")] == tests, (body, tests)
    # the same install as the main job's, plus the test extra
    pip = [c for c in tests if len(c) > 1 and c[0].endswith("pip") and c[1] == "install"]
    assert _pip_install(pip[0]) == {"constraints": ["constraints.txt"], "targets": [("editable", ".[test]")]}


@pytest.mark.parametrize(
    "path",
    [
        "pyproject.toml",
        "constraints.txt",
        "README.md",
        "configs/quickstart.yaml",
        "dynatune/cli.py",
        "flows/tune_model.py",
        "tasks/tracking.py",
        "prefect.yaml",
    ],
)
def test_dockerignore_keeps_what_the_image_needs(path):
    patterns = [p.strip() for p in _read(".dockerignore").splitlines() if p.strip() and not p.startswith("#")]
    parts = path.split("/")
    prefixes = ["/".join(parts[: i + 1]) for i in range(len(parts))]
    for pat in patterns:
        pat = pat.rstrip("/")
        for p in prefixes:
            assert not (fnmatch.fnmatch(p, pat) or fnmatch.fnmatch(p, pat.replace("**/", ""))), (path, pat)
