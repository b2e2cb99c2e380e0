"""Run configs: defaults, every kind of error (all reported at once, with key paths), overrides,
round-trips, the config hash, the shipped configs, and property-based checks."""

from __future__ import annotations

import json
import math
import os
import tempfile
from pathlib import Path

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from dynatune.errors import DynatuneError
from dynatune.run.config import default_model_path, load_config, validate_dict
from dynatune.schedulers import SCHEDULERS as _SCHEDULER_REGISTRY
from dynatune.search.costmodel import COST_MODELS
from dynatune.secrets import ENV_PREFIX

SCHEDULERS = list(_SCHEDULER_REGISTRY)

REPO = Path(__file__).resolve().parents[2]
CONFIGS = sorted((REPO / "configs").glob("*.yaml"))


@pytest.fixture(autouse=True)
def _isolated(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)


def write(tmp_path, text: str, name: str = "c.yaml") -> str:
    p = tmp_path / name
    p.write_text(text)
    return str(p)


def error_of(fn, *args, **kw) -> str:
    with pytest.raises(DynatuneError) as info:
        fn(*args, **kw)
    msg = str(info.value)
    assert "\n" not in msg
    return msg


# -- defaults ---------------------------------------------------------------------------------------
def test_defaults(tmp_path):
    c = load_config(None)
    assert c.model.path == default_model_path()
    assert c.model.path.endswith(os.sep + "squeezenet1.1-random-weights.onnx")
    assert os.path.exists(c.model.path)  # made from the onnx package's light squeezenet, cached
    assert c.model.name == "squeezenet1.1-random-weights" and c.model.shapes == {} and c.model.version is None
    assert c.target == "llvm" and c.budget_s == 600 and c.slot_s == 20
    assert (c.scheduler.name, c.scheduler.params, c.scheduler.seed) == ("dynatune", {}, 0)
    s = c.search
    assert (
        s.trials_per_iter,
        s.population_size,
        s.genetic_num_iters,
        s.eps_greedy,
        s.cost_model,
        s.contextual_exploration,
        s.max_trials_per_task,
        s.seed,
        s.build_timeout_s,
    ) == (16, 64, 1, 0.05, "xgb", False, 10000, 0, 15)
    m = c.measure
    assert (
        m.adaptive,
        m.repeat,
        m.min_repeat_ms,
        m.number,
        m.min_repeats,
        m.max_repeats,
        m.batch,
        m.rel_tol,
        m.race_factor,
        m.timeout_s,
        m.cpu_cache_flush,
        m.rpc,
    ) == (True, 5, 10, 1, 3, 10, 2, 0.02, 1.5, 30, False, None)
    assert (
        c.compile.verify,
        c.compile.rel_tol,
        c.compile.measure_untuned,
        c.compile.measure_onnxruntime,
        c.compile.prepack,
        c.compile.conv_layout,
    ) == (True, 1e-4, True, True, True, "auto")
    assert c.work_dir == str(tmp_path / "runs" / "squeezenet1.1-random-weights")
    assert c.tracking.uri == f"sqlite:///{tmp_path}/runs/squeezenet1.1-random-weights/mlflow.db"
    assert c.tracking.experiment == "dynatune/squeezenet1.1-random-weights"
    assert c.tracking.run_name is None and c.tracking.tags == {}
    assert c.prefect_api_url is None and c.warm_start == []
    assert load_config(None) == validate_dict({})


def test_empty_file_and_null_sections_are_defaults(tmp_path):
    assert load_config(write(tmp_path, "")) == load_config(None)
    assert load_config(write(tmp_path, "model:\nsearch:\n")) == load_config(None)


def test_env_tracking_uri(monkeypatch):
    monkeypatch.setenv("MLFLOW_TRACKING_URI", "http://mlflow:5000")
    assert load_config(None).tracking.uri == "http://mlflow:5000"
    assert load_config(None, ["tracking.uri=file:///x"]).tracking.uri == "file:///x"


