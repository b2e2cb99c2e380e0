"""The run config's schema: one pydantic model per section (:class:`Config` and its sections), with every
default and every check of a setting. Reading a YAML file into it, with ``--set`` and the flags, is
:mod:`dynatune.run.config`'s; ``dynatune config schema`` prints its JSON schema."""

from __future__ import annotations

import hashlib
import json
import math
import os
from dataclasses import fields
from typing import Any

from pydantic import BaseModel, Field, PrivateAttr, ValidationInfo, field_validator, model_validator

from dynatune import secrets
from dynatune.machine.load import QuietPolicy
from dynatune.model.extract import Lowering
from dynatune.model.layout import CONV_LAYOUTS
from dynatune.run.config_messages import describe, dotted, number, quote_hint, short
from dynatune.search.measure import MeasureConfig
from dynatune.search.section import MAX_SEED, OneOf, Section, Text, problem
from dynatune.search.session import SearchConfig


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
    # CPU: each task's kernel chosen among its best few by their times cold, as the model runs them
    # (compiler.cold_choice, report/cold_choice.json)
    cold_choice: bool = True
    prepack: bool = Lowering.prepack  # CPU targets: tuned conv/dense/matmul kernels pick their weight layout
    conv_layout: OneOf(lambda: CONV_LAYOUTS) = Lowering.conv_layout  # auto: NHWC on CPU (model.layout)
    fast_math: bool = Lowering.fast_math  # CPU: exp/erf/tanh/sigmoid/softmax/GELU as vectorizable polynomials
    # producers of a concatenation write into their slice of it: no copy kernel (model.placement)
    place_concat: bool = Lowering.place_concat
    # CPU, NHWC: 3x3 stride-1 convolutions as Winograd F(4x4, 3x3) (model.winograd), each kept in the compiled
    # model only where its tuned kernel beats the direct one (compiler.winograd_choice); changes their keys.
    # On by default: the only way past the FMA peak's bound on a model of 3x3 convolutions (SqueezeNet)
    winograd: bool = Lowering.winograd
    # CPU, NHWC: output channels padded to register blocks before a global pooling, or sliced back inside the
    # convolution's kernel (model.channel_padding)
    pad_channels: bool = Lowering.pad_channels
    # CPU, NHWC: a convolution of the model's NCHW input reads it as it lies: no transpose kernel before it
    read_input: bool = Lowering.read_input
    # CPU: a reduction over every axis but the innermost (a global pooling in NHWC) tuned as a vector loop
    # over that axis, by its own schedule rule (model.outer_reduction); changes its key
    outer_reduction: bool = Lowering.outer_reduction
    # CPU: the planned storages only kernels read are constants of the library, made once when it is loaded:
    # a run allocates only its outputs, and the library holds those storages' bytes (model.resident_storage;
    # the tasks do not change)
    resident_storage: bool = Lowering.resident_storage
    # a timing against ONNX Runtime on a busy machine is tried this many times, timing_wait_s apart, before
    # it is kept as taken under load (dynatune.machine.load)
    timing_attempts: int = Field(3, ge=1)
    timing_wait_s: float = Field(10.0, ge=0)
    # the final timing's ONNX Runtime over this many times ONNX Runtime alone before tuning (fastest blocks)
    # in every process: a slow spell of a shared machine, which the load probe does not see; another process
    # is timed (timing_attempts - 1 at most), then it is kept as taken in a slow spell (0: not checked)
    timing_slow_onnxruntime: float = Field(QuietPolicy.slow_onnxruntime, ge=0)
    # the profile's model over this many times the final timing's fastest block: a slow spell too; the
    # profile is taken again (timing_attempts in all at most, timing_wait_s apart), the fastest model's kept,
    # flagged when it stays slow (0: not checked)
    profile_slow: float = Field(QuietPolicy.slow_profile, ge=0)
    # the final timing against ONNX Runtime runs in this many fresh processes, one after another; the ratio
    # takes each side's fastest block among them all (one process's ratio moves by 10-20 % from one process
    # to the next here)
    timing_processes: int = Field(3, ge=1)

    def lowering(self) -> Lowering:
        """How the model is lowered to tasks (extraction and compile share it); the fields a run decides
        itself (``winograd_direct``) are left at their defaults."""
        return Lowering(**self.lowering_settings())

    def lowering_settings(self) -> dict:
        """The lowering's fields this section sets."""
        return {f.name: getattr(self, f.name) for f in fields(Lowering) if f.name in type(self).model_fields}

    def quiet(self):
        """When a timing against ONNX Runtime counts as quiet, and how often it is tried on a busy machine."""
        return QuietPolicy(
            wait_s=self.timing_wait_s,
            attempts=self.timing_attempts,
            slow_onnxruntime=self.timing_slow_onnxruntime,
            slow_profile=self.profile_slow,
        )


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
    # of the model's estimated latency: on the recorded traces, 2 % lost at most 1.3 % of the full budget's
    # model and saved a third of a budget twice their length (5 %: lost up to 5.7 %; BENCHMARKS.md)
    min_gain_share: float = Field(0.02, gt=0, lt=1)
    patience: int = Field(3, ge=1)  # ... at this many checks in a row (one after each round)
    confidence: float = Field(1.0, ge=0)  # the upper bound: mean + confidence x std of the beliefs' sum

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
            raise problem(f"must be <= budget_s ({number(budget)}), got {number(v)}")
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
        raise problem(f"must be a mapping of input name to shape, got {describe(v)}")
    out, bad = {}, []
    for name, shape in v.items():
        if not isinstance(name, str) or not name:
            bad.append(("", f"input names must be non-empty strings, got {describe(name)}"))
            continue
        dims = _parse_dims(shape)
        if dims is None:
            msg = "must be a list of positive integers or a string like '1x3x224x224'"
            bad.append((dotted(name), f"{msg}, got {describe(shape)}"))
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
                f"{short(v)} uses the CLI string form, which TVM 0.27 rejects; "
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
    raise problem(f"must be a kind name like 'llvm' or a mapping with a 'kind', got {describe(v)}")


