"""Run configs: one YAML file per tuning run, validated up front.

Every key is optional (see ``configs/quickstart.yaml`` for a commented example). Before anything runs,
:func:`load_config` checks the whole file and reports every problem at once, each with its key path::

    config configs/x.yaml has 2 problems: measure.rel_tol: must be in (0, 1), got 1.5; budget: unknown key (did you mean 'budget_s'?)

as ONE :class:`~dynatune.errors.DynatuneError`. The result is a tree of dataclasses (:class:`Config`) with
every default filled in and every path resolved, so later stages never look at raw YAML.

Overrides, in order: the file, then ``--set key.path=value`` strings (the value is YAML, e.g.
``--set measure.adaptive=true``), then the CLI's own flags (``model``, ``shapes``, ``budget``,
``scheduler``, ``work_dir``); validation runs once, after all of them.

The model file is NOT opened here (the model importer checks it), so configs naming a model that is not on
this machine still load.
"""

from __future__ import annotations

import dataclasses
import difflib
import hashlib
import importlib.util
import json
import math
import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from .errors import DynatuneError

SCHEDULERS = ("dynatune", "round_robin", "gradient", "random", "greedy")
COST_MODELS = ("xgb", "ensemble", "random")
MAX_SEED = 2**32 - 1

_HINT = "fix the listed keys; configs/quickstart.yaml shows every key with its default"


# -- the resolved config ----------------------------------------------------------------------------
@dataclass
class ModelSection:
    path: str = ""  # absolute; the onnx package's light squeezenet when not given
    shapes: dict[str, tuple[int, ...]] = field(default_factory=dict)
    name: str = ""  # the file stem when not given
    version: str | None = None


@dataclass
class SchedulerSection:
    name: str = "dynatune"
    params: dict = field(default_factory=dict)  # scheduler-specific, passed through
    seed: int = 0


@dataclass
class SearchSection:
    trials_per_iter: int = 16
    population_size: int = 128
    genetic_num_iters: int = 2
    eps_greedy: float = 0.05
    cost_model: str = "xgb"
    contextual_exploration: bool = False
    max_trials_per_task: int = 10_000
    seed: int = 0
    build_timeout_s: float = 15.0  # a legit build takes < 1 s; a pathological one (huge unroll) minutes


@dataclass
class MeasureSection:
    adaptive: bool = False
    repeat: int = 5
    min_repeat_ms: int = 10
    number: int = 1
    min_repeats: int = 3
    max_repeats: int = 10
    batch: int = 2
    rel_tol: float = 0.02
    race_factor: float = 1.5
    quick_race_factor: float = 3.0
    adaptive_repeat_ms: int = 4
    timeout_s: float = 30.0
    cpu_cache_flush: bool = False
    rpc: dict | None = None  # {tracker_host, tracker_port, tracker_key[, session_timeout_s, max_workers]}


@dataclass
class CompileSection:
    verify: bool = True
    rel_tol: float = 1e-4
    measure_untuned: bool = True
    measure_onnxruntime: bool = True
    prepack: bool = True  # CPU targets: tuned conv/dense/matmul kernels choose their weight layout


@dataclass
class TrackingSection:
    uri: str = ""  # MLFLOW_TRACKING_URI, else sqlite:///<work_dir>/mlflow.db
    experiment: str = ""  # dynatune/<model name>
    run_name: str | None = None
    tags: dict[str, str] = field(default_factory=dict)


