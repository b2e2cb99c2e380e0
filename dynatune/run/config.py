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
import hashlib
import importlib.util
import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from dynatune import secrets
from dynatune.errors import DynatuneError
from dynatune.model.extract import Lowering
from dynatune.model.layout import CONV_LAYOUTS
from dynatune.run.settings import (  # noqa: F401
    BAD,
    MAX_SEED,
    Checker,
    _clean,
    _describe,
    _join,
    _num,
    _short,
    field_checks,
    setting,
)
from dynatune.search.measure import MeasureConfig
from dynatune.search.session import SearchConfig

_HINT = "fix the listed keys; configs/quickstart.yaml shows every key with its default"


# -- the resolved config ----------------------------------------------------------------------------
def scheduler_names() -> tuple[str, ...]:
    from dynatune.schedulers import SCHEDULERS

    return tuple(SCHEDULERS)


def _section(cls):
    """A config section: a dataclass field whose value is the dataclass ``cls``."""
    return field(default_factory=cls, metadata={"section": True})


@dataclass
class ModelSection:
    path: str | None = None  # absolute after loading; the onnx package's light squeezenet when not given
    shapes: dict = setting(default_factory=dict, check="shapes")  # input name -> (dims)
    name: str | None = None  # the file stem when not given
    version: str | None = None


@dataclass
class SchedulerSection:
    name: str = setting("dynatune", choices=scheduler_names)
    params: dict = setting(default_factory=dict, check="plain_mapping")  # scheduler-specific, passed through
    seed: int = setting(0, ge=0, le=MAX_SEED)


@dataclass
class CompileSection:
    verify: bool = True  # compare the tuned model's outputs with ONNX Runtime's
    rel_tol: float = setting(1e-4, gt=0)
    measure_untuned: bool = True
    measure_onnxruntime: bool = True
    profile: bool = True  # per-kernel profile of the final model (report/profile.json, profile.md)
    prepack: bool = (
        Lowering.prepack
    )  # CPU targets: tuned conv/dense/matmul kernels choose their weight layout
    conv_layout: str = setting(
        Lowering.conv_layout, choices=CONV_LAYOUTS
    )  # auto: NHWC on CPU (dynatune.model.layout)

    def lowering(self) -> Lowering:
        """How the model is lowered to tasks (extraction and compile share it)."""
        return Lowering(prepack=self.prepack, conv_layout=self.conv_layout)


@dataclass
class TrackingSection:
    uri: str | None = None  # MLFLOW_TRACKING_URI, else sqlite:///<work_dir>/mlflow.db
    experiment: str | None = None  # dynatune/<model name>
    run_name: str | None = None
    tags: dict = setting(default_factory=dict, check="tags")


@dataclass
class LibrarySection:
    """The schedule library (:mod:`dynatune.library`): records shared by every run on a kind of machine."""

    enabled: bool = True  # seed matched tasks from it at the start, write every measured batch to it
    url: str | None = (
        None  # SQLAlchemy URL or env:NAME; else $DYNATUNE_LIBRARY_URL, else ~/.cache/dynatune/library.db
    )
    seed_records: int = setting(
        16, ge=1
    )  # a matched task starts from this many of the library's best schedules
    match_keys: bool = True  # a task whose key the library holds starts from its best schedules
    transfer: bool = (
        True  # a new task's first batch starts with the best schedules of similar tasks (other shapes)
    )
    fingerprint: str | None = None  # the kind of machine the records are for; this one's when not given


@dataclass
class Config:
    model: ModelSection = _section(ModelSection)
    target: str | dict = setting("llvm", check="target")
    budget_s: float = setting(600.0, gt=0)
    slot_s: float = setting(20.0, gt=0)
    warmup_share: float = setting(0.5, ge=0, le=1)  # coverage pass: at most this share of the budget ...
    warmup_trials: int = setting(8, ge=1)  # ... gives each task a first batch of this many candidates
    measure_every_s: float | None = setting(
        None, ge=0
    )  # whole-model measurement; None: 300 s if budget >= 600 s
    scheduler: SchedulerSection = _section(SchedulerSection)
    search: SearchConfig = _section(SearchConfig)
    measure: MeasureConfig = _section(MeasureConfig)
    compile: CompileSection = _section(CompileSection)
    work_dir: str | None = None  # absolute after loading; runs/<model name> when not given
    tracking: TrackingSection = _section(TrackingSection)
    prefect_api_url: str | None = None
    warm_start: list = setting(
        default_factory=list, check="paths"
    )  # earlier work dirs whose records seed this run
    library: LibrarySection = _section(LibrarySection)
    source: str = field(
        default="(defaults)", compare=False, repr=False, metadata={"section": True}
    )  # not a setting

    def to_dict(self) -> dict:
        """The fully resolved config as plain JSON-able data, safe to pass on as a parameter
        (``validate_dict`` accepts it back, in this process or its children): a URL with credentials is
        replaced by an ``env:NAME`` reference (see :mod:`dynatune.secrets`)."""
        d = self._plain()
        d["tracking"]["uri"] = secrets.reference(d["tracking"]["uri"], "DYNATUNE_TRACKING_URI")
        d["prefect_api_url"] = secrets.reference(d["prefect_api_url"], "DYNATUNE_PREFECT_API_URL")
        d["library"]["url"] = secrets.reference(d["library"]["url"], "DYNATUNE_LIBRARY_URL")
        return d

    def to_record(self) -> dict:
        """The config as recorded (work dir, MLflow, logs): every credential masked."""
        return secrets.mask_all(self._plain())

    def _plain(self) -> dict:
        d = dataclasses.asdict(self)
        d.pop("source", None)
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


