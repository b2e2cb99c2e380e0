"""The tuned model where its user runs it: each run's artifact loaded in a brand-new Python process that
has imported nothing of dynatune, timed side by side with ONNX Runtime there, against the ratio the run
reported.

    python -m bench.deployed_speed runs/quickstart runs/mnasnet0_5 ... [--openvino] [--rounds 15] \\
        [--block-ms 200] [--repeats 3]

For each work dir (a finished ``dynatune tune`` run: ``model.so``, its ``model.json``, ``report/summary.json``
and the run's MLflow store), fresh processes, one per way of loading:

- ``run's timing, again``: the run's own side-by-side timing (``dynatune.compiler.fresh_timing``), again now:
  the reference the ways below are held against, measured in the same minutes as they are;
- ``loader``: ``dynatune.runtime.load(model.so).predict(inputs)``, the README's first way;
- ``pyfunc``: ``mlflow.pyfunc.load_model(summary.tuned_model_uri).predict(inputs)``, its second (dynatune is
  not imported at all: the MLflow model brings its own copy of the loader); in the same rotation, the same
  pyfunc model's own ``predict`` called directly (``PyFuncModel._model_impl``, MLflow's stable developer
  API: its ``PyFuncModel.predict``, signature enforcement and prediction context, bypassed), so
  ``vs_unwrapped`` is what MLflow's wrapper costs a call;
- ``loader beside OpenVINO`` (with OpenVINO installed): the loader, ONNX Runtime and OpenVINO in one rotation;
- ``plain TVM``: ``tvm.runtime.load_module`` + ``relax.VirtualMachine``, ``vm["main"](*tensors)``, with
  nothing set: what a user who followed the README before it named ``TVM_NUM_THREADS`` got;
- ``plain TVM, TVM_NUM_THREADS``: the same with ``TVM_NUM_THREADS`` set as ``model.json`` says (and TVM's
  long default spin, which slows the ONNX Runtime block after a TVM block: that side's ratio flatters TVM).

On this shared 2-core machine a process's ratio moves by 10-20 % from one process to the next (seen here:
the same artifact, timed the run's way twice in a row, 1.237 then 1.111). So the first three ways run
``--repeats`` processes each, interleaved; the others run once. A way's ratio is what a run reports
(:func:`dynatune.compiler.timing.best_ratio`): its fastest dynatune block among its processes over ONNX
Runtime's fastest, with the min-max of its processes' own ratios; each process's median of its rounds'
ratios is kept beside them (``ratio_median``).

Each process times ``predict`` (numpy in, numpy out, as a user calls it) and ONNX Runtime's ``sess.run``
(its defaults, as many intra-op threads as the model was timed with) in alternating blocks, the order
swapped every round, on the same seeded inputs, and prints the per-round ratios. With ``--openvino`` the
loader's process times OpenVINO too (``pip install -c constraints.txt -e '.[bench]'``: the benchmarks'
extra, not the runtime's; asked for, never picked up because it happens to be installed):
``compile_model(onnx, "CPU", PERFORMANCE_HINT=LATENCY, INFERENCE_NUM_THREADS=<threads>,
INFERENCE_PRECISION_HINT=f32)``, an infer request's ``infer(inputs)``, in the same rotation; the row then
gives dynatune against the faster of ONNX Runtime and OpenVINO (issue #55's target): the fastest blocks, and
round by round (``vs_fastest_min``, ``vs_fastest_max``).
A process whose ONNX Runtime's fastest block is over ``QuietPolicy.slow_onnxruntime`` times the row's
fastest ran in a slow spell of the shared machine (both sides slow, ONNX Runtime more: its ratio flatters
dynatune, and the load probe does not see it): it is marked ``onnxruntime_slow``, the OpenVINO rotation is
timed again (up to :data:`SLOW_RETRIES` times), and the row's dynatune / the faster runtime is read from its
processes that were not slow. Each process starts with no ``TVM_*``, ``OMP_*`` or ``DYNATUNE_*`` variable.
The machine's load is probed before each process (dynatune.machine.load); a busy one is reported, not
hidden. Target (issue #54): the loader's and pyfunc's ratio within 10 % of the run's. Results go to
``bench/results/deployed_speed.json``.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile

from bench.harness import parser, results_path, write_json

RUN_WAY, OPENVINO_WAY = "run's timing, again", "loader beside OpenVINO"
# a process whose ONNX Runtime's fastest block is over QuietPolicy.slow_onnxruntime times the fastest of the
# row's processes ran in a slow spell of the shared machine: both sides slow, ONNX Runtime more (mnasnet0_5:
# 1.22 ms against 0.70, dynatune 0.86 against 0.63), so its ratio flatters dynatune. The OpenVINO rotation
# (timed once; the target's figure) is timed again then, up to this many times. (Plain TVM's ways slow ONNX
# Runtime themselves: TVM's default spin)
SLOW_RETRIES = 2
REPEATED = (RUN_WAY, "loader", "pyfunc")  # timed --repeats times each, interleaved
ONCE = (OPENVINO_WAY, "plain TVM", "plain TVM, TVM_NUM_THREADS")

# the child: imports numpy, onnxruntime, and what its way of loading needs; nothing of dynatune before it
CHILD = r"""
import json, os, sys, time
spec = json.loads(sys.argv[1])
t0 = time.perf_counter()
import numpy as np
way, meta = spec["way"], spec["metadata"]
if way.startswith("loader"):
    from dynatune.runtime import load
    predict = load(spec["library"]).predict
