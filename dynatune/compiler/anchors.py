"""An anchor per operator: ONNX Runtime's time for the same operator as a task, inside its own model.

ONNX Runtime runs the whole model with its profiler on, in rounds interleaved with the timings it is
compared to; each of its kernels (a Conv with its fused activation, a MatMul, a Gemm) is then matched to
the task with the same weight and output shapes (:func:`shape_key`, which ignores the layout: OHWI or
OIHW weights, NHWC or NCHW outputs, a transposed weight). ONNX Runtime pads channels to its NCHWc block
(1000 output channels become 1008), and so may dynatune (:mod:`dynatune.model.channel_padding`, up to
one vector past the whole vectors: 1000 -> 1024), so a dim may differ by up to two blocks. Its kernels are
timed where they run, inside the model: a one-node model would charge each operator with the layout
conversions that the whole model does once, and flatter dynatune.
"""

from __future__ import annotations

import json
import os
import shutil
import statistics
import tempfile
import time
import weakref
from collections import defaultdict

import numpy as np

from dynatune.model.channel_padding import EXTRA_VECTORS

ANCHORED_OPS = {"Conv", "FusedConv", "MatMul", "FusedMatMul", "Gemm"}
CHANNEL_BLOCK = 16  # ONNX Runtime's NCHWc block on AVX-512 (8 on AVX2): its padding is smaller
# how far a dim may differ by padding: ONNX Runtime's block, or dynatune's whole vectors and extra ones
PADDING_TOLERANCE = CHANNEL_BLOCK * (1 + EXTRA_VECTORS)


def shape_key(weight_shape, output_shape) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """The dims (unit dims left out, sorted) of a weight and of an output."""
    return (
        tuple(sorted(int(d) for d in weight_shape if int(d) != 1)),
        tuple(sorted(int(d) for d in output_shape if int(d) != 1)),
    )


def task_shape_key(task):
    """:func:`shape_key` of a task's first weight (a layout-free argument) and its output; ``None`` for a
    task without a weight."""
    from tvm.s_tir.meta_schedule.arg_info import ArgInfo

    func = task.mod["main"]
    params = ArgInfo.from_prim_func(func)
    free = [int(i) for i in (func.attrs.get("layout_free_buffers") or [])] if func.attrs else []
    weights = [params[i] for i in free if len(params[i].shape) >= 2]
    return shape_key(weights[0].shape, params[-1].shape) if weights else None


def _padded_match(task_dims, ort_dims) -> int | None:
    """How much the dims differ by padding (either side's: ONNX Runtime's NCHWc block, or a task's
    channels padded to whole vectors, :mod:`dynatune.model.channel_padding`), or ``None`` when they are not
    the same dims."""
    if len(task_dims) != len(ort_dims):
        return None
    gaps = [abs(o - t) for t, o in zip(task_dims, ort_dims)]
    return sum(gaps) if all(g < PADDING_TOLERANCE for g in gaps) else None


def match_tasks(tasks, kernels: dict) -> dict:
    """``{task index: ONNX Runtime kernel name}``: for each task with a weight, the kernel with the same
    shapes (exact, else the least padded)."""
    out = {}
    for t in tasks:
        key = task_shape_key(t)
        if key is None:
            continue
        scored = []
        for name, (weight, output) in kernels.items():
            ort = shape_key(weight, output)
            w, o = _padded_match(key[0], ort[0]), _padded_match(key[1], ort[1])
            if w is not None and o is not None:
                scored.append((w + o, name))
        if scored:
            out[t.index] = min(scored)[1]
    return out


class OnnxRuntimeProfile:
    """ONNX Runtime running ``model`` with its profiler: :meth:`run_block` runs it for a block of time (call
    it in the rounds of a side-by-side timing), :meth:`op_ms` reads each task's kernel time."""

    def __init__(self, model, threads: int, block_ms: float = 50.0):
        import onnxruntime as ort

        from dynatune.compiler.execution import onnxruntime_session

        self._dir = tempfile.mkdtemp(prefix="ort-profile-")
        # removed when the profile is read, or when this object goes away unread (a run that failed)
        self._remove_dir = weakref.finalize(self, shutil.rmtree, self._dir, ignore_errors=True)
        options = ort.SessionOptions()
        options.enable_profiling = True
        options.profile_file_prefix = os.path.join(self._dir, "ort")
        self.session = onnxruntime_session(model, threads, options)
        self.feed = model.random_inputs(0) if hasattr(model, "random_inputs") else random_feed(self.session)
        self.block_s = block_ms / 1e3
        self.session.run(None, self.feed)  # warm up (its events are dropped with the first run's)
        self.runs = 0

    def run_block(self) -> None:
        start = time.perf_counter()
        while time.perf_counter() - start < self.block_s:
            self.session.run(None, self.feed)
            self.runs += 1

    def kernels(self) -> tuple[dict, dict]:
        """``({kernel: (weight shape, output shape)}, {kernel: median ms per call})`` of the anchored ops
        (the first, warm-up, run left out)."""
        path = self.session.end_profiling()
        with open(path) as f:
            events = json.load(f)
        self._remove_dir()
        durations, shapes = defaultdict(list), {}
        for e in events:
            args = e.get("args", {})
            if e.get("cat") != "Node" or not e["name"].endswith("_kernel_time"):
                continue
            if args.get("op_name") not in ANCHORED_OPS or len(args.get("input_type_shape", [])) < 2:
                continue
            data = next(iter(args["input_type_shape"][0].values()))
            weight = next(iter(args["input_type_shape"][1].values()))
            output = next(iter(args["output_type_shape"][0].values()))
            if args["op_name"] not in ("Conv", "FusedConv"):  # a prepacked weight is not listed: K x N
                weight = [data[-1], output[-1]]
            shapes[e["name"]] = (weight, output)
            durations[e["name"]].append(e["dur"] / 1e3)
        return shapes, {k: statistics.median(v[1:] or v) for k, v in durations.items()}

    def op_ms(self, tasks) -> dict[int, float]:
        """``{task index: ms}``: ONNX Runtime's time, inside its model, for each task's operator."""
        shapes, ms = self.kernels()
        return {i: ms[name] for i, name in match_tasks(tasks, shapes).items()}


