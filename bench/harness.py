"""What the maintained benchmarks share: their command lines, their results files, a model loaded into
tasks, the measurement protocols they state, a tuning run as a user runs it, and models timed side by side
with ONNX Runtime.

A benchmark states what it compares. A measurement protocol is given here field by field
(:data:`PROTOCOLS`), never as ``MeasureConfig()``: a default that changes (as measurement became adaptive
by default) would otherwise change what a benchmark measures without anyone noticing. The results record
the settings each variant ran with.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
RESULTS = os.path.join(ROOT, "bench", "results")

# Measurement protocols, every field that decides what a candidate's measurement costs and reads.
PROTOCOLS = {
    # 5 repeats, each looping the kernel for >= 10 ms (MeasureConfig's fixed protocol)
    "fixed": {"adaptive": False, "number": 1, "repeat": 5, "min_repeat_ms": 10},
    # AdaTune's: repeats of >= 4 ms until the mean is settled to 2 % (95 % confidence), 3 to 10 of them,
    # two at a time; raced against the task's best when 1.5x slower (3x after one repeat)
    "adaptive": {
        "adaptive": True,
        "number": 1,
        "adaptive_repeat_ms": 4,
        "min_repeats": 3,
        "max_repeats": 10,
        "batch": 2,
        "rel_tol": 0.02,
        "race_factor": 1.5,
        "quick_race_factor": 3.0,
    },
}


def measure_config(protocol: str, **changes):
    """The :class:`~dynatune.search.measure.MeasureConfig` of a named protocol, with ``changes`` to it."""
    from dynatune.search.measure import MeasureConfig

    return MeasureConfig(**(PROTOCOLS[protocol] | changes))


def protocol_sets(protocol: str) -> list[str]:
    """A named protocol's every field as ``--set`` overrides of a run config's ``measure``."""
    return [
        f"measure.{k}={str(v).lower() if isinstance(v, bool) else v}" for k, v in PROTOCOLS[protocol].items()
    ]


def parser(doc: str, **kwargs) -> argparse.ArgumentParser:
    """A benchmark's argument parser: its module docstring is its help."""
    return argparse.ArgumentParser(
        description=doc, formatter_class=argparse.RawDescriptionHelpFormatter, **kwargs
    )


def results_path(name: str) -> str:
    """Where a benchmark writes its raw results by default: ``bench/results/<name>``."""
    return os.path.join(RESULTS, name)


def read_json(path: str, default):
    """The results already in ``path`` (a benchmark adds to them), else ``default``."""
    if not os.path.exists(path):
        return default
    with open(path) as f:
        return json.load(f)


def write_json(path: str, doc) -> str:
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    with open(path, "w") as f:
        json.dump(doc, f, indent=1)
    return path


def spread(values) -> dict:
    """Median, min and max of a benchmark's per-round figures."""
    values = list(values)
    return {"median": statistics.median(values), "min": min(values), "max": max(values)}


def stem(path: str) -> str:
    """A model's name in the results: its file's stem."""
    return os.path.splitext(os.path.basename(path))[0]


def load_tasks(path: str, target=None, work_dir: str | None = None):
    """``(model, target, tasks)``: the ONNX model at ``path`` imported and split into tasks for ``target``
    (this machine's CPU when None), as a run with the default lowering extracts them, or as the run of
    ``work_dir`` did (its config's lowering: its records are of those tasks)."""
    from dynatune.machine.target import make_target
    from dynatune.model.extract import Lowering, extract_tasks
    from dynatune.model.importer import load_model

    target = target or make_target()
    model = load_model(path)
    return model, target, extract_tasks(model, target, run_lowering(work_dir) if work_dir else Lowering())


def run_lowering(work_dir: str):
    """The lowering a run's tasks were extracted with: its work dir's config's."""
    from dynatune.run.config import saved_config

    return saved_config(work_dir).compile.lowering()


def heaviest(tasks, n: int | None = None) -> list:
    """The tasks, heaviest first (weight x FLOPs: their share of the model's work); the first ``n``."""
    return sorted(tasks, key=lambda t: -t.weight * t.flops)[:n]