@dataclass
class Config:
    model: ModelSection = field(default_factory=ModelSection)
    target: str | dict = "llvm"
    budget_s: float = 600.0
    slot_s: float = 20.0
    scheduler: SchedulerSection = field(default_factory=SchedulerSection)
    search: SearchSection = field(default_factory=SearchSection)
    measure: MeasureSection = field(default_factory=MeasureSection)
    compile: CompileSection = field(default_factory=CompileSection)
    work_dir: str = ""  # absolute; runs/<model name> when not given
    tracking: TrackingSection = field(default_factory=TrackingSection)
    prefect_api_url: str | None = None
    warm_start: list[str] = field(default_factory=list)  # absolute paths of earlier work dirs
    source: str = field(default="(defaults)", compare=False, repr=False)  # where it came from; not a setting

    def to_dict(self) -> dict:
        """The fully resolved config as plain JSON-able data (``validate_dict`` accepts it back)."""
        d = dataclasses.asdict(self)
        d.pop("source", None)
        d["model"]["shapes"] = {k: list(v) for k, v in self.model.shapes.items()}
        return json.loads(json.dumps(d))  # plain lists/dicts all the way down

    def config_hash(self) -> str:
        """sha256 of what defines a tuning run: model path and shapes, target, scheduler, search, measure.

        Not the budget, the work dir or the tracking settings: re-running with a larger budget is the same
        run, resumed.
        """
        d = self.to_dict()
        identity = {
            "model": {"path": d["model"]["path"], "shapes": d["model"]["shapes"]},
            "target": d["target"],
            "scheduler": d["scheduler"],
            "search": d["search"],
            "measure": d["measure"],
        }
        blob = json.dumps(identity, sort_keys=True, separators=(",", ":"))
        return hashlib.sha256(blob.encode()).hexdigest()

    def search_config(self):
        """The session's :class:`~dynatune.session.SearchConfig` (every field it knows about)."""
        from .session import SearchConfig

        have = dataclasses.asdict(self.search)
        names = {f.name for f in dataclasses.fields(SearchConfig)}
        return SearchConfig(**{k: v for k, v in have.items() if k in names})

    def measure_config(self):
        """The runner's :class:`~dynatune.measure.MeasureConfig`."""
        from .measure import MeasureConfig

        have = dataclasses.asdict(self.measure)
        have["max_repeats_adaptive"] = have.pop("max_repeats")
        if have.get("rpc") is not None:
            have["rpc"] = dict(have["rpc"])
        names = {f.name for f in dataclasses.fields(MeasureConfig)}
        return MeasureConfig(**{k: v for k, v in have.items() if k in names})


# -- loading ----------------------------------------------------------------------------------------
def default_model_path() -> str:
    """The onnx package's light squeezenet (ships with ``onnx``; found without importing it)."""
    spec = importlib.util.find_spec("onnx")
    if spec is not None and spec.submodule_search_locations:
        root = list(spec.submodule_search_locations)[0]
    else:  # pragma: no cover - onnx is a dependency
        import onnx

        root = os.path.dirname(onnx.__file__)
    return os.path.join(root, "backend", "test", "data", "light", "light_squeezenet.onnx")


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
                            None, None, f"duplicate key {_short(key)}", key_node.start_mark)
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
        source = _clean(str(path))
        raw = _read_yaml(str(path), source)
        if raw is None:  # an empty file: all defaults
            raw = {}
        if not isinstance(raw, dict):
            raise DynatuneError(f"config {source}: the top level must be a mapping of keys, got {_describe(raw)}",
                                _HINT)
        # a relative model path is relative to the config's directory when the model is there
        model = raw.get("model")
        if isinstance(model, dict) and isinstance(model.get("path"), str) and model["path"] \
                and not os.path.isabs(model["path"]):
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


def validate_dict(raw, source: str = "(dict)") -> Config:
    """Validate a raw config mapping (e.g. parsed YAML, or ``Config.to_dict()``) into a :class:`Config`."""
    source = _clean(str(source))
    if not isinstance(raw, dict):
        raise DynatuneError(f"config {source}: the top level must be a mapping of keys, got {_describe(raw)}",
                            _HINT)
    return _validate(raw, source, [])


def _read_yaml(path: str, source: str):
    if not os.path.exists(path):
        raise DynatuneError(f"config file {source} not found", "check the path, or start from configs/quickstart.yaml")
    if os.path.isdir(path):
        raise DynatuneError(f"config {source} is a directory, not a YAML file")
    try:
        with open(path, encoding="utf-8") as f:
            text = f.read()
    except UnicodeDecodeError:
        raise DynatuneError(f"config {source} is not UTF-8 text") from None
    except OSError as exc:
        raise DynatuneError(f"cannot read config {source}: {_clean(exc.strerror or str(exc))}") from None
    try:
        return yaml.load(text, Loader=_Loader)  # noqa: S506 - a SafeLoader subclass
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        what = _clean(exc.problem or exc.context or "invalid YAML")
        raise DynatuneError(f"config {source}: YAML syntax error{where}: {what}",
                            "check the indentation and quoting around that line") from None
    except (yaml.YAMLError, ValueError) as exc:  # ValueError: e.g. a date like 2024-13-01
        raise DynatuneError(f"config {source}: invalid YAML: {_clean(str(exc))}") from None
    except RecursionError:
        raise DynatuneError(f"config {source}: YAML nested too deeply") from None


