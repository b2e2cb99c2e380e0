"""Recorded tuning traces: the documents the replay benchmark reads, and the resumable recorder.

A trace document (``dynatune/bench/data/traces/<model>.json``) holds, per task, one trace per search seed::

    {"model": ..., "format": 2, "seeds": [0, 1, 2], "seconds_per_task": 20, "trials_per_iter": 8, ...,
     "tasks": [{"index", "name", "key", "weight", "flops",
                "traces": [{"seed": 0, "default_s": ..., "trace": [[seconds, trials, best_s], ...]}, ...]}]}

with ``trace[0] = [0, 0, default_s]``: a task tuned alone, batch after batch, and its best latency after
each batch. Several seeds put search luck into the data: the replay draws one trace per task per replay
seed (:func:`draw`). Format 1 (one ``trace`` per task, sessions 1-3) is read as one seed.

:func:`record` is resumable: it writes the document after every task, skips (seed, task) pairs already
in it, and continues a half-tuned task from its seed's work directory, so recording can go on in chunks.
"""

from __future__ import annotations

import datetime
import glob
import json
import os
import platform
import random

from dynatune.errors import DynatuneError
from dynatune.files import atomic_write_json
from dynatune.machine.target import describe

TRACE_DIR = os.path.join(os.path.dirname(__file__), "data", "traces")
ANCHOR_DIR = os.path.join(os.path.dirname(__file__), "data", "anchors")  # bench.trace_anchors writes them
# what must match for a document to be continued rather than replaced
SETTINGS = ("sha256", "target", "seconds_per_task", "trials_per_iter", "lowering", "search")


def load_traces(path_or_name: str) -> dict:
    """A trace document from a path, or from a model name in ``dynatune/bench/data/traces/``."""
    path = path_or_name
    if not os.path.exists(path):
        path = os.path.join(TRACE_DIR, os.path.basename(path_or_name).removesuffix(".json") + ".json")
    if not os.path.exists(path):
        raise DynatuneError(
            f"no traces for {path_or_name!r}",
            "available: " + (", ".join(available_traces()) or "none recorded yet"),
        )
    with open(path) as f:
        doc = json.load(f)
    if not doc.get("tasks"):
        raise DynatuneError(
            f"trace file {path} has no tasks", "re-record it with python -m bench.record_traces"
        )
    return doc


def with_anchors(doc: dict) -> dict:
    """``doc`` with each task's ``anchor_s`` (ONNX Runtime's time for its operator, on the recording
    machine's scale) from ``data/anchors/<model>.json``; raises when there is none."""
    path = os.path.join(ANCHOR_DIR, doc["model"] + ".json")
    if not os.path.exists(path):
        raise DynatuneError(
            f"no anchors for {doc['model']}", f"run: python -m bench.trace_anchors {doc['model']}"
        )
    with open(path) as f:
        anchors = json.load(f)["anchor_s"]
    return {**doc, "tasks": [{**r, "anchor_s": anchors.get(r["name"], 0.0)} for r in doc["tasks"]]}


def available_traces() -> list[str]:
    return sorted(os.path.basename(p)[:-5] for p in glob.glob(os.path.join(TRACE_DIR, "*.json")))


def task_traces(row: dict) -> list[dict]:
    """A task's recorded traces, ``[{"seed", "default_s", "trace"}]`` (format 1: its one trace, seed 0)."""
    if "traces" in row:
        return row["traces"]
    return [{"seed": 0, "default_s": row["default_s"], "trace": row["trace"]}]


def recorded_seeds(doc: dict) -> list[int]:
    return sorted({x["seed"] for r in doc["tasks"] for x in task_traces(r)})


def traces_per_task(doc: dict) -> int:
    """The fewest traces any task has (what a replay can draw from for every task)."""
    return min(len(task_traces(r)) for r in doc["tasks"])


def draw(doc: dict, rng: random.Random | None, seed: int | None = None) -> dict:
    """A single-trace document: one recorded trace per task, chosen by ``rng`` (None: the first of each, or
    the one recorded with search ``seed`` where the task has it)."""
    tasks = []
    for r in doc["tasks"]:
        options = task_traces(r)
        pick = options[0] if rng is None else rng.choice(options)
        if seed is not None:
            pick = next((x for x in options if x["seed"] == seed), pick)
        meta = {k: v for k, v in r.items() if k not in ("traces", "trace", "default_s")}
        tasks.append({**meta, "default_s": pick["default_s"], "trace": pick["trace"], "seed": pick["seed"]})
    return {**{k: v for k, v in doc.items() if k != "tasks"}, "tasks": tasks}