def test_resolution(tmp_path):
    (tmp_path / "cfg").mkdir()
    (tmp_path / "cfg" / "m.onnx").write_bytes(b"")
    p = write(
        tmp_path / "cfg",
        "model: {path: m.onnx, shapes: {input: 1x3x8x8, b: [2, 4]}}\n"
        "work_dir: out\nwarm_start: [old]\ntarget: {kind: llvm, mcpu: znver3}\n",
    )
    c = load_config(p)
    assert c.model.path == str(tmp_path / "cfg" / "m.onnx")  # found beside the config
    assert c.model.shapes == {"input": (1, 3, 8, 8), "b": (2, 4)}
    assert c.model.name == "m"
    assert c.work_dir == str(tmp_path / "out")  # relative to the current directory
    assert c.warm_start == [str(tmp_path / "old")]
    assert c.target == {"kind": "llvm", "mcpu": "znver3"}
    # not beside the config: relative to the current directory, and need not exist
    c = load_config(write(tmp_path / "cfg", "model: {path: nowhere/x.onnx}\n"))
    assert c.model.path == str(tmp_path / "nowhere" / "x.onnx")


# -- errors -----------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "raw, expected",
    [
        ({"budget": 10}, "budget: unknown key (did you mean 'budget_s'?)"),
        ({"measure": {"reltol": 0.1}}, "measure.reltol: unknown key (did you mean 'rel_tol'?)"),
        (
            {"measure": {"rpc": {"tracker_host": "h", "tracker_port": 9190, "tracker_key": "k", "zzz": 1}}},
            "measure.rpc.zzz: unknown key",
        ),
        (
            {"search": {"trials_per_iter": "8"}},
            "search.trials_per_iter: must be an integer, got a string ('8')",
        ),
        (
            {"search": {"trials_per_iter": 8.0}},
            "search.trials_per_iter: must be an integer, got a float (8.0)",
        ),
        ({"search": {"seed": True}}, "search.seed: must be an integer, got a boolean (true)"),
        ({"measure": {"adaptive": "true"}}, "measure.adaptive: must be true or false, got a string ('true')"),
        ({"measure": {"adaptive": 1}}, "measure.adaptive: must be true or false"),
        ({"budget_s": "600"}, "budget_s: must be a number, got a string"),
        ({"budget_s": True}, "budget_s: must be a number, got a boolean"),
        ({"measure": "fast"}, "measure: must be a mapping, got a string ('fast')"),
        ({"model": {"shapes": [1, 3]}}, "model.shapes: must be a mapping"),
        (
            {"model": {"shapes": {"input": [1, 0, 3]}}},
            "model.shapes.input: must be a list of positive integers",
        ),
        (
            {"model": {"shapes": {"input": "1xAx3"}}},
            "model.shapes.input: must be a list of positive integers",
        ),
        (
            {"model": {"version": 1.0}},
            "model.version: must be a string or null, got a float (1.0) (quote it)",
        ),
        ({"model": {"path": ""}}, "model.path: must not be empty"),
        ({"measure": {"rel_tol": 1.5}}, "measure.rel_tol: must be in (0, 1), got 1.5"),
        ({"measure": {"rel_tol": 0}}, "measure.rel_tol: must be in (0, 1), got 0"),
        ({"measure": {"race_factor": 1}}, "measure.race_factor: must be > 1, got 1"),
        ({"measure": {"min_repeats": 1}}, "measure.min_repeats: must be >= 2, got 1"),
        (
            {"measure": {"min_repeats": 5, "max_repeats": 4}},
            "measure.max_repeats: must be >= measure.min_repeats (5), got 4",
        ),
        (
            {"measure": {"rpc": {"tracker_host": "h", "tracker_port": 0, "tracker_key": "k"}}},
            "measure.rpc.tracker_port: must be in [1, 65535], got 0",
        ),
        ({"measure": {"rpc": {"tracker_host": "h"}}}, "measure.rpc: missing tracker_port, tracker_key"),
        ({"search": {"eps_greedy": -0.1}}, "search.eps_greedy: must be in [0, 1], got -0.1"),
        ({"search": {"population_size": 4}}, "search.population_size: must be >= 8, got 4"),
        (
            {"search": {"cost_model": "gbm"}},
            "search.cost_model: must be one of xgb, ensemble, random, got 'gbm'",
        ),
        ({"scheduler": {"name": "fifo"}}, "scheduler.name: must be one of dynatune, round_robin"),
        ({"budget_s": 0}, "budget_s: must be > 0, got 0"),
        ({"budget_s": float("inf")}, "budget_s: must be a finite number, got inf"),
        ({"budget_s": 10**400}, "budget_s: must be a finite number"),
        ({"slot_s": 30, "budget_s": 20}, "slot_s: must be <= budget_s (20), got 30"),
        ({"slot_s": 700}, "slot_s: must be <= budget_s (600), got 700"),
        ({"target": "llvm -num-cores 2"}, "target: 'llvm -num-cores 2' uses the CLI string form"),
        ({"target": {"mcpu": "x"}}, "target: a target mapping needs a 'kind'"),
        ({"target": 3}, "target: must be a kind name like 'llvm' or a mapping"),
        ({"tracking": {"tags": {"a": 1}}}, "tracking.tags.a: must be a string, got an integer (1)"),
        ({"warm_start": "runs/a"}, "warm_start: must be a list of paths"),
        ({"warm_start": ["a", 3]}, "warm_start[1]: must be a string"),
        ({"scheduler": {"params": {"c": float("nan")}}}, "scheduler.params.c: must be a finite number"),
        ({"scheduler": {"params": [1]}}, "scheduler.params: must be a mapping"),
        ({1: 2}, "1: unknown key"),
    ],
)
def test_each_error_names_its_key_path(raw, expected):
    msg = error_of(validate_dict, raw, "x.yaml")
    assert msg.startswith("config x.yaml has 1 problem: "), msg
    assert expected in msg