def _apply_override(raw: dict, text, problems: list[str]) -> None:
    text = str(text)
    key, sep, value = text.partition("=")
    parts = key.strip().split(".")
    if not sep or not all(p.strip() for p in parts):
        problems.append(f"--set {_short(text)}: expected KEY.PATH=VALUE, e.g. measure.adaptive=true")
        return
    try:
        parsed = yaml.safe_load(value) if value.strip() else None
    except Exception:  # noqa: BLE001 - yaml.YAMLError, or ValueError for an impossible date
        parsed = value  # not YAML (e.g. 'a: b'): take it as a plain string
    _set_path(raw, [p.strip() for p in parts], parsed, f"--set {_short(text)}", problems)


def _set_path(raw: dict, parts: list[str], value, origin: str, problems: list[str]) -> None:
    node = raw
    for i, part in enumerate(parts[:-1]):
        nxt = node.get(part)
        if nxt is None:
            nxt = node[part] = {}
        elif not isinstance(nxt, dict):
            problems.append(f"{origin}: {'.'.join(parts[:i + 1])} is {_describe(nxt)}, not a mapping")
            return
        node = nxt
    node[parts[-1]] = value


# -- validation -------------------------------------------------------------------------------------
class _Bad:
    """Marks a value that failed its check (the problem is already recorded)."""


BAD = _Bad()


class _Checker:
    def __init__(self, problems: list[str]):
        self.problems = problems

    def fail(self, path: str, msg: str):
        self.problems.append(f"{path}: {msg}")
        return BAD

    # scalar checks: each returns the value (normalised) or BAD
    def boolean(self, v, path):
        if isinstance(v, bool):
            return v
        return self.fail(path, f"must be true or false, got {_describe(v)}")

    def integer(self, v, path, lo=None, hi=None):
        if isinstance(v, bool) or not isinstance(v, int):
            return self.fail(path, f"must be an integer, got {_describe(v)}")
        if lo is not None and hi is not None and not lo <= v <= hi:
            return self.fail(path, f"must be in [{lo}, {hi}], got {_short(v)}")
        if lo is not None and v < lo:
            return self.fail(path, f"must be >= {lo}, got {_short(v)}")
        return v

    def number(self, v, path, gt=None, ge=None, lt=None, le=None):
        if isinstance(v, bool) or not isinstance(v, (int, float)):
            return self.fail(path, f"must be a number, got {_describe(v)}")
        try:
            x = float(v)
        except OverflowError:
            return self.fail(path, f"must be a finite number, got {_short(v)}")
        if not math.isfinite(x):
            return self.fail(path, f"must be a finite number, got {_short(v)}")
        lo_ok = (gt is None or x > gt) and (ge is None or x >= ge)
        hi_ok = (lt is None or x < lt) and (le is None or x <= le)
        if not (lo_ok and hi_ok):
            lo = gt if gt is not None else ge
            hi = lt if lt is not None else le
            if lo is not None and hi is not None:
                left, right = ("(" if gt is not None else "["), (")" if lt is not None else "]")
                return self.fail(path, f"must be in {left}{_num(lo)}, {_num(hi)}{right}, got {_short(v)}")
            if lo is not None:
                return self.fail(path, f"must be {'>' if gt is not None else '>='} {_num(lo)}, got {_short(v)}")
            return self.fail(path, f"must be {'<' if lt is not None else '<='} {_num(hi)}, got {_short(v)}")
        return x

    def string(self, v, path, nullable=False, choices=None):
        if v is None and nullable:
            return None
        if not isinstance(v, str):
            what = "a string or null" if nullable else "a string"
            quote = " (quote it)" if isinstance(v, (int, float)) or type(v).__module__ == "datetime" else ""
            return self.fail(path, f"must be {what}, got {_describe(v)}{quote}")
        if choices is not None and v not in choices:
            return self.fail(path, f"must be one of {', '.join(choices)}, got {_short(v)}")
        if not v.strip():
            return self.fail(path, "must not be empty")
        return v

    def plain(self, v, path, _stack=()):
        """Pass-through data: JSON-able (string keys, finite numbers), returned as a copy."""
        if v is None or isinstance(v, (bool, str)):
            return v
        if isinstance(v, int):
            return v
        if isinstance(v, float):
            return v if math.isfinite(v) else self.fail(path, f"must be a finite number, got {_short(v)}")
        if isinstance(v, (list, dict)):
            if id(v) in _stack:
                return self.fail(path, "is a recursive structure")
            stack = (*_stack, id(v))
            if isinstance(v, list):
                out = [self.plain(x, f"{path}[{i}]", stack) for i, x in enumerate(v)]
                return BAD if any(x is BAD for x in out) else out
            res, bad = {}, False
            for k, x in v.items():
                if not isinstance(k, str):
                    self.fail(path, f"keys must be strings, got {_describe(k)}")
                    bad = True
                    continue
                y = self.plain(x, _join(path, k), stack)
                bad |= y is BAD
                res[k] = y
            return BAD if bad else res
        return self.fail(path, f"must be plain data (string, number, bool, null, list, mapping), got {_describe(v)}")

    def mapping(self, v, path, fields: dict, nullable_section=True):
        """Check a section: known keys only; returns {key: checked value} for the keys present."""
        if v is None and nullable_section:
            return {}
        if not isinstance(v, dict):
            self.fail(path, f"must be a mapping, got {_describe(v)}")
            return None
        out = {}
        for k, x in v.items():
            if not isinstance(k, str) or k not in fields:
                self.unknown(path, k, fields)
                continue
            out[k] = fields[k](x, _join(path, k))
        return out

    def unknown(self, path, key, known):
        close = difflib.get_close_matches(key, list(known), n=1) if isinstance(key, str) else []
        hint = f"did you mean '{close[0]}'?" if close else f"expected one of: {', '.join(known)}"
        self.problems.append(f"{_join(path, key)}: unknown key ({hint})")