elif way == "pyfunc":
    import mlflow
    mlflow.set_tracking_uri(spec["tracking_uri"])
    pyfunc_model = mlflow.pyfunc.load_model(spec["model_uri"])
    predict = pyfunc_model.predict
else:
    import tvm
    from tvm import relax
    vm = relax.VirtualMachine(tvm.runtime.load_module(spec["library"]), tvm.cpu())
    main = vm["main"]
    def predict(inputs):
        out = main(*[tvm.runtime.tensor(inputs[i["name"]]) for i in meta["inputs"]])
        outs = out if isinstance(out, (list, tuple)) or not hasattr(out, "numpy") else [out]
        return {o["name"]: t.numpy() for o, t in zip(meta["outputs"], outs)}
load_s = time.perf_counter() - t0
dynatune_modules = sorted(m for m in sys.modules if m.split(".")[0] == "dynatune")
import onnxruntime as ort
so = ort.SessionOptions()
so.intra_op_num_threads = int(meta["thread_pool"]["TVM_NUM_THREADS"])
so.inter_op_num_threads = 1
sess = ort.InferenceSession(spec["onnx"], so, providers=["CPUExecutionProvider"])
rng = np.random.default_rng(0)
inputs = {i["name"]: rng.standard_normal(i["shape"]).astype(i["dtype"]) for i in meta["inputs"]}
def block(f):
    n, t = 0, time.perf_counter()
    while True:
        f()
        n += 1
        if time.perf_counter() - t >= spec["block_ms"] / 1e3:
            return (time.perf_counter() - t) / n * 1e3
sides = {"ms": lambda: predict(inputs), "ort_ms": lambda: sess.run(None, inputs)}
if spec["openvino"]:
    import openvino as ov
    compiled = ov.Core().compile_model(spec["onnx"], "CPU", {
        "PERFORMANCE_HINT": "LATENCY", "INFERENCE_NUM_THREADS": so.intra_op_num_threads,
        "INFERENCE_PRECISION_HINT": "f32"})
    request = compiled.create_infer_request()
    sides["openvino_ms"] = lambda: request.infer(inputs)
if way == "pyfunc":  # the same model with MLflow's PyFuncModel.predict (signature enforcement) bypassed
    model_impl = pyfunc_model._model_impl
    sides["unwrapped_ms"] = lambda: model_impl.predict(inputs)
names = list(sides)
for name in names:
    block(sides[name])
ms = {name: [] for name in names}
for r in range(spec["rounds"]):
    for name in names if r % 2 == 0 else reversed(names):
        time.sleep(0.05)
        ms[name].append(block(sides[name]))