def test_all_problems_at_once(tmp_path):
    p = write(
        tmp_path,
        """
model: {shapes: {input: [1, -3]}}
budgt_s: 10
slot_s: 900
search: {trials_per_iter: 0, cost_model: svm, nope: 1}
measure: {rel_tol: 1.5, adaptive: maybe}
""",
    )
    msg = error_of(load_config, p)
    assert msg.startswith(f"config {p} has 8 problems: ")
    for part in [
        "model.shapes.input:",
        "budgt_s: unknown key",
        "slot_s: must be <= budget_s (600), got 900",
        "search.trials_per_iter: must be >= 1, got 0",
        "search.cost_model: must be one of",
        "search.nope: unknown key",
        "measure.rel_tol: must be in (0, 1), got 1.5",
        "measure.adaptive: must be true or false, got a string ('maybe')",
    ]:
        assert part in msg
    assert msg.count("; ") >= 7


def test_yaml_syntax_error_names_file_line_column(tmp_path):
    p = write(tmp_path, "model:\n  path: a.onnx\nsearch: {trials_per_iter: 8\nbudget_s: 1\n")
    msg = error_of(load_config, p)
    assert p in msg and "YAML syntax error at line 4, column" in msg
    p = write(tmp_path, "budget_s: 1\n  slot_s: 2\n", "indent.yaml")
    assert "line 2, column" in error_of(load_config, p)


def test_duplicate_key_is_an_error(tmp_path):
    msg = error_of(load_config, write(tmp_path, "budget_s: 1\nslot_s: 1\nbudget_s: 2\n"))
    assert "duplicate key 'budget_s'" in msg and "line 3" in msg


def test_missing_file_directory_and_non_mapping(tmp_path):
    assert "not found" in error_of(load_config, str(tmp_path / "nope.yaml"))
    assert "directory" in error_of(load_config, str(tmp_path))
    msg = error_of(load_config, write(tmp_path, "- a\n- b\n"))
    assert "top level must be a mapping" in msg and "a list" in msg
    assert "top level must be a mapping" in error_of(load_config, write(tmp_path, "just text\n"))
    assert "top level must be a mapping" in error_of(validate_dict, [1, 2])