def _check_plain_mapping(v) -> dict:
    if v is None:
        return {}
    if not isinstance(v, dict):
        raise problem(f"must be a mapping, got {describe(v)}")
    bad: list[tuple[str, str]] = []
    out = _plain(v, "", bad)
    _raise_any(bad)
    return out


def _check_tags(v) -> dict:
    if v is None:
        return {}
    if not isinstance(v, dict):
        raise problem(f"must be a mapping of string to string, got {describe(v)}")
    bad = [("", f"tag names must be strings, got {describe(k)}") for k in v if not isinstance(k, str)]
    bad += [
        (dotted(k), f"must be a string, got {describe(x)} (quote it)")
        for k, x in v.items()
        if isinstance(k, str) and not isinstance(x, str)
    ]
    _raise_any(bad)
    return dict(v)


def _check_paths(v) -> list:
    if v is None:
        return []
    if not isinstance(v, list):
        raise problem(f"must be a list of paths, got {describe(v)}")
    _raise_any([(f"[{i}]", msg) for i, x in enumerate(v) if (msg := _string_problem(x))])
    return [os.path.abspath(x) for x in v]


def _plain(v, at: str, bad: list, _stack=()):
    """Pass-through data: JSON-able (string keys, finite numbers), returned as a copy; problems go to ``bad``
    as ``(path under the setting, message)``."""
    if v is None or isinstance(v, (bool, str, int)):
        return v
    if isinstance(v, float):
        if not math.isfinite(v):
            bad.append((at, f"must be a finite number, got {short(v)}"))
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
                bad.append((at, f"keys must be strings, got {describe(k)}"))
                continue
            out[k] = _plain(x, at + dotted(k), bad, stack)
        return out
    bad.append((at, f"must be plain data (string, number, bool, null, list, mapping), got {describe(v)}"))
    return None


def _string_problem(v) -> str | None:
    if not isinstance(v, str):
        return f"must be a string, got {describe(v)}{quote_hint(v)}"
    return None if v.strip() else "must not be empty"


def _raise_any(bad: list[tuple[str, str]]) -> None:
    if bad:
        raise problem(bad[0][1], *bad)


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
