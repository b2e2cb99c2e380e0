"""Run configs: one YAML file per tuning run, validated up front.

Every key is optional (see ``configs/quickstart.yaml`` for a commented example). Before anything runs,
:func:`load_config` checks the whole file and reports every problem at once, each with its key path::

    config x.yaml has 2 problems: budget_s: must be > 0, got -5; slot: unknown key (did you mean 'slot_s'?)

as ONE :class:`~dynatune.errors.DynatuneError`. The result is a tree of pydantic models (:class:`Config`,
one per section) with every default filled in and every path resolved, so later stages never look at raw
YAML. ``dynatune config schema`` prints its JSON schema (for an editor completing configs/*.yaml).

Overrides, in order: the file, then ``--set key.path=value`` strings (the value is YAML, e.g.
``--set measure.adaptive=true``), then the CLI's own flags (``model``, ``shapes``, ``budget``,
``scheduler``, ``work_dir``); validation runs once, after all of them.

The model file is NOT opened here (the model importer checks it), so configs naming a model that is not on
this machine still load.
"""

from __future__ import annotations

import difflib
import hashlib
import json
import math
import os
import re
import types
import typing
from dataclasses import fields
from pathlib import Path
from typing import Any

import typing_extensions
import yaml
from pydantic import (
    BaseModel,
    Field,
    PrivateAttr,
    ValidationError,
    ValidationInfo,
    field_validator,
    model_validator,
)

from dynatune import secrets
from dynatune.errors import DynatuneError
from dynatune.files import WorkDir
from dynatune.model.extract import Lowering
from dynatune.model.layout import CONV_LAYOUTS
from dynatune.search.measure import MeasureConfig
from dynatune.search.section import CONFIG_ERROR, MAX_SEED, OneOf, Section, Text, problem
from dynatune.search.session import SearchConfig

_HINT = "fix the listed keys; configs/quickstart.yaml shows every key with its default"


# -- the resolved config ----------------------------------------------------------------------------
def scheduler_names() -> tuple[str, ...]:
    from dynatune.schedulers import SCHEDULERS

    return tuple(SCHEDULERS)


class ModelSection(Section):
    path: Text | None = None  # absolute after loading; the built-in default model when not given
    shapes: dict = Field(default_factory=dict)  # input name -> (dims)
    name: Text | None = None  # the file stem when not given
    version: Text | None = None

    @field_validator("shapes", mode="plain", json_schema_input_type=dict[str, list[int] | str] | None)
    @classmethod
    def _shapes(cls, v) -> dict:
        return _check_shapes(v)


class SchedulerSection(Section):
    name: OneOf(scheduler_names) = "dynatune"
    params: dict = Field(default_factory=dict)  # scheduler-specific, passed through
    seed: int = Field(0, ge=0, le=MAX_SEED)

    @field_validator("params", mode="plain", json_schema_input_type=dict[str, Any] | None)
    @classmethod
    def _params(cls, v) -> dict:
        return _check_plain_mapping(v)