def test_bad_yaml_value(tmp_path):
    assert "invalid YAML" in error_of(load_config, write(tmp_path, "model: {version: 2024-13-45}\n"))
    msg = error_of(load_config, write(tmp_path, "model: {version: 2024-01-31}\n"))
    assert "model.version: must be a string or null" in msg and "(quote it)" in msg


# -- overrides --------------------------------------------------------------------------------------
def test_set_overrides(tmp_path):
    p = write(tmp_path, "measure: {adaptive: false}\nsearch: {trials_per_iter: 8}\n")
    c = load_config(
        p,
        [
            "measure.adaptive=true",
            "search.trials_per_iter=4",
            "scheduler.params.c=0.5",
            "tracking.tags={team: perf}",
            "model.shapes.input=1x3x8x8",
            "target=cuda",
            "tracking.run_name=a: b: c",
            "model.version='1.0'",
            "model.name=",
        ],
    )
    assert c.measure.adaptive is True and c.search.trials_per_iter == 4
    assert c.scheduler.params == {"c": 0.5}  # created intermediate mappings
    assert c.tracking.tags == {"team": "perf"} and c.model.shapes == {"input": (1, 3, 8, 8)}
    assert c.target == "cuda" and c.tracking.run_name == "a: b: c" and c.model.version == "1.0"
    assert c.model.name == "squeezenet1.1-random-weights"  # empty value = null = the default


def test_bad_set_overrides_are_reported_with_the_rest(tmp_path):
    p = write(tmp_path, "search: {trials_per_iter: 0}\nmodel: {path: a.onnx}\n")
    msg = error_of(
        load_config,
        p,
        ["measure.rel_tol=2", "measure.adaptive", "model.path.x=1", "=3", "search..seed=1", "budget_s=abc"],
    )
    assert msg.startswith(f"config {p} has 7 problems")
    for part in [
        "measure.rel_tol: must be in (0, 1), got 2",
        "--set 'measure.adaptive': expected KEY.PATH=VALUE",
        "--set 'model.path.x=1': model.path is a string ('a.onnx'), not a mapping",
        "--set '=3'",
        "--set 'search..seed=1'",
        "budget_s: must be a number, got a string ('abc')",
        "search.trials_per_iter: must be >= 1",
    ]:
        assert part in msg


def test_cli_overrides(tmp_path):
    p = write(tmp_path, "model: {path: a.onnx, shapes: {a: [1]}}\nbudget_s: 100\nslot_s: 10\n")
    c = load_config(
        p,
        ["budget_s=200", "scheduler.name=random"],
        model="b.onnx",
        shapes={"x": (1, 2)},
        budget=300,
        scheduler="greedy",
        work_dir="w",
    )
    assert c.model.path == str(tmp_path / "b.onnx") and c.model.name == "b"
    assert c.model.shapes == {"a": (1,), "x": (1, 2)}
    assert c.budget_s == 300 and c.scheduler.name == "greedy" and c.work_dir == str(tmp_path / "w")
    # None is ignored
    c = load_config(p, model=None, shapes=None, budget=None, scheduler=None, work_dir=None)
    assert c.model.path == str(tmp_path / "a.onnx") and c.budget_s == 100 and c.scheduler.name == "dynatune"
    assert "budget_s: must be > 0, got -1" in error_of(load_config, p, budget=-1)
    assert "slot_s: must be <= budget_s (5), got 10" in error_of(load_config, p, budget=5)
    with pytest.raises(TypeError):
        load_config(p, bugdet=5)


# -- round-trip, hash, bridges ----------------------------------------------------------------------
def test_to_dict_round_trips(tmp_path):
    c = load_config(
        str(REPO / "configs" / "quickstart.yaml"),
        [
            "measure.rpc={tracker_host: h, tracker_port: 9190, tracker_key: k, max_workers: 2}",
            "scheduler.params={beta: [1, 2.5, {x: null}]}",
            "target={kind: llvm, num-cores: 2}",
        ],
    )
    d = c.to_dict()
    assert json.loads(json.dumps(d)) == d
    assert d["model"]["shapes"] == {} and d["measure"]["rpc"]["tracker_port"] == 9190
    again = validate_dict(d, "dict")
    assert again == c and again.to_dict() == d and again.config_hash() == c.config_hash()


