"""The tuned model where its user runs it: each run's artifact loaded in a brand-new Python process that
has imported nothing of dynatune, timed side by side with ONNX Runtime there, against the ratio the run
reported.

    python -m bench.deployed_speed runs/quickstart runs/mnasnet0_5 ... [--openvino] [--rounds 15] \\
        [--block-ms 200]

For each work dir (a finished ``dynatune tune`` run: ``model.so``, its ``model.json``, ``report/summary.json``
and the run's MLflow store), one fresh process per way of loading:

- ``loader``: ``dynatune.runtime.load(model.so).predict(inputs)``, the README's first way;
- ``pyfunc``: ``mlflow.pyfunc.load_model(summary.tuned_model_uri).predict(inputs)``, its second (dynatune is
  not imported at all: the MLflow model brings its own copy of the loader);
- ``plain TVM``: ``tvm.runtime.load_module`` + ``relax.VirtualMachine``, ``vm["main"](*tensors)``, with
  nothing set: what a user who followed the README before it named ``TVM_NUM_THREADS`` got;
- ``plain TVM, TVM_NUM_THREADS``: the same with ``TVM_NUM_THREADS`` set as ``model.json`` says.

Each process times ``predict`` (numpy in, numpy out, as a user calls it) and ONNX Runtime's ``sess.run``
(its defaults, as many intra-op threads as the model was timed with) in alternating blocks, the order
swapped every round, on the same seeded inputs, and prints the per-round ratios. With ``--openvino`` the
loader's process times OpenVINO too (``pip install -c constraints.txt -e '.[bench]'``: the benchmarks'
extra, not the runtime's; asked for, never picked up because it happens to be installed):
``compile_model(onnx, "CPU", PERFORMANCE_HINT=LATENCY, INFERENCE_NUM_THREADS=<threads>,
INFERENCE_PRECISION_HINT=f32)``, an infer request's ``infer(inputs)``, in the same rotation; the row then
gives dynatune against the faster of ONNX Runtime and OpenVINO, round by round (issue #55's target).
Each process starts with no ``TVM_*``, ``OMP_*`` or ``DYNATUNE_*`` variable. The machine's load is probed
before each process (dynatune.machine.load); a busy one is reported, not hidden. Target (issue #54): the
loader's and pyfunc's ratio within 10 % of the run's. Results go to ``bench/results/deployed_speed.json``.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile

from bench.harness import parser, results_path, write_json

WAYS = ("loader", "pyfunc", "plain TVM", "plain TVM, TVM_NUM_THREADS")

# the child: imports numpy, onnxruntime, and what its way of loading needs; nothing of dynatune before it
CHILD = r"""
import json, os, sys, time
spec = json.loads(sys.argv[1])
t0 = time.perf_counter()
import numpy as np
way, meta = spec["way"], spec["metadata"]
if way == "loader":
    from dynatune.runtime import load
    predict = load(spec["library"]).predict
elif way == "pyfunc":
    import mlflow
    mlflow.set_tracking_uri(spec["tracking_uri"])
    predict = mlflow.pyfunc.load_model(spec["model_uri"]).predict
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
sides = [lambda: predict(inputs), lambda: sess.run(None, inputs)]
if spec["openvino"]:
    import openvino as ov
    compiled = ov.Core().compile_model(spec["onnx"], "CPU", {
        "PERFORMANCE_HINT": "LATENCY", "INFERENCE_NUM_THREADS": so.intra_op_num_threads,
        "INFERENCE_PRECISION_HINT": "f32"})
    request = compiled.create_infer_request()
    sides.append(lambda: request.infer(inputs))
for f in sides:
    block(f)
ms = [[] for _ in sides]
for r in range(spec["rounds"]):
    for k in range(len(sides)) if r % 2 == 0 else reversed(range(len(sides))):
        time.sleep(0.05)
        ms[k].append(block(sides[k]))
import tvm
threads = tvm.get_global_func("runtime.NumThreads")()
print(json.dumps({"ms": ms[0], "ort_ms": ms[1], "openvino_ms": ms[2] if spec["openvino"] else None,
                  "load_s": load_s, "threads": threads, "dynatune_modules_at_load": dynatune_modules}))
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