class CompileSection(Section):
    verify: bool = True  # compare the tuned model's outputs with ONNX Runtime's
    rel_tol: float = Field(1e-4, gt=0)
    measure_untuned: bool = True
    measure_onnxruntime: bool = True
    profile: bool = True  # per-kernel profile of the final model (report/profile.json, profile.md)
    prepack: bool = Lowering.prepack  # CPU targets: tuned conv/dense/matmul kernels pick their weight layout
    conv_layout: OneOf(lambda: CONV_LAYOUTS) = Lowering.conv_layout  # auto: NHWC on CPU (model.layout)
    fast_math: bool = Lowering.fast_math  # CPU: exp/erf/tanh/sigmoid/softmax/GELU as vectorizable polynomials
    # producers of a concatenation write into their slice of it: no copy kernel (model.placement)
    place_concat: bool = Lowering.place_concat
    # CPU, NHWC: 3x3 stride-1 convolutions as Winograd F(4x4, 3x3) (model.winograd), each kept in the compiled
    # model only where its tuned kernel beats the direct one (compiler.winograd_choice); changes their keys
    winograd: bool = Lowering.winograd
    # CPU, NHWC: output channels padded to register blocks before a global pooling, or sliced back inside the
    # convolution's kernel (model.channel_padding)
    pad_channels: bool = Lowering.pad_channels
    # CPU, NHWC: a convolution of the model's NCHW input reads it as it lies: no transpose kernel before it
    read_input: bool = Lowering.read_input
    # a timing against ONNX Runtime on a busy machine is tried this many times, timing_wait_s apart, before
    # it is kept as taken under load (dynatune.machine.load)
    timing_attempts: int = Field(3, ge=1)
    timing_wait_s: float = Field(10.0, ge=0)

    def lowering(self) -> Lowering:
        """How the model is lowered to tasks (extraction and compile share it); the fields a run decides
        itself (``winograd_direct``) are left at their defaults."""
        return Lowering(**self.lowering_settings())

    def lowering_settings(self) -> dict:
        """The lowering's fields this section sets."""
        return {f.name: getattr(self, f.name) for f in fields(Lowering) if f.name in type(self).model_fields}

    def quiet(self):
        """When a timing against ONNX Runtime counts as quiet, and how often it is tried on a busy machine."""
        from dynatune.machine.load import QuietPolicy

        return QuietPolicy(wait_s=self.timing_wait_s, attempts=self.timing_attempts)


class TrackingSection(Section):
    uri: Text | None = None  # MLFLOW_TRACKING_URI, else sqlite:///<work_dir>/mlflow.db
    experiment: Text | None = None  # dynatune/<model name>
    run_name: Text | None = None
    tags: dict = Field(default_factory=dict)

    @field_validator("tags", mode="plain", json_schema_input_type=dict[str, str] | None)
    @classmethod
    def _tags(cls, v) -> dict:
        return _check_tags(v)


class LibrarySection(Section):
    """The schedule library (:mod:`dynatune.library`): records shared by every run on a kind of machine."""

    enabled: bool = True  # seed matched tasks from it at the start, write every measured batch to it
    # SQLAlchemy URL or env:NAME; else $DYNATUNE_LIBRARY_URL, else ~/.cache/dynatune/library.db
    url: Text | None = None
    seed_records: int = Field(16, ge=1)  # a matched task starts from this many of the library's best ones
    match_keys: bool = True  # a task whose key the library holds starts from its best schedules
    # a new task's first batch starts with the best schedules of similar tasks (other shapes)
    transfer: bool = True
    fingerprint: Text | None = None  # the kind of machine the records are for; this one's when not given


class StoppingSection(Section):
    """When a run ends before its budget (:mod:`dynatune.run.stopping`): the budget is a cap."""

    enabled: bool = True  # stop when the beliefs say the model cannot get meaningfully faster
    # ... when the most the rest of the budget could still buy (the beliefs' upper bound) is below this share
    # of the model's estimated latency: on the recorded traces, 2 % lost at most 1.2 % of the full budget's
    # model and saved a fifth of a budget twice their length (5 %: lost up to 2.9 %; BENCHMARKS.md, s. 36)
    min_gain_share: float = Field(0.02, gt=0, lt=1)
    patience: int = Field(3, ge=1)  # ... at this many checks in a row (one after each round)
    confidence: float = Field(1.0, ge=0)  # the upper bound: mean + confidence x std of the beliefs

    def rule(self):
        """The rule these settings ask for (None when stopping is off)."""
        from dynatune.run.stopping import BeliefStopping

        if not self.enabled:
            return None
        return BeliefStopping(self.min_gain_share, self.patience, self.confidence)