def test_config_hash_identity(tmp_path):
    base = load_config(None)
    h = base.config_hash()
    assert len(h) == 64 and h == load_config(None).config_hash()
    same = [
        "budget_s=5000",
        "tracking.run_name=r2",
        "tracking.experiment=e",
        "tracking.tags={a: b}",
        "tracking.uri=file:///t",
        "work_dir=elsewhere",
        "compile.verify=false",
        "prefect_api_url=http://p",
        "warm_start=[a]",
        "model.name=n",
        "model.version=v2",
    ]
    for s in same:
        assert load_config(None, [s]).config_hash() == h, s
    different = [
        "search.trials_per_iter=8",
        "measure.adaptive=false",
        "scheduler.name=random",
        "scheduler.seed=1",
        "scheduler.params={a: 1}",
        "target=cuda",
        "model.path=other.onnx",
        "model.shapes={data: [1, 3]}",
        "measure.rpc={tracker_host: h, tracker_port: 1, tracker_key: k}",
    ]
    hashes = {load_config(None, [s]).config_hash() for s in different}
    assert h not in hashes and len(hashes) == len(different)
    # int vs float spellings of the same number hash alike
    assert (
        load_config(None, ["measure.timeout_s=30"]).config_hash()
        == load_config(None, ["measure.timeout_s=30.0"]).config_hash()
    )


def test_the_engines_dataclasses_are_the_config_sections():
    from dynatune.search.measure import MeasureConfig
    from dynatune.search.session import SearchConfig

    c = load_config(
        None,
        [
            "search.trials_per_iter=4",
            "search.cost_model=ensemble",
            "search.seed=7",
            "search.contextual_exploration=true",
            "measure.adaptive=true",
            "measure.max_repeats=20",
            "measure.rel_tol=0.05",
            "measure.rpc={tracker_host: h, tracker_port: 9190, tracker_key: k}",
        ],
    )
    s, m = c.search, c.measure
    assert type(s) is SearchConfig and type(m) is MeasureConfig  # no copies to drift apart
    assert (s.trials_per_iter, s.cost_model, s.seed, s.population_size, s.build_timeout_s) == (
        4,
        "ensemble",
        7,
        64,
        15.0,
    )
    assert m.adaptive and m.max_repeats == 20 and m.repeat_cap == 20 and m.rel_tol == 0.05
    assert m.rpc == {"tracker_host": "h", "tracker_port": 9190, "tracker_key": "k"}


@pytest.mark.parametrize("section, cls", [("search", "SearchConfig"), ("measure", "MeasureConfig")])
def test_every_engine_setting_can_be_set_from_yaml(section, cls):
    """Each field of the engine's settings model is a YAML key (they once drifted: three search settings
    could not be set at all), and a bad value fails with its key path."""
    import dynatune.search.measure
    import dynatune.search.session

    klass = getattr(dynatune.search.session if cls == "SearchConfig" else dynatune.search.measure, cls)
    for name, f in klass.model_fields.items():
        default = f.get_default(call_default_factory=True)
        if isinstance(default, bool):
            value = not default
        elif isinstance(default, int):
            value = default + 1
        elif isinstance(default, float):
            value = round(min(default * 1.1, 0.99) if 0 < default < 1 else default + 1.5, 4)
        else:
            continue  # structured (rpc) and named (cost_model) settings are checked elsewhere
        c = load_config(None, [f"{section}.{name}={value}"])
        assert getattr(getattr(c, section), name) == value, name
        if not isinstance(default, bool):
            assert f"{section}.{name}: must be" in error_of(load_config, None, [f"{section}.{name}=abc"])