import tvm
threads = tvm.get_global_func("runtime.NumThreads")()
print(json.dumps(ms | {"load_s": load_s, "threads": threads, "dynatune_modules_at_load": dynatune_modules}))
"""


def run_child(spec: dict, extra_env: dict) -> dict:
    drop = ("TVM_", "OMP_", "DYNATUNE_", "PYTHONPATH", "MLFLOW_")
    env = {k: v for k, v in os.environ.items() if not k.startswith(drop)} | extra_env
    out = subprocess.run(
        [sys.executable, "-c", CHILD, json.dumps(spec)], env=env, capture_output=True, text=True, timeout=900
    )
    if out.returncode != 0:
        raise RuntimeError(f"{spec['way']}: {out.stderr.strip().splitlines()[-1:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def pinned_onnx(config: dict, meta: dict, path: str) -> str:
    """The run's ONNX model at the shapes it was tuned for (what ONNX Runtime runs in the child)."""
    from dynatune.model.importer import ModelInput, runtime_proto

    inputs = [ModelInput(i["name"], tuple(i["shape"]), i["dtype"]) for i in meta["inputs"]]
    with open(path, "wb") as f:
        f.write(runtime_proto(config["model"]["path"], inputs).SerializeToString())
    return path


def _ratios(tvm_ms, ort_ms) -> list[float]:
    return [a / b for a, b in zip(tvm_ms, ort_ms)]


def one_timing(way: str, spec: dict, meta: dict, model) -> dict:
    """One fresh process of ``way``: its per-round ratios, medians, load time and threads."""
    import numpy as np

    from dynatune.compiler.timing import best_ratio
    from dynatune.machine.load import probe

    busy = probe(1.0).busy_cores
    if way == RUN_WAY:  # what the run itself reported was timed this way (dynatune.compiler.fresh_timing)
        from dynatune.compiler.fresh_timing import time_in_fresh_process
        from dynatune.machine.load import QuietPolicy

        t = time_in_fresh_process(
            spec["library"],
            model,
            threads=spec["threads"],
            rounds=spec["rounds"],
            quiet=QuietPolicy(attempts=1),
        )
        got = {"ms": t.tvm_ms, "ort_ms": t.ort_ms, "load_s": None, "threads": None}
        got["dynatune_modules_at_load"] = ["(the run's timing process imports dynatune)"]
    else:
        env = {"TVM_NUM_THREADS": meta["thread_pool"]["TVM_NUM_THREADS"]} if way.endswith("THREADS") else {}
        got = run_child(spec | {"way": way, "openvino": way == OPENVINO_WAY}, env)
    ratios = _ratios(got["ms"], got["ort_ms"])
    out = {
        "ratio": best_ratio(got["ms"], got["ort_ms"]),  # what a run reports (dynatune.compiler.timing)
        "ratio_min": min(ratios),
        "ratio_max": max(ratios),
        "ratio_median": float(np.median(ratios)),
        "ms_best": min(got["ms"]),
        "onnxruntime_ms_best": min(got["ort_ms"]),
        "ms": float(np.median(got["ms"])),
        "onnxruntime_ms": float(np.median(got["ort_ms"])),
        "threads": got["threads"],
        "load_s": got["load_s"],
        "dynatune_modules_at_load": got["dynatune_modules_at_load"],
        "busy_cores_before": busy,
    }
    if got.get("openvino_ms"):  # OpenVINO / ONNX Runtime, and dynatune / the faster of the two, by round
        fastest = [a / min(b, c) for a, b, c in zip(got["ms"], got["ort_ms"], got["openvino_ms"])]
        out |= {
            "openvino_ms": float(np.median(got["openvino_ms"])),
            "openvino_ms_best": min(got["openvino_ms"]),
            "openvino_vs_onnxruntime": best_ratio(got["openvino_ms"], got["ort_ms"]),
            # the fastest blocks: dynatune's against the faster runtime's; round by round beside it
            "vs_fastest": best_ratio(got["ms"], got["ort_ms"] + got["openvino_ms"]),
            "vs_fastest_min": min(fastest),
            "vs_fastest_max": max(fastest),
        }
    if got.get("unwrapped_ms"):  # pyfunc: its own model called directly, in the same rotation
        out |= {
            "unwrapped_ms": float(np.median(got["unwrapped_ms"])),
            "unwrapped_ms_best": min(got["unwrapped_ms"]),
            "unwrapped_ratio": best_ratio(got["unwrapped_ms"], got["ort_ms"]),
            # what MLflow's PyFuncModel.predict costs: pyfunc's fastest block against the direct call's
            "vs_unwrapped": best_ratio(got["ms"], got["unwrapped_ms"]),
        }
    return out