def task_bound(doc, row: dict) -> float:
    """A task's roofline bound (s) on the recording machine: its own ``bound_s``, else from its FLOPs and
    bytes at the document's ``roofline`` (0: unknown)."""
    if row.get("bound_s"):
        return float(row["bound_s"])
    from dynatune.machine.roofline import Roofline

    roof = doc.get("roofline") if isinstance(doc, dict) else None
    if not roof:
        return 0.0
    return Roofline(**roof).bound_s(float(row.get("flops", 0.0)), float(row.get("bytes", 0.0)))


# -- recording --------------------------------------------------------------------------------------
def record(cfg, seeds, seconds_per_task: float, out: str, work_root: str, log=print) -> dict:
    """Record ``seeds`` x every task of ``cfg``'s model into ``out`` (continued if it is there).

    ``cfg``: a run config (its model, target, lowering, search and measure settings; ``search.seed`` is
    replaced by each seed). Each seed tunes in ``<work_root>/seed<N>``: one session per seed, tasks one after
    another, so its cost model learns across tasks as in a run. Returns the document.
    """
    from dynatune.run.pipeline import extract, load_model

    model = load_model(cfg)
    target, tasks, _ = extract(model, cfg)
    head = {
        "model": model.name,
        "sha256": model.sha256,
        "target": describe(target),
        "seconds_per_task": float(seconds_per_task),
        "trials_per_iter": cfg.search.trials_per_iter,
        "lowering": cfg.compile.lowering_settings(),
        "search": cfg.search.model_dump(exclude={"seed"}),
    }
    doc = _continued(out, head, tasks)
    for seed in seeds:
        todo = [t for t in tasks if seed not in {x["seed"] for x in task_traces(doc["tasks"][t.index])}]
        if todo:
            _record_seed(cfg, target, tasks, todo, seed, seconds_per_task, doc, out, work_root, log)
    if "roofline" not in doc or any("bytes" not in r for r in doc["tasks"]):
        _add_roofline(doc, tasks, target)  # after the tuning: measured on quiet cores
        atomic_write_json(out, doc)
    return doc


def _add_roofline(doc: dict, tasks, target) -> None:
    """The recording machine's roofline, and each task's compulsory bytes (for the tasks' bounds)."""
    from dynatune.machine.roofline import compulsory_bytes, machine_roofline

    roof = machine_roofline(target)
    doc["roofline"] = roof.as_dict() if roof is not None else None
    for row, t in zip(doc["tasks"], tasks):
        row["bytes"] = compulsory_bytes(t.mod)


def _continued(out: str, head: dict, tasks) -> dict:
    if not os.path.exists(out):
        return {
            **head,
            "format": 2,
            "seeds": [],
            "machine": f"{platform.machine()} {os.cpu_count()} cores",
            "tasks": [{**t.as_dict(), "traces": []} for t in tasks],
        }
    with open(out) as f:
        doc = json.load(f)
    differ = [k for k in SETTINGS if doc.get(k) != head[k]]
    if doc.get("format") != 2 or differ or [r["key"] for r in doc["tasks"]] != [t.key for t in tasks]:
        raise DynatuneError(
            f"{out} was recorded with other settings ({', '.join(differ) or 'format or tasks'})",
            "give another --out, or delete it to start over",
        )
    return doc


def _record_seed(cfg, target, tasks, todo, seed, seconds_per_task, doc, out, work_root, log) -> None:
    from dynatune.search.session import TuningSession

    search = cfg.search.model_copy(update={"seed": seed})
    sess = TuningSession(
        tasks, target, os.path.join(work_root, f"seed{seed}"), search=search, measure=cfg.measure
    )
    try:
        sess.warm_up()  # one-off imports and worker pools: not part of the first task's trace
        defaults = sess.measure_defaults()
        for t in todo:
            st = sess.state(t.index)
            while st.seconds < seconds_per_task and not st.exhausted:
                if sess.tune(t.index, trials=search.trials_per_iter).exhausted:
                    break
            trace = [[0.0, 0, defaults[t.index]]] + [list(p) for p in st.history]
            doc["tasks"][t.index]["traces"].append(
                {"seed": seed, "default_s": defaults[t.index], "trace": trace}
            )
            doc["seeds"] = sorted(set(doc["seeds"]) | {seed})
            doc["date"] = datetime.date.today().isoformat()
            atomic_write_json(out, doc)
            log(
                f"seed {seed} {t.name}: {defaults[t.index] * 1e3:.3f} -> "
                f"{sess.best_latency(t.index) * 1e3:.3f} "
                f"ms in {st.seconds:.0f} s, {st.trials} trials"
            )
    finally:
        sess.close()