def test_the_compile_sections_lowering_carries_each_of_its_settings():
    """``compile.resident_storage`` (compile only) and ``compile.outer_reduction`` reach the Lowering the
    extraction and the compile share."""
    assert load_config(None, []).compile.lowering().resident_storage is True
    off = load_config(None, ["compile.resident_storage=false", "compile.outer_reduction=false"]).compile
    assert (off.lowering().resident_storage, off.lowering().outer_reduction) == (False, False)


# -- shipped configs --------------------------------------------------------------------------------
def test_shipped_configs_exist():
    names = {p.stem for p in CONFIGS}
    assert {"quickstart", "adaptive", *SCHEDULERS} <= names


@pytest.mark.parametrize("path", CONFIGS, ids=[p.stem for p in CONFIGS])
def test_shipped_configs_load(path, tmp_path):
    c = load_config(str(path))
    assert validate_dict(c.to_dict()) == c
    assert c.slot_s <= c.budget_s
    if path.stem == "quickstart":
        assert c.model.path == default_model_path()
        assert (c.budget_s, c.slot_s, c.search.trials_per_iter) == (240, 15, 16)
        assert c.work_dir == str(tmp_path / "runs" / "quickstart")
    else:
        assert c.model.path.endswith(os.path.join("shared", "models", "squeezenet1_1.onnx"))
        assert (c.budget_s, c.slot_s) == (900, 20)
        assert c.work_dir == str(tmp_path / "runs" / path.stem)
    if path.stem in SCHEDULERS:
        assert c.scheduler.name == path.stem
    if path.stem == "adaptive":
        assert c.measure.adaptive and c.search.cost_model == "ensemble" and c.search.contextual_exploration


def test_scheduler_configs_differ_only_in_scheduler():
    dicts = {}
    for name in SCHEDULERS:
        d = load_config(str(REPO / "configs" / f"{name}.yaml")).to_dict()
        for k in ("scheduler", "work_dir", "tracking"):
            d.pop(k)
        dicts[name] = d
    assert all(d == dicts["dynatune"] for d in dicts.values())


# -- property-based ---------------------------------------------------------------------------------
finite = st.floats(allow_nan=False, allow_infinity=False)


def _no_env_reference(s: str) -> bool:
    """A string "env:NAME" names an environment variable (dynatune.secrets): valid only where it is set."""
    return not s.startswith(ENV_PREFIX)


name_text = st.text(st.characters(codec="utf-8", exclude_categories=("Cs",)), min_size=1, max_size=12).filter(
    lambda s: s.strip() != "" and _no_env_reference(s)
)
plain = st.recursive(
    st.none() | st.booleans() | st.integers() | finite | st.text(max_size=8).filter(_no_env_reference),
    lambda kids: st.lists(kids, max_size=3) | st.dictionaries(st.text(max_size=6), kids, max_size=3),
    max_leaves=8,
)


def opt(**fields):
    """A mapping strategy where every key is optional."""
    return st.fixed_dictionaries({}, optional=fields)


def pos_num(hi=1e6):
    return st.floats(min_value=1e-3, max_value=hi) | st.integers(1, int(hi))