def measure(work_dir: str, rounds: int, block_ms: float, repeats: int, with_openvino: bool) -> dict:
    """Every way for one run's artifact: the repeated ways (:data:`REPEATED`) ``repeats`` times each,
    interleaved (run's timing, loader, pyfunc, run's timing, ...), the others once; per way each side's
    fastest block among its processes (:func:`one_timing`), with the processes' own ratios' min and max."""

    from dynatune.files import WorkDir
    from dynatune.model.importer import load_model
    from dynatune.run.summary import RunSummary
    from dynatune.runtime import read_metadata

    wd = WorkDir(work_dir)
    summary = RunSummary.load(wd.summary)
    if not summary.artifact or not summary.tuned_model_uri:
        raise SystemExit(
            f"{work_dir}: its summary names no compiled model (its last pass did not compile): "
            "`dynatune compile` it first"
        )
    meta = read_metadata(summary.artifact)
    with open(wd.config) as f:
        config = json.load(f)
    model = load_model(config["model"]["path"], {i["name"]: tuple(i["shape"]) for i in meta["inputs"]})
    row = {
        "work_dir": work_dir,
        "model": summary.model,
        "run_ratio": summary.ratio_vs_onnxruntime,
        "run_ratio_min": summary.ratio_vs_onnxruntime_min,
        "run_ratio_max": summary.ratio_vs_onnxruntime_max,
        "run_under_load": summary.timing_under_load,
        "run_onnxruntime_slow": summary.timing_onnxruntime_slow,
        "ways": {},
    }
    order = [w for _ in range(repeats) for w in REPEATED] + [
        w for w in ONCE if with_openvino or w != OPENVINO_WAY
    ]
    with tempfile.TemporaryDirectory() as tmp:
        spec = {
            "library": summary.artifact,
            "metadata": meta,
            "onnx": pinned_onnx(config, meta, os.path.join(tmp, "model.onnx")),
            "rounds": rounds,
            "block_ms": block_ms,
            "threads": int(meta["thread_pool"]["TVM_NUM_THREADS"]),
            "tracking_uri": summary.mlflow_tracking_uri,
            "model_uri": summary.tuned_model_uri,
        }
        for way in order:
            t = one_timing(way, spec, meta, model)
            for _ in range(SLOW_RETRIES if way == OPENVINO_WAY else 0):
                if not _slow(t, _ort_floor(row)):
                    break
                _record(row, way, t, summary.model)
                t = one_timing(way, spec, meta, model)
            _record(row, way, t, summary.model)
    return summarize_ways(row, summary.ratio_vs_onnxruntime)


def summarize_ways(row: dict, run_ratio: float | None) -> dict:
    """``row`` with each way's figures over its processes, each process marked where ONNX Runtime ran in a
    slow spell (``QuietPolicy.slow_onnxruntime``), and each way held against the run's ratio and the run's
    timing again."""
    from dynatune.compiler.timing import best_ratio

    rerun = None
    floor = _ort_floor(row)
    for way, w in row["ways"].items():
        # as a run reports it: each side's fastest block among all the way's processes; the min-max of
        # the processes' own ratios beside it
        processes = w["processes"]
        for p in processes:
            p["onnxruntime_slow"] = _slow(p, floor)
        fastest = [p["ms_best"] for p in processes], [p["onnxruntime_ms_best"] for p in processes]
        w |= {
            "ratio": best_ratio(*fastest),
            "ratio_min": min(p["ratio"] for p in processes),
            "ratio_max": max(p["ratio"] for p in processes),
            # every process in a slow spell (QuietPolicy.slow_onnxruntime): the ratio flatters dynatune
            "onnxruntime_slow": all(p["onnxruntime_slow"] for p in processes),
        }
        if "unwrapped_ms_best" in processes[0]:  # pyfunc's model called directly, MLflow bypassed
            direct = [p["unwrapped_ms_best"] for p in processes]
            w |= {
                "unwrapped_ratio": best_ratio(direct, fastest[1]),
                "vs_unwrapped": best_ratio(fastest[0], direct),
            }
        if "vs_fastest" in processes[0]:
            # OpenVINO's rotation, over the processes ONNX Runtime ran at speed in
            kept = [p for p in processes if not p["onnxruntime_slow"]] or processes
            runtimes = [min(p["onnxruntime_ms_best"], p["openvino_ms_best"]) for p in kept]
            w |= {
                "vs_fastest": best_ratio([p["ms_best"] for p in kept], runtimes),
                "openvino_vs_onnxruntime": best_ratio(
                    [p["openvino_ms_best"] for p in kept], [p["onnxruntime_ms_best"] for p in kept]
                ),
            }
        if way == RUN_WAY:
            rerun = w["ratio"]
    for w in row["ways"].values():
        w["vs_run"] = w["ratio"] / run_ratio if run_ratio else None
        w["vs_rerun"] = w["ratio"] / rerun if rerun else None
        if "unwrapped_ratio" in w and run_ratio:
            w["unwrapped_vs_run"] = w["unwrapped_ratio"] / run_ratio
    return row


