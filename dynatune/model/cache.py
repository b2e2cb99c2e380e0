"""Cache of extracted tasks, keyed by the model file's content hash, the input shapes and the target.

Extraction (fusing the whole model and collecting its TIR functions) takes seconds to tens of seconds
(DenseNet-121: ~25 s); re-running a config, resuming, or tuning a model whose file did not change reads
the tasks back from ``<work_dir>/cache/`` instead. The lowering (weight prepacking, conv layout) is part
of the key: it changes the tasks' keys. Version 3 is the first with the conv layout; version 4 carries it
through Clip, HardSwish, LeakyRelu, Pad, Sum and unsqueezed scales, and fuses the activation after a batch
norm (dynatune.model.layout); version 5 counts a task's FLOPs as its reductions' (dynatune.model.flops);
version 6 a Winograd convolution's batched GEMM only, not its transforms, and takes 16 output tiles (a
13x13 map) as Winograd (dynatune.model.winograd).
"""

from __future__ import annotations

import hashlib
import json
import os

from dynatune.files import atomic_write_json
from dynatune.model.extract import Lowering, Task, extract_tasks

VERSION = 6


def cache_key(model, target, lowering: Lowering = Lowering()) -> str:
    shapes = json.dumps(sorted((i.name, list(i.shape), i.dtype) for i in model.inputs))
    raw = f"{VERSION}|{model.sha256}|{shapes}|{target}|{lowering.describe(target)}"
    return hashlib.sha256(raw.encode()).hexdigest()[:20]


def cached_extract(model, target, cache_dir: str, lowering: Lowering = Lowering()) -> tuple[list[Task], bool]:
    """Tasks of ``model`` for ``target``; ``(tasks, hit)`` where hit says they came from the cache."""
    import tvm

    path = os.path.join(cache_dir, f"tasks-{cache_key(model, target, lowering)}.json")
    if os.path.exists(path):
        try:
            with open(path) as f:
                doc = json.load(f)
            tasks = [
                Task(r["index"], r["name"], r["key"], r["weight"], r["flops"], tvm.ir.load_json(r["mod"]))
                for r in doc["tasks"]
            ]
            return tasks, True
        except (OSError, ValueError, KeyError):
            pass  # a damaged cache file: extract again
    tasks = extract_tasks(model, target, lowering)
    os.makedirs(cache_dir, exist_ok=True)
    atomic_write_json(
        path,
        {
            "model": model.name,
            "sha256": model.sha256,
            "tasks": [{**t.as_dict(), "mod": tvm.ir.save_json(t.mod)} for t in tasks],
        },
    )
    return tasks, False