valid_measure = opt(
    adaptive=st.booleans(),
    repeat=st.integers(1, 50),
    min_repeat_ms=st.integers(0, 1000),
    number=st.integers(1, 100),
    min_repeats=st.integers(2, 5),
    max_repeats=st.integers(5, 100),
    batch=st.integers(1, 8),
    rel_tol=st.floats(1e-6, 0.999),
    race_factor=st.floats(1.001, 100),
    timeout_s=pos_num(),
    cpu_cache_flush=st.booleans(),
    rpc=st.none()
    | st.fixed_dictionaries(
        {"tracker_host": name_text, "tracker_port": st.integers(1, 65535), "tracker_key": name_text},
        optional={"session_timeout_s": pos_num(), "max_workers": st.integers(1, 64)},
    ),
)
valid_config = opt(
    model=opt(
        path=st.none() | name_text.map(lambda s: "m/" + s.replace("\x00", "") + ".onnx"),
        shapes=st.dictionaries(
            name_text,
            st.lists(st.integers(1, 4096), min_size=1, max_size=5)
            | st.lists(st.integers(1, 64), min_size=1, max_size=4).map(lambda d: "x".join(map(str, d))),
            max_size=3,
        ),
        name=st.none() | name_text,
        version=st.none() | name_text,
    ),
    target=st.sampled_from(["llvm", "cuda", "c"])
    | st.fixed_dictionaries(
        {"kind": st.sampled_from(["llvm", "cuda"])},
        optional={"mcpu": name_text, "num-cores": st.integers(1, 64)},
    ),
    budget_s=st.floats(1000, 1e6) | st.integers(1000, 10**6),
    slot_s=st.floats(0.5, 600) | st.integers(1, 600),
    scheduler=opt(
        name=st.sampled_from(SCHEDULERS),
        params=st.dictionaries(st.text(max_size=6), plain, max_size=3),
        seed=st.integers(0, 2**32 - 1),
    ),
    search=opt(
        trials_per_iter=st.integers(1, 512),
        population_size=st.integers(8, 4096),
        genetic_num_iters=st.integers(0, 10),
        eps_greedy=st.floats(0, 1),
        cost_model=st.sampled_from(COST_MODELS),
        contextual_exploration=st.booleans(),
        max_trials_per_task=st.integers(1, 10**6),
        seed=st.integers(0, 2**32 - 1),
        build_timeout_s=pos_num(),
    ),
    measure=valid_measure,
    compile=opt(
        verify=st.booleans(),
        rel_tol=pos_num(1),
        measure_untuned=st.booleans(),
        measure_onnxruntime=st.booleans(),
        prepack=st.booleans(),
        conv_layout=st.sampled_from(["auto", "NHWC", "NCHW"]),
    ),
    work_dir=name_text.map(lambda s: "w/" + s.replace("\x00", "")),
    tracking=opt(
        uri=st.none() | name_text,
        experiment=st.none() | name_text,
        run_name=st.none() | name_text,
        tags=st.dictionaries(st.text(max_size=6), st.text(max_size=6).filter(_no_env_reference), max_size=3),
    ),
    prefect_api_url=st.none() | name_text,
    warm_start=st.lists(name_text.map(lambda s: "r/" + s.replace("\x00", "")), max_size=3),
)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(valid_config)
def test_random_valid_configs_validate_and_round_trip(raw):
    c = validate_dict(raw, "random")
    d = c.to_dict()
    assert json.loads(json.dumps(d)) == d
    again = validate_dict(d, "again")
    assert again == c and again.to_dict() == d and again.config_hash() == c.config_hash()
    # what was given is what came out
    for key in ("budget_s", "slot_s"):
        if key in raw:
            assert math.isclose(getattr(c, key), raw[key])
    for sec in ("search", "measure", "compile"):
        for k, v in raw.get(sec, {}).items():
            if k != "rpc":
                assert getattr(getattr(c, sec), k) == v
    # and it survives a trip through a YAML file
    with tempfile.TemporaryDirectory() as tmp:
        p = os.path.join(tmp, "c.yaml")
        with open(p, "w") as f:
            yaml.safe_dump(d, f)
        assert load_config(p) == c


known_keys = st.sampled_from(
    [
        "model",
        "path",
        "shapes",
        "name",
        "target",
        "kind",
        "budget_s",
        "slot_s",
        "scheduler",
        "params",
        "search",
        "measure",
        "rpc",
        "tracker_port",
        "compile",
        "tracking",
        "tags",
        "warm_start",
        "rel_tol",
        "max_repeats",
        "min_repeats",
        "seed",
    ]
)
junk_scalar = (
    st.none()
    | st.booleans()
    | st.integers()
    | st.floats()
    | st.text(max_size=10)
    | st.binary(max_size=4)
    | st.dates()
)
junk = st.recursive(
    junk_scalar,
    lambda kids: (
        st.lists(kids, max_size=4)
        | st.tuples(kids)
        | st.dictionaries(known_keys | st.text(max_size=6) | st.integers() | st.none(), kids, max_size=4)
    ),
    max_leaves=12,
)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(junk | st.dictionaries(known_keys, junk, max_size=6))
def test_random_junk_only_raises_one_line_dynatune_errors(raw):
    try:
        validate_dict(raw, "junk")
    except DynatuneError as exc:
        assert "\n" not in str(exc) and "\n" not in exc.message