def _ort_floor(row: dict) -> float:
    """ONNX Runtime's fastest block among the row's processes so far (inf before the first)."""
    times = [p["onnxruntime_ms_best"] for w in row["ways"].values() for p in w["processes"]]
    return min(times, default=float("inf"))


def _slow(process: dict, floor: float) -> bool:
    from dynatune.machine.load import QuietPolicy

    return QuietPolicy().slow(process["onnxruntime_ms_best"], floor)


def _record(row: dict, way: str, t: dict, model: str) -> None:
    """One process of ``way`` kept in ``row``, and printed."""
    row["ways"].setdefault(way, {"processes": []})["processes"].append(t)
    print(
        f"{model:28s} {way:28s} ratio {t['ratio']:.3f} "
        f"({t['ratio_min']:.3f}-{t['ratio_max']:.3f}); {t['ms']:.3f} ms vs ONNX Runtime "
        f"{t['onnxruntime_ms']:.3f} ms"
        + (
            f"; OpenVINO / ORT {t['openvino_vs_onnxruntime']:.3f}, dynatune / the faster "
            f"{t['vs_fastest']:.3f}"
            if "vs_fastest" in t
            else ""
        )
        + (
            f"; its model called directly {t['unwrapped_ratio']:.3f} (pyfunc / direct "
            f"{t['vs_unwrapped']:.3f})"
            if "vs_unwrapped" in t
            else ""
        )
        + (f"; {t['threads']} threads; loaded in {t['load_s']:.2f} s" if t["load_s"] is not None else ""),
        flush=True,
    )


def main(argv=None) -> dict:
    ap = parser(__doc__)
    ap.add_argument("work_dirs", nargs="+", help="finished dynatune tune work dirs")
    ap.add_argument("--rounds", type=int, default=15)
    ap.add_argument("--block-ms", type=float, default=200.0)
    ap.add_argument("--openvino", action="store_true", help="time OpenVINO too, in the loader's process")
    ap.add_argument("--repeats", type=int, default=3, help="processes of each repeated way")
    ap.add_argument("--out", default=results_path("deployed_speed.json"))
    args = ap.parse_args(argv)
    import importlib.util

    if args.openvino and importlib.util.find_spec("openvino") is None:
        ap.error("--openvino: OpenVINO is not installed (pip install -c constraints.txt -e '.[bench]')")
    import datetime

    from dynatune.machine.target import cpu_model_and_isa

    cpu, isa = cpu_model_and_isa()
    rows = [
        measure(os.path.abspath(w), args.rounds, args.block_ms, args.repeats, args.openvino)
        for w in args.work_dirs
    ]
    doc = {
        "date": datetime.datetime.now().isoformat(timespec="minutes"),
        "cpu": cpu,
        "isa": isa,
        "rounds": args.rounds,
        "block_ms": args.block_ms,
        "openvino": args.openvino,
        "repeats": args.repeats,
        "rows": rows,
    }
    print(f"wrote {write_json(args.out, doc)}")
    return doc


if __name__ == "__main__":
    main()