def _validate(raw: dict, source: str, problems: list[str]) -> Config:
    c = _Checker(problems)
    I, N, B, S = c.integer, c.number, c.boolean, c.string  # noqa: E741

    def shapes(v, path):
        if v is None:
            return {}
        if not isinstance(v, dict):
            return c.fail(path, f"must be a mapping of input name to shape, got {_describe(v)}")
        out = {}
        for name, shape in v.items():
            if not isinstance(name, str) or not name:
                c.fail(path, f"input names must be non-empty strings, got {_describe(name)}")
                continue
            dims = _parse_dims(shape)
            if dims is None:
                c.fail(_join(path, name), "must be a list of positive integers or a string like '1x3x224x224', "
                       f"got {_describe(shape)}")
                continue
            out[name] = dims
        return out

    def target(v, path):
        if isinstance(v, str):
            if not v.strip():
                return c.fail(path, "must not be empty")
            if " " in v.strip():
                return c.fail(path, f"{_short(v)} uses the CLI string form, which TVM 0.27 rejects; "
                              "give a kind name like 'llvm' or a mapping such as {kind: llvm, mcpu: ...}")
            return v
        if isinstance(v, dict):
            kind = S(v["kind"], _join(path, "kind")) if "kind" in v else \
                c.fail(path, "a target mapping needs a 'kind' (e.g. llvm, cuda)")
            d = c.plain({k: x for k, x in v.items() if k != "kind"}, path)
            return BAD if kind is BAD or d is BAD else {"kind": kind, **d}
        return c.fail(path, f"must be a kind name like 'llvm' or a mapping with a 'kind', got {_describe(v)}")

    def params(v, path):
        if v is None:
            return {}
        if not isinstance(v, dict):
            return c.fail(path, f"must be a mapping, got {_describe(v)}")
        return c.plain(v, path)

    def tags(v, path):
        if v is None:
            return {}
        if not isinstance(v, dict):
            return c.fail(path, f"must be a mapping of string to string, got {_describe(v)}")
        out, bad = {}, False
        for k, x in v.items():
            if not isinstance(k, str):
                c.fail(path, f"tag names must be strings, got {_describe(k)}")
                bad = True
                continue
            if not isinstance(x, str):
                c.fail(_join(path, k), f"must be a string, got {_describe(x)} (quote it)")
                bad = True
                continue
            out[k] = x
        return BAD if bad else out

    def str_list(v, path):
        if v is None:
            return []
        if not isinstance(v, list):
            return c.fail(path, f"must be a list of paths, got {_describe(v)}")
        out = [S(x, f"{path}[{i}]") for i, x in enumerate(v)]
        return BAD if any(x is BAD for x in out) else [os.path.abspath(x) for x in out]

    rpc_fields = {
        "tracker_host": lambda v, p: S(v, p),
        "tracker_port": lambda v, p: I(v, p, 1, 65535),
        "tracker_key": lambda v, p: S(v, p),
        "session_timeout_s": lambda v, p: N(v, p, gt=0),
        "max_workers": lambda v, p: I(v, p, 1),
    }

    def rpc(v, path):
        if v is None:
            return None
        got = c.mapping(v, path, rpc_fields, nullable_section=False)
        if got is None:
            return BAD
        missing = [k for k in ("tracker_host", "tracker_port", "tracker_key") if k not in got]
        if missing:
            c.fail(path, f"missing {', '.join(missing)}")
        if missing or any(x is BAD for x in got.values()):
            return BAD
        return got

    schema = {
        "model": {
            "path": lambda v, p: S(v, p, nullable=True),
            "shapes": shapes,
            "name": lambda v, p: S(v, p, nullable=True),
            "version": lambda v, p: S(v, p, nullable=True),
        },
        "target": target,
        "budget_s": lambda v, p: N(v, p, gt=0),
        "slot_s": lambda v, p: N(v, p, gt=0),
        "scheduler": {
            "name": lambda v, p: S(v, p, choices=SCHEDULERS),
            "params": params,
            "seed": lambda v, p: I(v, p, 0, MAX_SEED),
        },
        "search": {
            "trials_per_iter": lambda v, p: I(v, p, 1),
            "population_size": lambda v, p: I(v, p, 8),
            "genetic_num_iters": lambda v, p: I(v, p, 0),
            "eps_greedy": lambda v, p: N(v, p, ge=0, le=1),
            "cost_model": lambda v, p: S(v, p, choices=COST_MODELS),
            "contextual_exploration": B,
            "max_trials_per_task": lambda v, p: I(v, p, 1),
            "seed": lambda v, p: I(v, p, 0, MAX_SEED),
            "build_timeout_s": lambda v, p: N(v, p, gt=0),
        },
        "measure": {
            "adaptive": B,
            "repeat": lambda v, p: I(v, p, 1),
            "min_repeat_ms": lambda v, p: I(v, p, 0),
            "number": lambda v, p: I(v, p, 1),
            "min_repeats": lambda v, p: I(v, p, 2),
            "max_repeats": lambda v, p: I(v, p, 1),
            "batch": lambda v, p: I(v, p, 1),
            "rel_tol": lambda v, p: N(v, p, gt=0, lt=1),
            "race_factor": lambda v, p: N(v, p, gt=1),
            "quick_race_factor": lambda v, p: N(v, p, gt=1),
            "adaptive_repeat_ms": lambda v, p: I(v, p, 0),
            "timeout_s": lambda v, p: N(v, p, gt=0),
            "cpu_cache_flush": B,
            "rpc": rpc,
        },
        "compile": {
            "verify": B,
            "rel_tol": lambda v, p: N(v, p, gt=0),
            "measure_untuned": B,
            "measure_onnxruntime": B,
            "prepack": B,
        },
        "work_dir": lambda v, p: S(v, p),
        "tracking": {
            "uri": lambda v, p: S(v, p, nullable=True),
            "experiment": lambda v, p: S(v, p, nullable=True),
            "run_name": lambda v, p: S(v, p, nullable=True),
            "tags": tags,
        },
        "prefect_api_url": lambda v, p: S(v, p, nullable=True),
        "warm_start": str_list,
    }

    got: dict[str, Any] = {}
    for key, value in raw.items():
        if not isinstance(key, str) or key not in schema:
            c.unknown("", key, schema)
            continue
        spec = schema[key]
        if isinstance(spec, dict):
            sec = c.mapping(value, key, spec)
            got[key] = BAD if sec is None else sec
        else:
            got[key] = spec(value, key)

    # cross-field checks, only between values that are valid on their own
    budget = got.get("budget_s", Config.budget_s)
    slot = got.get("slot_s", Config.slot_s)
    if budget is not BAD and slot is not BAD and slot > budget:
        c.fail("slot_s", f"must be <= budget_s ({_num(budget)}), got {_num(slot)}")
    m = got.get("measure") if isinstance(got.get("measure"), dict) else {}
    lo = m.get("min_repeats", MeasureSection.min_repeats)
    hi = m.get("max_repeats", MeasureSection.max_repeats)
    if lo is not BAD and hi is not BAD and hi < lo:
        c.fail("measure.max_repeats", f"must be >= measure.min_repeats ({lo}), got {hi}")

    if problems:
        n = len(problems)
        raise DynatuneError(f"config {source} has {n} problem{'s' if n != 1 else ''}: " + "; ".join(problems),
                            _HINT)

    def section(cls, key):
        return cls(**(got.get(key) or {}))

    model = section(ModelSection, "model")
    model.path = os.path.abspath(model.path) if model.path else default_model_path()
    stem = Path(model.path).stem
    model.name = model.name or (stem if stem.strip() else "model")
    model.shapes = dict(model.shapes or {})
    work_dir = os.path.abspath(got.get("work_dir") or os.path.join("runs", model.name))
    tracking = section(TrackingSection, "tracking")
    tracking.uri = tracking.uri or os.environ.get("MLFLOW_TRACKING_URI") or \
        "sqlite:///" + os.path.join(work_dir, "mlflow.db")
    tracking.experiment = tracking.experiment or f"dynatune/{model.name}"
    tracking.tags = dict(tracking.tags or {})
    sched = section(SchedulerSection, "scheduler")
    sched.params = dict(sched.params or {})

    return Config(
        model=model,
        target=got.get("target", Config.target),
        budget_s=got.get("budget_s", Config.budget_s),
        slot_s=got.get("slot_s", Config.slot_s),
        scheduler=sched,
        search=section(SearchSection, "search"),
        measure=section(MeasureSection, "measure"),
        compile=section(CompileSection, "compile"),
        work_dir=work_dir,
        tracking=tracking,
        prefect_api_url=got.get("prefect_api_url"),
        warm_start=list(got.get("warm_start") or []),
        source=source,
    )