@settings(max_examples=150, deadline=None)
@given(
    st.lists(
        st.text(max_size=20)
        | st.builds(
            "{}={}".format, st.lists(known_keys, min_size=1, max_size=3).map(".".join), st.text(max_size=10)
        ),
        max_size=4,
    ),
    st.text(max_size=60),
)
def test_random_overrides_and_files_only_raise_dynatune_errors(overrides, text):
    with tempfile.TemporaryDirectory() as tmp:
        p = os.path.join(tmp, "c.yaml")
        with open(p, "w", encoding="utf-8", errors="surrogatepass") as f:
            f.write(text)
        for args in ((None, overrides), (p, ()), (p, overrides)):
            try:
                load_config(*args)
            except DynatuneError as exc:
                assert "\n" not in str(exc)


# what configs/quickstart.yaml sets on purpose (its comments say so): a small budget for a first run
QUICKSTART_CHANGES = {
    "budget_s": 240,
    "slot_s": 15,
    "work_dir": "runs/quickstart",
}


def _flat_sections(d: dict) -> dict:
    """``{"search.seed": 0, "budget_s": 600, ...}``: the sections' keys under their section's name."""
    from dynatune.run.config_schema import _sections

    out = {}
    for k, v in d.items():
        if k in _sections():
            out.update({f"{k}.{kk}": vv for kk, vv in (v or {}).items()})
        else:
            out[k] = v
    return out


def test_quickstart_lists_every_key_with_its_default():
    """configs/quickstart.yaml is the documentation of every key: it lists every setting of the model, no
    other key, each with its default (but the few it changes on purpose, and model.path, commented)."""
    from dynatune.run.config_schema import Config

    text = (REPO / "configs" / "quickstart.yaml").read_text()
    listed = _flat_sections(yaml.safe_load(text))
    defaults = _flat_sections(Config().model_dump())
    assert defaults.pop("model.path") is None and "\n  # path: " in text  # the built-in default model
    assert set(listed) == set(defaults), (set(defaults) - set(listed), set(listed) - set(defaults))
    assert set(QUICKSTART_CHANGES) <= set(defaults)
    for key, value in listed.items():
        expected = QUICKSTART_CHANGES.get(key, defaults[key])
        assert value == expected and isinstance(value, bool) == isinstance(expected, bool), (key, value)


def test_config_schema_command(capsys):
    """`dynatune config schema`: the JSON schema of the whole config, every section's settings in it."""
    from dynatune.cli import main
    from dynatune.run.config_schema import Config, _sections

    assert main(["config", "schema"]) == 0
    schema = json.loads(capsys.readouterr().out)
    assert schema == json.loads(json.dumps(Config.model_json_schema()))
    props = schema["properties"]
    assert set(props) == set(Config.model_fields) and schema["additionalProperties"] is False
    for name in _sections():
        ref = props[name]["$ref"].rsplit("/", 1)[-1]
        section = schema["$defs"][ref]
        cls = Config.model_fields[name].annotation
        assert set(section["properties"]) == set(cls.model_fields), name
        assert section["additionalProperties"] is False
    search = schema["$defs"]["SearchConfig"]["properties"]
    assert search["cost_model"]["enum"] == list(COST_MODELS) and search["trials_per_iter"]["minimum"] == 1
    assert schema["$defs"]["SchedulerSection"]["properties"]["name"]["enum"] == SCHEDULERS
    assert schema["$defs"]["MeasureConfig"]["properties"]["rel_tol"]["exclusiveMaximum"] == 1