class Config(Section):
    """A tuning run's config (one YAML file): every key optional, see configs/quickstart.yaml."""

    model: ModelSection = Field(default_factory=ModelSection)
    target: str | dict = "llvm"  # a kind name, or a mapping with a kind
    budget_s: float = Field(600.0, gt=0)
    slot_s: float = Field(20.0, gt=0, validate_default=True)  # <= budget_s
    warmup_share: float = Field(0.5, ge=0, le=1)  # coverage pass: at most this share of the budget ...
    warmup_trials: int = Field(8, ge=1)  # ... gives each task a first batch of this many candidates
    # whole-model measurement every this many tuning seconds; None: 300 s if budget >= 600 s
    measure_every_s: float | None = Field(None, ge=0)
    scheduler: SchedulerSection = Field(default_factory=SchedulerSection)
    search: SearchConfig = Field(default_factory=SearchConfig)
    measure: MeasureConfig = Field(default_factory=MeasureConfig)
    compile: CompileSection = Field(default_factory=CompileSection)
    work_dir: Text | None = None  # absolute after loading; runs/<model name> when not given
    tracking: TrackingSection = Field(default_factory=TrackingSection)
    prefect_api_url: Text | None = None
    warm_start: list = Field(default_factory=list)  # earlier work dirs whose records seed this run
    library: LibrarySection = Field(default_factory=LibrarySection)
    stopping: StoppingSection = Field(default_factory=StoppingSection)
    # ONNX Runtime's time per task's operator, measured at the start: the beliefs' reachable floors
    anchors: bool = True
    _source: str = PrivateAttr("(defaults)")  # where it was read from: not a setting

    @property
    def source(self) -> str:
        return self._source

    def __eq__(self, other) -> bool:  # the settings, not where they were read from
        return type(other) is type(self) and self.__dict__ == other.__dict__

    @model_validator(mode="before")
    @classmethod
    def _null_sections_are_defaults(cls, data):
        """``search:`` with nothing under it (YAML null) is the section with every default."""
        if isinstance(data, dict):
            sections = _sections()
            data = {k: {} if v is None and k in sections else v for k, v in data.items()}
        return data

    @field_validator("target", mode="plain", json_schema_input_type=str | dict[str, Any])
    @classmethod
    def _target(cls, v):
        return _check_target(v)

    @field_validator("slot_s")
    @classmethod
    def _slot_within_budget(cls, v: float, info: ValidationInfo) -> float:
        budget = info.data.get("budget_s")  # absent when it failed its own checks
        if budget is not None and v > budget:
            raise problem(f"must be <= budget_s ({_num(budget)}), got {_num(v)}")
        return v

    @field_validator("warm_start", mode="plain", json_schema_input_type=list[str] | None)
    @classmethod
    def _warm_start(cls, v) -> list:
        return _check_paths(v)

    def to_dict(self) -> dict:
        """The fully resolved config as plain JSON-able data, safe to pass on as a parameter
        (``validate_dict`` accepts it back, in this process or its children): a URL with credentials is
        replaced by an ``env:NAME`` reference (see :mod:`dynatune.secrets`)."""
        return secrets.reference_all(self._plain(), "DYNATUNE")  # tracking.uri -> env:DYNATUNE_TRACKING_URI

    def to_record(self) -> dict:
        """The config as recorded (work dir, MLflow, logs): every credential masked."""
        return secrets.mask_all(self._plain())

    def _plain(self) -> dict:
        d = self.model_dump()
        d["model"]["shapes"] = {k: list(v) for k, v in self.model.shapes.items()}
        return json.loads(json.dumps(d))  # plain lists/dicts all the way down

    def config_hash(self) -> str:
        """sha256 of what defines a tuning run: model path and shapes, target, scheduler, search, measure.

        Not the budget, the work dir or the tracking settings: re-running with a larger budget is the same
        run, resumed.
        """
        d = self._plain()
        identity = {
            "model": {"path": d["model"]["path"], "shapes": d["model"]["shapes"]},
            "target": d["target"],
            "scheduler": d["scheduler"],
            "search": d["search"],
            "measure": d["measure"],
        }
        blob = json.dumps(identity, sort_keys=True, separators=(",", ":"))
        return hashlib.sha256(blob.encode()).hexdigest()