# -- helpers ----------------------------------------------------------------------------------------
_PLAIN_KEY = re.compile(r"[A-Za-z_][A-Za-z0-9_\-]*")


def _join(path: str, key) -> str:
    k = key if isinstance(key, str) and _PLAIN_KEY.fullmatch(key) and len(key) <= 60 else _short(key)
    return f"{path}.{k}" if path else k


def _parse_dims(v) -> tuple[int, ...] | None:
    if isinstance(v, str):
        try:
            dims = tuple(int(d) for d in v.lower().replace(",", "x").split("x"))
        except ValueError:
            return None
    elif isinstance(v, (list, tuple)):
        if any(isinstance(d, bool) or not isinstance(d, int) for d in v):
            return None
        dims = tuple(v)
    else:
        return None
    return dims if dims and all(d > 0 for d in dims) else None


def _num(x) -> str:
    return f"{x:g}" if isinstance(x, float) else str(x)


def _clean(text: str) -> str:
    """One line, whatever the text holds."""
    return " ".join(str(text).split())


def _short(v, limit: int = 60) -> str:
    """A one-line, bounded rendering of a value for a message."""
    if v is None:
        s = "null"
    elif isinstance(v, bool):
        s = "true" if v else "false"
    elif isinstance(v, float):
        s = repr(v)
    elif isinstance(v, int):
        s = str(v) if abs(v) < 10**30 else f"{'-' if v < 0 else ''}<{len(str(abs(v)))}-digit integer>"
    else:
        try:
            s = repr(v)
        except Exception:  # pragma: no cover - exotic objects
            s = f"<{type(v).__name__}>"
    s = _clean(s)
    return s if len(s) <= limit else s[: limit - 3] + "..."


def _describe(v) -> str:
    """The kind of a value and the value itself, for type errors."""
    if v is None:
        return "null"
    if isinstance(v, bool):
        return f"a boolean ({_short(v)})"
    if isinstance(v, int):
        return f"an integer ({_short(v)})"
    if isinstance(v, float):
        return f"a float ({_short(v)})"
    if isinstance(v, str):
        return f"a string ({_short(v)})"
    if isinstance(v, dict):
        return f"a mapping ({_short(v)})"
    if isinstance(v, (list, tuple)):
        return f"a list ({_short(v)})"
    return f"a {type(v).__name__} ({_short(v)})"