def measure(work_dir: str, rounds: int, block_ms: float, with_openvino: bool) -> dict:
    import numpy as np

    from dynatune.files import WorkDir
    from dynatune.machine.load import probe
    from dynatune.run.summary import RunSummary
    from dynatune.runtime import read_metadata

    wd = WorkDir(work_dir)
    summary = RunSummary.load(wd.summary)
    meta = read_metadata(summary.artifact)
    with open(wd.config) as f:
        config = json.load(f)
    row = {
        "work_dir": work_dir,
        "model": summary.model,
        "run_ratio": summary.ratio_vs_onnxruntime,
        "run_ratio_min": summary.ratio_vs_onnxruntime_min,
        "run_ratio_max": summary.ratio_vs_onnxruntime_max,
        "run_under_load": summary.timing_under_load,
        "ways": {},
    }
    with tempfile.TemporaryDirectory() as tmp:
        onnx_path = pinned_onnx(config, meta, os.path.join(tmp, "model.onnx"))
        for way in WAYS:
            spec = {
                "way": way,
                "library": summary.artifact,
                "metadata": meta,
                "onnx": onnx_path,
                "rounds": rounds,
                "block_ms": block_ms,
                "tracking_uri": summary.mlflow_tracking_uri,
                "model_uri": summary.tuned_model_uri,
                "openvino": with_openvino and way == "loader",
            }
            env = (
                {"TVM_NUM_THREADS": meta["thread_pool"]["TVM_NUM_THREADS"]} if way.endswith("THREADS") else {}
            )
            load = probe(1.0)
            got = run_child(spec, env)
            ratios = [a / b for a, b in zip(got["ms"], got["ort_ms"])]
            median = float(np.median(ratios))
            row["ways"][way] = {
                "ratio": median,
                "ratio_min": min(ratios),
                "ratio_max": max(ratios),
                "ms": float(np.median(got["ms"])),
                "onnxruntime_ms": float(np.median(got["ort_ms"])),
                "vs_run": median / summary.ratio_vs_onnxruntime if summary.ratio_vs_onnxruntime else None,
                "threads": got["threads"],
                "load_s": got["load_s"],
                "dynatune_modules_at_load": got["dynatune_modules_at_load"],
                "busy_cores_before": load.busy_cores,
            }
            w = row["ways"][way]
            if got["openvino_ms"]:  # OpenVINO / ONNX Runtime, and dynatune / the faster of the two
                ov_ratios = [a / b for a, b in zip(got["openvino_ms"], got["ort_ms"])]
                fastest = [a / min(b, c) for a, b, c in zip(got["ms"], got["ort_ms"], got["openvino_ms"])]
                w |= {
                    "openvino_ms": float(np.median(got["openvino_ms"])),
                    "openvino_vs_onnxruntime": float(np.median(ov_ratios)),
                    "vs_fastest": float(np.median(fastest)),
                    "vs_fastest_min": min(fastest),
                    "vs_fastest_max": max(fastest),
                }
                print(
                    f"{'':28s} OpenVINO / ONNX Runtime {w['openvino_vs_onnxruntime']:.3f}; "
                    f"dynatune / the faster {w['vs_fastest']:.3f} ({min(fastest):.3f}-{max(fastest):.3f})",
                    flush=True,
                )
            print(
                f"{summary.model:28s} {way:28s} ratio {median:.3f} ({min(ratios):.3f}-{max(ratios):.3f}) "
                f"run {summary.ratio_vs_onnxruntime:.3f} -> {w['vs_run']:.3f}x; {w['ms']:.3f} ms vs ORT "
                f"{w['onnxruntime_ms']:.3f} ms; {got['threads']} threads; loaded in {got['load_s']:.2f} s",
                flush=True,
            )
    return row


def main(argv=None) -> dict:
    ap = parser(__doc__)
    ap.add_argument("work_dirs", nargs="+", help="finished dynatune tune work dirs")
    ap.add_argument("--rounds", type=int, default=15)
    ap.add_argument("--block-ms", type=float, default=200.0)
    ap.add_argument("--openvino", action="store_true", help="time OpenVINO too, in the loader's process")
    ap.add_argument("--out", default=results_path("deployed_speed.json"))
    args = ap.parse_args(argv)
    import importlib.util

    if args.openvino and importlib.util.find_spec("openvino") is None:
        ap.error("--openvino: OpenVINO is not installed (pip install -c constraints.txt -e '.[bench]')")
    import datetime

    from dynatune.machine.target import cpu_model_and_isa

    cpu, isa = cpu_model_and_isa()
    rows = [measure(os.path.abspath(w), args.rounds, args.block_ms, args.openvino) for w in args.work_dirs]
    doc = {
        "date": datetime.datetime.now().isoformat(timespec="minutes"),
        "cpu": cpu,
        "isa": isa,
        "rounds": args.rounds,
        "block_ms": args.block_ms,
        "openvino": args.openvino,
        "rows": rows,
    }
    print(f"wrote {write_json(args.out, doc)}")
    return doc


if __name__ == "__main__":
    main()
