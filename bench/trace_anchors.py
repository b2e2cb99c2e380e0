"""ONNX Runtime's time per operator for the tasks of a recorded trace document, on the trace machine's
scale: what ``dynatune bench calibration`` gives the headroom beliefs (``headroom+anchors``).

The traces were recorded on another machine (their ``roofline`` and ``target`` say which) with TVM on one
thread. Here ONNX Runtime runs the model on one thread with its profiler (:func:`operator_anchors`), and
every task's untuned latency is measured here with TVM on one thread for the trace's target. The anchors
are scaled by the median ratio of the traces' untuned latencies to this machine's: one factor for the
machine's speed, so a task's anchor keeps its place relative to its recorded curve.

    python -m bench.trace_anchors squeezenet1_1 [--models ../shared/models]
    # writes dynatune/bench/data/anchors/<model>.json

The untuned latencies are measured with the fixed protocol (:data:`bench.harness.PROTOCOLS`), as the
committed traces were.
"""

import os
import statistics
import sys
import tempfile

from bench.harness import ROOT, parser, protocol_sets


def main(argv=None) -> dict:
    ap = parser(__doc__)
    ap.add_argument("model", help="a recorded model's name, or a trace document's path")
    ap.add_argument(
        "--models", default=os.path.join(ROOT, "..", "shared", "models"), help="its ONNX file's folder"
    )
    ap.add_argument("--out-dir", default=None, help="default: dynatune/bench/data/anchors")
    ap.add_argument("--ort-seconds", type=float, default=3.0, help="ONNX Runtime's profiling time")
    args = ap.parse_args(argv)
    # the traces were recorded with TVM on one thread: so are the untuned latencies (the runner's workers,
    # started below, inherit it)
    os.environ["TVM_NUM_THREADS"] = "1"
    from dynatune.bench.traces import ANCHOR_DIR, load_traces, task_traces
    from dynatune.compiler.anchors import operator_anchors
    from dynatune.files import atomic_write_json
    from dynatune.machine.target import describe, machine_fingerprint
    from dynatune.run.config import load_config
    from dynatune.run.pipeline import extract, load_model
    from dynatune.search.session import TuningSession

    doc = load_traces(args.model)
    work = tempfile.mkdtemp(prefix="trace-anchors-")
    cfg = load_config(
        None,
        # the trace machine's target: its untuned latencies are compared with these
        overrides=[
            "library.enabled=false",
            f"target={{kind: llvm, mcpu: {doc['target'].split('/')[1]}}}",
            *_lowering(doc),
            *protocol_sets("fixed"),
        ],
        model=os.path.abspath(os.path.join(args.models, doc["model"] + ".onnx")),
        work_dir=work,
    )
    model = load_model(cfg)
    target, tasks, _ = extract(model, cfg)
    by_name = {r["name"]: r for r in doc["tasks"]}
    missing = [t.name for t in tasks if t.name not in by_name]
    if missing:
        sys.exit(f"the model's tasks are not the traces' ({', '.join(missing[:3])} ...): other lowering?")
    session = TuningSession(tasks, target, work, search=cfg.search, measure=cfg.measure)
    try:
        session.warm_up()
        here = session.measure_defaults()
    finally:
        session.close()
    ratios = []
    for t in tasks:
        recorded = statistics.median(x["default_s"] for x in task_traces(by_name[t.name]))
        if here.get(t.index) and recorded:
            ratios.append(recorded / here[t.index])
    scale = statistics.median(ratios)
    anchors = operator_anchors(model, tasks, threads=1, seconds=args.ort_seconds)
    out = {
        "model": doc["model"],
        "machine": machine_fingerprint(target),
        "target": describe(target),
        "scale": scale,
        "scale_spread": [min(ratios), max(ratios)],
        "anchor_s": {tasks[i].name: s * scale for i, s in anchors.items()},
    }
    out_dir = args.out_dir or ANCHOR_DIR
    os.makedirs(out_dir, exist_ok=True)
    path = os.path.join(out_dir, doc["model"] + ".json")
    atomic_write_json(path, out)
    print(f"{doc['model']}: {len(anchors)} of {len(tasks)} tasks anchored, scale {scale:.2f} -> {path}")
    return out


def _lowering(doc) -> list[str]:
    """``compile.*`` overrides for the lowering the traces were recorded with (fast math came later: a
    document without it was recorded without it)."""
    lowering = {"fast_math": False, **doc.get("lowering", {})}
    return [f"compile.{k}={str(v).lower() if isinstance(v, bool) else v}" for k, v in lowering.items()]


if __name__ == "__main__":
    main()