# -- loading ----------------------------------------------------------------------------------------
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
                            None, None, f"duplicate key {_short(key)}", key_node.start_mark
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
        source = _clean(str(path))
        raw = _read_yaml(str(path), source)
        if raw is None:  # an empty file: all defaults
            raw = {}
        if not isinstance(raw, dict):
            raise DynatuneError(
                f"config {source}: the top level must be a mapping of keys, got {_describe(raw)}", _HINT
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


def validate_dict(raw, source: str = "(dict)") -> Config:
    """Validate a raw config mapping (e.g. parsed YAML, or ``Config.to_dict()``) into a :class:`Config`."""
    source = _clean(str(source))
    if not isinstance(raw, dict):
        raise DynatuneError(
            f"config {source}: the top level must be a mapping of keys, got {_describe(raw)}", _HINT
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
        raise DynatuneError(f"cannot read config {source}: {_clean(exc.strerror or str(exc))}") from None
    try:
        return yaml.load(text, Loader=_Loader)  # noqa: S506 - a SafeLoader subclass
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        what = _clean(exc.problem or exc.context or "invalid YAML")
        raise DynatuneError(
            f"config {source}: YAML syntax error{where}: {what}",
            "check the indentation and quoting around that line",
        ) from None
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
            problems.append(f"{origin}: {'.'.join(parts[: i + 1])} is {_describe(nxt)}, not a mapping")
            return
        node = nxt
    node[parts[-1]] = value


# -- validation -------------------------------------------------------------------------------------
def _validate(raw: dict, source: str, problems: list[str]) -> Config:
    raw = secrets.resolve_all(raw)  # any setting may be given as env:NAME (what to_dict passes on)
    try:
        cfg = Config.model_validate(raw)
    except ValidationError as exc:
        problems = [*problems, *_problem_lines(exc)]
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


# pydantic's errors -> ``key.path: message`` lines (the messages every config problem has always had)
def _problem_lines(exc: ValidationError) -> list[str]:
    out: list = []
    missing: dict[tuple, list[str]] = {}  # parent's loc -> missing keys, one line per parent
    for e in exc.errors(include_url=False):
        loc, kind, value, ctx = tuple(e["loc"]), e["type"], e.get("input"), e.get("ctx") or {}
        path = _path(loc)
        if kind == CONFIG_ERROR:  # a validator's own check: one problem or several, under this path
            out += [f"{path}{at}: {msg}" for at, msg in ctx["at"]]
        elif kind in ("extra_forbidden", "invalid_key"):  # invalid_key: not a string (its input is the key)
            key = value if kind == "invalid_key" else loc[-1]
            out.append(f"{_join(_path(loc[:-1]), key)}: unknown key ({_suggest((*loc[:-1], key))})")
        elif kind == "missing":
            if loc[:-1] not in missing:
                missing[loc[:-1]] = []
                out.append(loc[:-1])  # the line goes here, written below
            missing[loc[:-1]].append(str(loc[-1]))
        else:
            out.append(f"{path}: {_message(loc, kind, value, e['msg'])}")
    return [
        f"{_path(x) or 'config'}: missing {', '.join(missing[x])}" if isinstance(x, tuple) else x for x in out
    ]


def _message(loc: tuple, kind: str, v, fallback: str) -> str:
    if kind in ("model_type", "model_attributes_type", "dict_type"):
        return f"must be a mapping, got {_describe(v)}"
    if kind in ("int_type", "int_parsing", "int_from_float"):
        return f"must be an integer, got {_describe(v)}"
    if kind in ("float_type", "float_parsing", "finite_number"):
        if kind == "finite_number" or (isinstance(v, int) and not isinstance(v, bool)):  # 10**400
            return f"must be a finite number, got {_short(v)}"
        return f"must be a number, got {_describe(v)}"
    if kind in ("bool_type", "bool_parsing"):
        return f"must be true or false, got {_describe(v)}"
    if kind == "string_type":
        node = _node(loc)
        what = "a string or null" if node is not None and node[2] else "a string"
        return f"must be {what}, got {_describe(v)}{_quote_hint(v)}"
    if kind in ("greater_than", "greater_than_equal", "less_than", "less_than_equal"):
        return _bounds_message(loc, v)
    return _clean(fallback)


def _bounds_message(loc: tuple, v) -> str:
    """A bound's problem, with the setting's whole range (``must be in (0, 1)``), not just the bound."""
    tp, meta, _ = _node(loc) or (float, [], False)
    b = {k: getattr(m, k) for m in meta for k in ("gt", "ge", "lt", "le") if getattr(m, k, None) is not None}
    gt, ge, lt, le = b.get("gt"), b.get("ge"), b.get("lt"), b.get("le")
    got = _short(v)
    if tp is int:
        lo = ge if ge is not None else (gt + 1 if gt is not None else None)
        hi = le if le is not None else (lt - 1 if lt is not None else None)
        if lo is not None and hi is not None:
            return f"must be in [{lo}, {hi}], got {got}"
        return f"must be >= {lo}, got {got}" if lo is not None else f"must be <= {hi}, got {got}"
    lo, hi = (gt if gt is not None else ge), (lt if lt is not None else le)
    if lo is not None and hi is not None:
        left, right = ("(" if gt is not None else "["), (")" if lt is not None else "]")
        return f"must be in {left}{_num(lo)}, {_num(hi)}{right}, got {got}"
    if lo is not None:
        return f"must be {'>' if gt is not None else '>='} {_num(lo)}, got {got}"
    return f"must be {'<' if lt is not None else '<='} {_num(hi)}, got {got}"


def _suggest(loc: tuple) -> str:
    key, known = loc[-1], list(_fields_of((_node(loc[:-1]) or (None,))[0]) or {})
    close = difflib.get_close_matches(key, known, n=1) if isinstance(key, str) else []
    return f"did you mean '{close[0]}'?" if close else f"expected one of: {', '.join(known)}"


def _node(loc: tuple):
    """``(type, constraints, nullable)`` of the setting at ``loc`` (the config itself at ``()``); None
    where ``loc`` leads out of the config's models."""
    node = (Config, [], False)
    for key in loc:
        fields = _fields_of(node[0])
        if not fields or key not in fields:
            return None
        node = _unwrap(*fields[key])
    return node


def _fields_of(tp) -> dict[str, tuple[Any, list]] | None:
    """A section's settings, ``{name: (annotation, constraints)}``; None for a plain value."""
    if isinstance(tp, type) and issubclass(tp, BaseModel):
        return {name: (f.annotation, list(f.metadata)) for name, f in tp.model_fields.items()}
    if typing_extensions.is_typeddict(tp):
        return {
            name: (hint, [])
            for name, hint in typing_extensions.get_type_hints(tp, include_extras=True).items()
        }
    return None


def _unwrap(annotation, meta: list):
    nullable = False
    while True:
        origin, args = typing_extensions.get_origin(annotation), typing_extensions.get_args(annotation)
        if origin is typing_extensions.Annotated:
            annotation = args[0]
            meta = [*meta, *(m for a in args[1:] for m in getattr(a, "metadata", [a]))]
        elif origin in (typing_extensions.Required, typing_extensions.NotRequired):
            annotation = args[0]
        elif origin in (typing.Union, types.UnionType) and type(None) in args:
            nullable = True
            rest = [a for a in args if a is not type(None)]
            if len(rest) != 1:
                break
            annotation = rest[0]
        else:
            break
    return annotation, meta, nullable


def _sections() -> set[str]:
    return {
        name
        for name, f in Config.model_fields.items()
        if isinstance(f.annotation, type) and issubclass(f.annotation, BaseModel)
    }


# the structured settings' checks (field validators): each reports every problem it finds at once
def _check_shapes(v) -> dict:
    if v is None:
        return {}
    if not isinstance(v, dict):
        raise problem(f"must be a mapping of input name to shape, got {_describe(v)}")
    out, bad = {}, []
    for name, shape in v.items():
        if not isinstance(name, str) or not name:
            bad.append(("", f"input names must be non-empty strings, got {_describe(name)}"))
            continue
        dims = _parse_dims(shape)
        if dims is None:
            msg = "must be a list of positive integers or a string like '1x3x224x224'"
            bad.append((_dot(name), f"{msg}, got {_describe(shape)}"))
            continue
        out[name] = dims
    _raise_any(bad)
    return out


def _check_target(v):
    if isinstance(v, str):
        if not v.strip():
            raise problem("must not be empty")
        if " " in v.strip():
            raise problem(
                f"{_short(v)} uses the CLI string form, which TVM 0.27 rejects; "
                "give a kind name like 'llvm' or a mapping such as {kind: llvm, mcpu: ...}"
            )
        return v
    if isinstance(v, dict):
        bad: list[tuple[str, str]] = []
        if "kind" not in v:
            bad.append(("", "a target mapping needs a 'kind' (e.g. llvm, cuda)"))
        elif msg := _string_problem(v["kind"]):
            bad.append((".kind", msg))
        rest = _plain({k: x for k, x in v.items() if k != "kind"}, "", bad)
        _raise_any(bad)
        return {"kind": v["kind"], **rest}
    raise problem(f"must be a kind name like 'llvm' or a mapping with a 'kind', got {_describe(v)}")


def _check_plain_mapping(v) -> dict:
    if v is None:
        return {}
    if not isinstance(v, dict):
        raise problem(f"must be a mapping, got {_describe(v)}")
    bad: list[tuple[str, str]] = []
    out = _plain(v, "", bad)
    _raise_any(bad)
    return out


def _check_tags(v) -> dict:
    if v is None:
        return {}
    if not isinstance(v, dict):
        raise problem(f"must be a mapping of string to string, got {_describe(v)}")
    bad = [("", f"tag names must be strings, got {_describe(k)}") for k in v if not isinstance(k, str)]
    bad += [
        (_dot(k), f"must be a string, got {_describe(x)} (quote it)")
        for k, x in v.items()
        if isinstance(k, str) and not isinstance(x, str)
    ]
    _raise_any(bad)
    return dict(v)


def _check_paths(v) -> list:
    if v is None:
        return []
    if not isinstance(v, list):
        raise problem(f"must be a list of paths, got {_describe(v)}")
    _raise_any([(f"[{i}]", msg) for i, x in enumerate(v) if (msg := _string_problem(x))])
    return [os.path.abspath(x) for x in v]


def _plain(v, at: str, bad: list, _stack=()):
    """Pass-through data: JSON-able (string keys, finite numbers), returned as a copy; problems go to ``bad``
    as ``(path under the setting, message)``."""
    if v is None or isinstance(v, (bool, str, int)):
        return v
    if isinstance(v, float):
        if not math.isfinite(v):
            bad.append((at, f"must be a finite number, got {_short(v)}"))
        return v
    if isinstance(v, (list, dict)):
        if id(v) in _stack:
            bad.append((at, "is a recursive structure"))
            return None
        stack = (*_stack, id(v))
        if isinstance(v, list):
            return [_plain(x, f"{at}[{i}]", bad, stack) for i, x in enumerate(v)]
        out = {}
        for k, x in v.items():
            if not isinstance(k, str):
                bad.append((at, f"keys must be strings, got {_describe(k)}"))
                continue
            out[k] = _plain(x, at + _dot(k), bad, stack)
        return out
    bad.append((at, f"must be plain data (string, number, bool, null, list, mapping), got {_describe(v)}"))
    return None


def _string_problem(v) -> str | None:
    if not isinstance(v, str):
        return f"must be a string, got {_describe(v)}{_quote_hint(v)}"
    return None if v.strip() else "must not be empty"


def _raise_any(bad: list[tuple[str, str]]) -> None:
    if bad:
        raise problem(bad[0][1], *bad)


# -- helpers ----------------------------------------------------------------------------------------
_PLAIN_KEY = re.compile(r"[A-Za-z_][A-Za-z0-9_\-]*")


def _join(path: str, key) -> str:
    k = key if isinstance(key, str) and _PLAIN_KEY.fullmatch(key) and len(key) <= 60 else _short(key)
    return f"{path}.{k}" if path else k


def _dot(key) -> str:
    """A key's part of a path under a setting: ``.name``."""
    return "." + _join("", key)


def _path(loc: tuple) -> str:
    """pydantic's ``loc`` as a key path: ``measure.rel_tol``."""
    path = ""
    for key in loc:
        path = _join(path, key)
    return path


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


def _quote_hint(v) -> str:
    """For a number or a date where a string was expected: YAML read it as one."""
    return " (quote it)" if isinstance(v, (int, float)) or type(v).__module__ == "datetime" else ""


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