@dataclass
class Tuned:
    """A ``dynatune tune`` run: its summary, its wall seconds, and what it printed on stderr."""

    summary: object  # dynatune.run.summary.RunSummary
    wall_s: float
    stderr: str


def tune_cli(
    model: str,
    budget: float,
    work: str,
    config: str | None = None,
    sets=(),
    repo: str = ROOT,
    env: dict | None = None,
    cwd: str | None = None,
    timeout: float | None = None,
) -> Tuned:
    """``dynatune tune [CONFIG] --model MODEL --budget B --work-dir WORK --json`` as a user runs it (Prefect
    and MLflow included), in a process of the checkout ``repo`` (this one by default: an older worktree
    gives the "before" figures); ``sets``: ``--set KEY=VALUE`` overrides; ``env``: its environment
    (this process's by default); ``cwd``: where it runs (the checkout by default: ``python -m`` imports
    dynatune from there first)."""
    from dynatune.run.summary import RunSummary

    cmd = [sys.executable, "-m", "dynatune.cli", "tune", *([config] if config else [])]
    cmd += ["--model", model, "--budget", str(budget), "--work-dir", work, "--json"]
    for s in sets:
        cmd += ["--set", s]
    env = dict(os.environ if env is None else env, PYTHONPATH=repo)
    t0 = time.perf_counter()
    out = subprocess.run(cmd, cwd=cwd or repo, env=env, capture_output=True, text=True, timeout=timeout)
    if out.returncode != 0:
        raise RuntimeError(f"tune failed ({out.returncode}): {out.stderr[-2000:]}")
    summary = RunSummary.of(json.loads(out.stdout.strip().splitlines()[-1]))
    return Tuned(summary, time.perf_counter() - t0, out.stderr)


def run_settings(work: str, keys=("measure", "search", "stopping", "library", "anchors")) -> dict:
    """The settings a run's work dir says it ran with (its ``config.json``): what its figures stand for."""
    with open(os.path.join(work, "config.json")) as f:
        config = json.load(f)
    return {k: config.get(k) for k in keys}


# how the side-by-side timing calls a compiled model: as its user does (numpy arrays in and out,
# dynatune.runtime.run_vm), as a run's final timing does; ONNX Runtime with its defaults, the same threads
SIDE_BY_SIDE = "predict: numpy in and out (dynatune.runtime.run_vm), against ONNX Runtime's sess.run"


def side_by_side(model, vms: dict, rounds: int, block_ms: float = 200.0, threads: int | None = None) -> dict:
    """Each compiled model of ``vms`` (name -> Relax VM) and ONNX Runtime, timed in this process in blocks
    of ``block_ms``, their order reversed every other round, on the model's seeded inputs, with the load
    on the cores meanwhile. Per model: its median ms, and its per-round ratios to the first model and to
    ONNX Runtime (median, min, max)."""
    import tvm

    from dynatune.compiler.execution import onnxruntime_session
    from dynatune.compiler.timing import interleave, ort_block_timer, predict_block_timer
    from dynatune.machine.load import LoadProbe
    from dynatune.machine.target import usable_cores

    threads = threads or usable_cores()
    inputs, dev = model.random_inputs(0), tvm.cpu()
    timers = [predict_block_timer(vm, inputs, dev, block_ms) for vm in vms.values()]
    sess = onnxruntime_session(model, threads)
    probe = LoadProbe()
    *tvm_ms, ort_ms = interleave([*timers, ort_block_timer(sess, inputs, block_ms)], rounds, 0.05)
    load = probe.stop().as_dict()
    rows = [
        {
            "variant": name,
            "ms": statistics.median(ms),
            "vs_first": spread(a / b for a, b in zip(ms, tvm_ms[0])),
            "vs_onnxruntime": spread(a / b for a, b in zip(ms, ort_ms)),
        }
        for name, ms in zip(vms, tvm_ms)
    ]
    return {
        "timer": SIDE_BY_SIDE,
        "rounds": rounds,
        "block_ms": block_ms,
        "threads": threads,
        "onnxruntime_ms": statistics.median(ort_ms),
        "load": load,
        "variants": rows,
    }