def _read_yaml(path: str, source: str):
    if not os.path.exists(path):
        raise DynatuneError(
            f"config file {source} not found", "check the path, or start from configs/quickstart.yaml"
        )
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
def _custom_checks(c: Checker) -> dict:
    """The checks of the structured settings (``setting(..., check=NAME)``)."""

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
                c.fail(
                    _join(path, name),
                    "must be a list of positive integers or a string like '1x3x224x224', "
                    f"got {_describe(shape)}",
                )
                continue
            out[name] = dims
        return out

    def target(v, path):
        if isinstance(v, str):
            if not v.strip():
                return c.fail(path, "must not be empty")
            if " " in v.strip():
                return c.fail(
                    path,
                    f"{_short(v)} uses the CLI string form, which TVM 0.27 rejects; "
                    "give a kind name like 'llvm' or a mapping such as {kind: llvm, mcpu: ...}",
                )
            return v
        if isinstance(v, dict):
            kind = (
                c.string(v["kind"], _join(path, "kind"))
                if "kind" in v
                else c.fail(path, "a target mapping needs a 'kind' (e.g. llvm, cuda)")
            )
            d = c.plain({k: x for k, x in v.items() if k != "kind"}, path)
            return BAD if kind is BAD or d is BAD else {"kind": kind, **d}
        return c.fail(path, f"must be a kind name like 'llvm' or a mapping with a 'kind', got {_describe(v)}")

    def plain_mapping(v, path):
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
        return c.items(
            v,
            path,
            "tag names",
            lambda x, p: (
                x if isinstance(x, str) else c.fail(p, f"must be a string, got {_describe(x)} (quote it)")
            ),
        )

    def paths(v, path):
        if v is None:
            return []
        if not isinstance(v, list):
            return c.fail(path, f"must be a list of paths, got {_describe(v)}")
        out = [c.string(x, f"{path}[{i}]") for i, x in enumerate(v)]
        return BAD if any(x is BAD for x in out) else [os.path.abspath(x) for x in out]

    rpc_fields = {
        "tracker_host": lambda v, p: c.string(v, p),
        "tracker_port": lambda v, p: c.integer(v, p, 1, 65535),
        "tracker_key": lambda v, p: c.string(v, p),
        "session_timeout_s": lambda v, p: c.number(v, p, gt=0),
        "max_workers": lambda v, p: c.integer(v, p, 1),
    }

    def rpc(v, path):
        got = c.mapping(v, path, rpc_fields, nullable_section=False)
        if got is None:
            return BAD
        missing = [k for k in ("tracker_host", "tracker_port", "tracker_key") if k not in got]
        if missing:
            c.fail(path, f"missing {', '.join(missing)}")
        if missing or any(x is BAD for x in got.values()):
            return BAD
        return got

    return {
        "shapes": shapes,
        "target": target,
        "plain_mapping": plain_mapping,
        "tags": tags,
        "paths": paths,
        "rpc": rpc,
    }


def _validate(raw: dict, source: str, problems: list[str]) -> Config:
    c = Checker(problems)
    custom = _custom_checks(c)
    sections = {
        f.name: f.default_factory
        for f in dataclasses.fields(Config)
        if f.metadata.get("section") and f.name != "source"
    }
    schema: dict[str, Any] = {name: field_checks(cls, c, custom) for name, cls in sections.items()}
    schema.update(field_checks(Config, c, custom))

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
    lo = m.get("min_repeats", MeasureConfig.min_repeats)
    hi = m.get("max_repeats", MeasureConfig.max_repeats)
    if lo is not BAD and hi is not BAD and hi < lo:
        c.fail("measure.max_repeats", f"must be >= measure.min_repeats ({lo}), got {hi}")

    if problems:
        n = len(problems)
        raise DynatuneError(
            f"config {source} has {n} problem{'s' if n != 1 else ''}: " + "; ".join(problems), _HINT
        )

    cfg = Config(**{k: sections[k](**v) if k in sections else v for k, v in got.items()}, source=source)
    model = cfg.model
    model.path = os.path.abspath(model.path) if model.path else default_model_path()
    stem = Path(model.path).stem
    model.name = model.name or (stem if stem.strip() else "model")
    cfg.work_dir = os.path.abspath(cfg.work_dir or os.path.join("runs", model.name))
    tracking = cfg.tracking
    tracking.uri = (
        secrets.resolve(tracking.uri, "tracking.uri")
        or os.environ.get("MLFLOW_TRACKING_URI")
        or "sqlite:///" + os.path.join(cfg.work_dir, "mlflow.db")
    )
    tracking.experiment = tracking.experiment or f"dynatune/{model.name}"
    cfg.prefect_api_url = secrets.resolve(cfg.prefect_api_url, "prefect_api_url")
    if cfg.measure.rpc is not None:
        cfg.measure.rpc = dict(cfg.measure.rpc)
    return cfg


# -- helpers ----------------------------------------------------------------------------------------


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