def operator_anchors(
    model, tasks, threads: int, seconds: float = 1.0, max_runs: int = 200
) -> dict[int, float]:
    """``{task index: seconds}``: ONNX Runtime's time for each task's operator inside ``model``, profiled
    for about ``seconds`` or ``max_runs`` runs, whichever comes first (a small model's profile of a whole
    second took longer to read than to run): what the headroom beliefs take as a reachable floor."""
    profile = OnnxRuntimeProfile(model, threads, block_ms=10.0)
    end = time.perf_counter() + seconds
    while time.perf_counter() < end and profile.runs < max_runs:
        profile.run_block()
    return {i: ms / 1e3 for i, ms in profile.op_ms(tasks).items()}


def run_anchors(
    model, tasks, work_dir: str, threads: int, sources=(), target: str | None = None
) -> dict[int, float]:
    """:func:`operator_anchors` once per work dir (``anchors.json``; a resumed run reads them back, and
    measures them again if the file is damaged). A model ONNX Runtime cannot run has none: the beliefs then
    use the roofline alone. A run warm-started from ``sources`` (work dirs) reads the anchors of the newest
    one that tuned the same tasks for the same ``target`` (:func:`source_anchors`) instead of measuring
    them again, as the roofline is read from its cache: these are the floors that run's beliefs stood on."""
    import warnings

    from dynatune.files import WorkDir, atomic_write_json
    from dynatune.search.state_files import DamagedFile

    path = WorkDir(work_dir).anchors
    try:
        saved = read_anchors(path)
        if saved is not None:
            return saved
    except (DamagedFile, ValueError, TypeError):  # a measurement, not state: measured again
        pass
    anchors = source_anchors(tasks, sources, target)
    if anchors is None:
        try:
            anchors = operator_anchors(model, tasks, threads)
        except Exception as exc:  # noqa: BLE001 - the run goes on without anchors
            warnings.warn(f"ONNX Runtime's per-operator times are not available: {exc}", stacklevel=2)
            anchors = {}
    atomic_write_json(path, {str(i): s for i, s in anchors.items()})
    return anchors


def read_anchors(path: str) -> dict[int, float] | None:
    """An ``anchors.json``: ``{task index: seconds}``, None when there is none (a damaged one raises)."""
    from dynatune.search.state_files import read_json_file

    saved = read_json_file(path, dict)
    return None if saved is None else {int(i): float(s) for i, s in saved.items()}


def source_anchors(tasks, sources, target: str | None) -> dict[int, float] | None:
    """The anchors of the newest of ``sources`` (work dirs) whose tasks are ``tasks`` (the same keys in the
    same order) and whose tuned model was built for ``target`` (its ``model.json``); None when none is.
    Measured again in every run, ONNX Runtime's times per operator moved by 10-50 % between two runs on
    one guest, and each task's floor with them: a retune's beliefs read headroom its source had not."""
    from dynatune.files import WorkDir
    from dynatune.runtime import metadata_path
    from dynatune.search.state_files import DamagedFile, read_json_file

    if target is None:
        return None
    keys = [t.key for t in tasks]
    for src in reversed(list(sources)):
        wd = WorkDir(src)
        try:
            built = (read_json_file(metadata_path(wd.model_so), dict) or {}).get("target")
            same = [t.get("key") for t in read_json_file(wd.tasks, list) or [] if isinstance(t, dict)] == keys
            if same and built == target:
                saved = read_anchors(wd.anchors)
                if saved is not None:
                    return saved
        except (DamagedFile, ValueError, TypeError):  # a source's damaged file: not its anchors
            continue
    return None


def random_feed(session) -> dict:
    """Random inputs for ``session`` (a dynamic dim at 1)."""
    rng = np.random.default_rng(0)
    return {
        i.name: rng.standard_normal([d if isinstance(d, int) and d > 0 else 1 for d in i.shape]).astype(
            np.float32
        )
        for i in session.get_inputs()
    }
