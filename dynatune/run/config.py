"""Run configs: one YAML file per tuning run, validated up front.

Every key is optional (see ``configs/quickstart.yaml`` for a commented example). Before anything runs,
:func:`load_config` checks the whole file and reports every problem at once, each with its key path::

    config x.yaml has 2 problems: budget_s: must be > 0, got -5; slot: unknown key (did you mean 'slot_s'?)

as ONE :class:`~dynatune.errors.DynatuneError` (the lines: :mod:`dynatune.run.config_messages`). The
result is a tree of pydantic models (:class:`~dynatune.run.config_schema.Config`, one per section) with
every default filled in and every path resolved, so later stages never look at raw YAML.

Overrides, in order: the file, then ``--set key.path=value`` strings (the value is YAML, e.g.
``--set measure.adaptive=true``), then the CLI's own flags (``model``, ``shapes``, ``budget``,
``scheduler``, ``work_dir``); validation runs once, after all of them.

The model file is NOT opened here (the model importer checks it), so configs naming a model that is not on
this machine still load.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import yaml
from pydantic import ValidationError

from dynatune import secrets
from dynatune.errors import DynatuneError
from dynatune.files import WorkDir
from dynatune.run.config_messages import describe, one_line, problem_lines, short
from dynatune.run.config_schema import Config

_HINT = "fix the listed keys; configs/quickstart.yaml shows every key with its default"


def default_model_path() -> str:
    """The built-in default model: the onnx package's light SqueezeNet 1.1 with seeded random weights,
    ``squeezenet1.1-random-weights`` (:mod:`dynatune.model.default_model`; made once, then cached)."""
    from dynatune.model.default_model import default_model_path as random_weights_squeezenet

    return random_weights_squeezenet()


class _Loader(yaml.SafeLoader):
    """``safe_load`` that rejects a key given twice in one mapping (YAML keeps the last one silently)."""

    def construct_mapping(self, node, deep=False):
        if isinstance(node, yaml.MappingNode):
            seen = {}
            for key_node, _ in node.value:
                if key_node.tag == "tag:yaml.org,2002:merge" or not isinstance(key_node, yaml.ScalarNode):
                    continue
                key = self.construct_object(key_node, deep=False)
                try:
                    if key in seen:
                        raise yaml.constructor.ConstructorError(
                            None, None, f"duplicate key {short(key)}", key_node.start_mark
                        )
                    seen[key] = True
                except TypeError:
                    continue
        return super().construct_mapping(node, deep=deep)


def load_config(path: str | None, overrides=(), **cli) -> Config:
    """Read, override and validate a run config; ``path=None`` is all defaults.

    ``overrides``: ``KEY.PATH=VALUE`` strings (``--set``), VALUE parsed as YAML. ``cli``: ``model``,
    ``shapes`` (name -> tuple, merged into model.shapes), ``budget``, ``scheduler``, ``work_dir``; None
    values are ignored. Raises :class:`DynatuneError` listing every problem.
    """
    unknown = set(cli) - {"model", "shapes", "budget", "scheduler", "work_dir"}
    if unknown:
        raise TypeError(f"load_config() got unexpected keyword arguments {sorted(unknown)}")
    if path is None:
        raw: Any = {}
        source = "(defaults)"
    else:
        source = one_line(str(path))
        raw = _read_yaml(str(path), source)
        if raw is None:  # an empty file: all defaults
            raw = {}
        if not isinstance(raw, dict):
            raise DynatuneError(
                f"config {source}: the top level must be a mapping of keys, got {describe(raw)}", _HINT
            )
        # a relative model path is relative to the config's directory when the model is there
        model = raw.get("model")
        if (
            isinstance(model, dict)
            and isinstance(model.get("path"), str)
            and model["path"]
            and not os.path.isabs(model["path"])
        ):
            beside = os.path.join(os.path.dirname(os.path.abspath(str(path))), model["path"])
            if os.path.exists(beside):
                model["path"] = os.path.normpath(beside)

    problems: list[str] = []
    for text in overrides:
        _apply_override(raw, text, problems)
    if cli.get("model") is not None:
        _set_path(raw, ["model", "path"], str(cli["model"]), "model", problems)
    if cli.get("shapes") is not None:
        shapes = {k: list(v) if isinstance(v, (tuple, list)) else v for k, v in dict(cli["shapes"]).items()}
        model = raw.get("model")
        existing = model.get("shapes") if isinstance(model, dict) else None
        if isinstance(existing, dict):
            existing.update(shapes)
        else:
            _set_path(raw, ["model", "shapes"], shapes, "shapes", problems)
    if cli.get("budget") is not None:
        raw["budget_s"] = cli["budget"]
    if cli.get("scheduler") is not None:
        _set_path(raw, ["scheduler", "name"], cli["scheduler"], "scheduler", problems)
    if cli.get("work_dir") is not None:
        raw["work_dir"] = str(cli["work_dir"])
    return _validate(raw, source, problems)


def saved_config(work_dir: str) -> Config:
    """The config a run saved in its work dir (``config.json``), validated, its ``work_dir`` this path (the
    work dir may have been copied or moved); a damaged file is one line and exit 2."""
    from dynatune.search.state_files import read_json_file

    path = WorkDir(work_dir).config
    cfg = validate_dict(read_json_file(path, dict), path)
    cfg.work_dir = os.path.abspath(work_dir)
    return cfg


def validate_dict(raw, source: str = "(dict)") -> Config:
    """Validate a raw config mapping (e.g. parsed YAML, or ``Config.to_dict()``) into a :class:`Config`."""
    source = one_line(str(source))
    if not isinstance(raw, dict):
        raise DynatuneError(
            f"config {source}: the top level must be a mapping of keys, got {describe(raw)}", _HINT
        )
    return _validate(raw, source, [])


def _is_onnx(path: str) -> bool:
    """An ONNX file: named so, or starting as one does (its first field, ``ir_version``: byte 0x08, which no
    YAML text starts with)."""
    if path.lower().endswith(".onnx"):
        return True
    try:
        with open(path, "rb") as f:
            return f.read(1) == b"\x08"
    except OSError:
        return False  # reading it again below says why


def _read_yaml(path: str, source: str):
    if not os.path.exists(path):
        raise DynatuneError(
            f"config file {source} not found", "check the path, or start from configs/quickstart.yaml"
        )
    if os.path.isdir(path):
        raise DynatuneError(f"config {source} is a directory, not a YAML file")
    if _is_onnx(path):
        raise DynatuneError(f"{source} is an ONNX model, not a YAML config", f"use --model {source}")
    try:
        with open(path, encoding="utf-8") as f:
            text = f.read()
    except UnicodeDecodeError:
        raise DynatuneError(f"config {source} is not UTF-8 text") from None
    except OSError as exc:
        raise DynatuneError(f"cannot read config {source}: {one_line(exc.strerror or str(exc))}") from None
    try:
        return yaml.load(text, Loader=_Loader)  # noqa: S506 - a SafeLoader subclass
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        what = one_line(exc.problem or exc.context or "invalid YAML")
        raise DynatuneError(
            f"config {source}: YAML syntax error{where}: {what}",
            "check the indentation and quoting around that line",
        ) from None
    except (yaml.YAMLError, ValueError) as exc:  # ValueError: e.g. a date like 2024-13-01
        raise DynatuneError(f"config {source}: invalid YAML: {one_line(str(exc))}") from None
    except RecursionError:
        raise DynatuneError(f"config {source}: YAML nested too deeply") from None


def _apply_override(raw: dict, text, problems: list[str]) -> None:
    text = str(text)
    key, sep, value = text.partition("=")
    parts = key.strip().split(".")
    if not sep or not all(p.strip() for p in parts):
        problems.append(f"--set {short(text)}: expected KEY.PATH=VALUE, e.g. measure.adaptive=true")
        return
    try:
        parsed = yaml.safe_load(value) if value.strip() else None
    except Exception:  # noqa: BLE001 - yaml.YAMLError, or ValueError for an impossible date
        parsed = value  # not YAML (e.g. 'a: b'): take it as a plain string
    _set_path(raw, [p.strip() for p in parts], parsed, f"--set {short(text)}", problems)


def _set_path(raw: dict, parts: list[str], value, origin: str, problems: list[str]) -> None:
    node = raw
    for i, part in enumerate(parts[:-1]):
        nxt = node.get(part)
        if nxt is None:
            nxt = node[part] = {}
        elif not isinstance(nxt, dict):
            problems.append(f"{origin}: {'.'.join(parts[: i + 1])} is {describe(nxt)}, not a mapping")
            return
        node = nxt
    node[parts[-1]] = value


def _validate(raw: dict, source: str, problems: list[str]) -> Config:
    raw = secrets.resolve_all(raw)  # any setting may be given as env:NAME (what to_dict passes on)
    try:
        cfg = Config.model_validate(raw)
    except ValidationError as exc:
        problems = [*problems, *problem_lines(exc, Config)]
    if problems:
        n = len(problems)
        raise DynatuneError(
            f"config {source} has {n} problem{'s' if n != 1 else ''}: " + "; ".join(problems), _HINT
        )

    cfg._source = source
    model = cfg.model
    model.path = os.path.abspath(model.path) if model.path else default_model_path()
    stem = Path(model.path).stem
    model.name = model.name or (stem if stem.strip() else "model")
    cfg.work_dir = os.path.abspath(cfg.work_dir or os.path.join("runs", model.name))
    tracking = cfg.tracking
    default_uri = "sqlite:///" + WorkDir(cfg.work_dir).mlflow_db
    tracking.uri = tracking.uri or os.environ.get("MLFLOW_TRACKING_URI") or default_uri
    tracking.experiment = tracking.experiment or f"dynatune/{model.name}"
    cfg.prefect_api_url = cfg.prefect_api_url or None
    return cfg
