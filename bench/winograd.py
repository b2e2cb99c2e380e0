"""Winograd F(4x4, 3x3) vs the direct convolution, for the 3x3 stride-1 convolutions of real models
(issue #27 item 7: MLAS has no fp32 Winograd; can TVM's get past it where the math allows?).

    python bench/winograd.py [--model ../shared/models/squeezenet1_1.onnx ...] [--trials 64] \
        [--per-iter 32] [--rounds 15] [--json bench/results/winograd.json]

For every distinct 3x3, stride-1, ungrouped, undilated convolution of the models (shapes read from the ONNX
files; batch 1; NHWC as dynatune lowers CNNs on a CPU), one process builds, checks and times, interleaved
round by round:

- ``analytic0``/``analytic1``: the direct convolution as dynatune lowers it (its task: conv2d + bias +
  ReLU, OHWI weights, prepacked), scheduled by dynatune's analytic first candidates
  (:mod:`dynatune.search.analytic`);
- ``direct_ms``: the same task after a short MetaSchedule tuning (``--trials``, ``--per-iter``);
- ``winograd_ms``: Winograd F(4x4, 3x3) with pre-transformed weights (``kernel_pack[6, 6, CO, CI]``, computed
  ahead of time in numpy, as a compile-time constant fold would), + bias + ReLU, tuned by the same short
  MetaSchedule budget. Its data-pack and inverse blocks carry TOPI's ``schedule_rule`` attributes, so
  MetaSchedule schedules them with its CPU Winograd rules (``s_tir.meta_schedule.cpu.conv2d_nhwc_winograd_
  data_pack`` / ``_inverse``); the script counts the rules' calls and captures the native log while the
  design space is generated (an ``Unknown schedule rule`` warning would mean they did not fire).

The Winograd compute is TOPI's ``_conv2d_winograd_nhwc_impl`` stage for stage (same blocks, attributes and
transform matrices, from ``topi.nn.winograd_util``), except that the kernel transform is an input: in TVM
0.27 the pre-computed path of that function (``conv2d_winograd_nhwc_without_weight_transform``,
``pre_computed=True``) raises ``LEGACY-FLOW triggered, to be removed``.

Error: the model's real weights and biases, post-ReLU-like random inputs (``relu(N(0, 1))``), several
seeds; each kernel built as it would run in a model (weight layout rewrite included) and compared with a
float64 numpy reference and with the direct kernel, as ``max|a - b| / max|b|`` (the measure
``dynatune.compiler.compile.compare`` uses against ONNX Runtime).

Timing: as tuning times kernels (weights already in their rewritten layout), with TVM's ``time_evaluator``
(each timing >= 50 ms), every variant once per round, ``--rounds`` rounds; medians, and the min/max of the
per-round ratio winograd / best direct variant (the direct variant with the lowest median). The load the
rest of the machine put on the cores is recorded per round (``dynatune.machine.load``).
"""

from __future__ import annotations

import argparse
import collections
import datetime
import glob
import json
import os
import shutil
import statistics
import sys
import tempfile
import time

import numpy as np

import dynatune  # noqa: F401  (before TVM: its thread pool as dynatune runs it, TVM_NUM_THREADS)
from dynatune.model.winograd import RULES as WINOGRAD_RULES
from dynatune.model.winograd import TILE  # F(4x4, 3x3): the output tile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MODELS = sorted(glob.glob(os.path.join(ROOT, "..", "shared", "models", "*.onnx")))


# -- the shapes ----------------------------------------------------------------------------------------------


def conv3x3_shapes(path: str) -> list[dict]:
    """The model's 3x3 stride-1 ungrouped undilated convolutions with symmetric padding, one entry per
    distinct shape (its nodes, its first node's weights and bias)."""
    import onnx
    from onnx import numpy_helper, shape_inference

    model = shape_inference.infer_shapes(onnx.load(path))
    g = model.graph
    shapes = {
        v.name: [d.dim_value for d in v.type.tensor_type.shape.dim]
        for v in list(g.value_info) + list(g.input) + list(g.output)
    }
    inits = {i.name: numpy_helper.to_array(i) for i in g.initializer}
    for node in g.node:  # the exporter aliases equal initializers through Identity nodes
        if node.op_type == "Identity" and node.input[0] in inits:
            inits[node.output[0]] = inits[node.input[0]]
    found: dict[tuple, dict] = {}
    for node in g.node:
        if node.op_type != "Conv" or node.input[1] not in inits:
            continue
        a = {x.name: onnx.helper.get_attribute_value(x) for x in node.attribute}
        w = inits[node.input[1]]
        pads = list(a.get("pads", [0, 0, 0, 0]))
        if (
            w.shape[2:] != (3, 3)
            or list(a.get("strides", [1, 1])) != [1, 1]
            or list(a.get("dilations", [1, 1])) != [1, 1]
            or a.get("group", 1) != 1
            or len(set(pads)) != 1
        ):
            continue
        n, ci, h, wd = shapes[node.input[0]]
        co = w.shape[0]
        bias = inits[node.input[2]] if len(node.input) > 2 else np.zeros(co, np.float32)
        key = (ci, co, h, wd, pads[0])
        if key not in found:
            oh, ow = h + 2 * pads[0] - 2, wd + 2 * pads[0] - 2
            found[key] = {
                "model": os.path.basename(path),
                "ci": ci,
                "co": co,
                "h": h,
                "w": wd,
                "pad": pads[0],
                "batch": n,
                "flops": 2.0 * n * oh * ow * co * ci * 9,
                "nodes": [],
                "weight": w.astype(np.float32),
                "bias": bias.astype(np.float32),
            }
        found[key]["nodes"].append(node.name)
    return list(found.values())


def shape_name(s: dict) -> str:
    return f"{s['ci']}->{s['co']} @{s['h']}x{s['w']} pad{s['pad']}"


def matching_task(tasks, s: dict):
    """dynatune's task for shape ``s``: NHWC data, OHWI weight, NHWC output of the right sizes."""
    from tvm.s_tir.meta_schedule.arg_info import ArgInfo

    oh, ow = s["h"] + 2 * s["pad"] - 2, s["w"] + 2 * s["pad"] - 2
    want = {(1, s["h"], s["w"], s["ci"]), (s["co"], 3, 3, s["ci"]), (1, oh, ow, s["co"])}
    for task in tasks:
        shapes = {tuple(int(d) for d in a.shape) for a in ArgInfo.from_prim_func(task.mod["main"])}
        if want <= shapes and "conv2d" in task.name:
            return task
    return None


# -- Winograd F(4x4, 3x3), weights pre-transformed --------------------------------------------------------


def winograd_module(s: dict):
    """dynatune's Winograd stages (:func:`dynatune.model.winograd.winograd_conv`, TOPI's, tile 4) with
    ``kernel_pack`` an input (layout-free: the tuned kernel may repack it), + bias + ReLU:
    ``main(data[1,H,W,CI], kernel_pack[6,6,CO,CI], bias[1,1,1,CO], out[1,OH,OW,CO])``."""
    import tvm
    from tvm import te

    from dynatune.model.winograd import winograd_conv

    alpha = TILE + 2
    data = te.placeholder((1, s["h"], s["w"], s["ci"]), name="data")
    kernel_pack = te.placeholder((alpha, alpha, s["co"], s["ci"]), name="kernel_pack")
    bias = te.placeholder((1, 1, 1, s["co"]), name="bias")
    conv = winograd_conv(data, kernel_pack, s["pad"])
    out = te.compute(
        conv.shape,
        lambda n, y, x, co: te.max(conv[n, y, x, co] + bias[0, 0, 0, co], tvm.tirx.const(0.0, "float32")),
        name="T_relu",
    )
    func = te.create_prim_func([data, kernel_pack, bias, out])
    return tvm.IRModule(
        {"main": func.with_attr("global_symbol", "main").with_attr("layout_free_buffers", [1])}
    )


def transform_weight(weight_oihw: np.ndarray) -> np.ndarray:
    """``kernel_pack[eps, nu, co, ci] = sum G[eps, kh] G[nu, kw] w[co, ci, kh, kw]`` with TOPI's G (its
    float32 values), accumulated in float64 and rounded once to float32."""
    from tvm.topi.nn.winograd_util import _cook_toom_convolution, _interpolation_points

    _, _, g = _cook_toom_convolution(_interpolation_points(TILE + 3 - 2), TILE, 3)
    g = g.astype(np.float32).astype(np.float64)
    return np.einsum("ek,nl,oikl->enoi", g, g, weight_oihw.astype(np.float64)).astype(np.float32)


class RuleCalls:
    """Counts the calls of MetaSchedule's CPU Winograd rules (each wrapped, then called as before)."""

    def __init__(self):
        import tvm

        self.calls = collections.Counter()
        self.present = {}
        for rule in WINOGRAD_RULES:
            name = f"s_tir.meta_schedule.cpu.{rule}"
            orig = tvm.get_global_func(name, allow_missing=True)
            self.present[name] = orig is not None
            if orig is None:
                continue

            def wrapped(sch, block, orig=orig, name=name):
                self.calls[name] += 1
                return orig(sch, block)

            tvm.register_global_func(name, wrapped, override=True)


def design_space_log(mod, target) -> tuple[int, str]:
    """Generate ``mod``'s design space with the native stderr captured: (spaces, what was logged)."""
    from tvm.s_tir import meta_schedule as ms

    sys.stderr.flush()
    saved = os.dup(2)
    with tempfile.TemporaryFile(mode="w+b") as tmp:
        os.dup2(tmp.fileno(), 2)
        try:
            ctx = ms.TuneContext(mod=mod, target=target, space_generator="post-order-apply", task_name="w")
            spaces = ctx.generate_design_space()
        finally:
            os.dup2(saved, 2)
            os.close(saved)
        tmp.seek(0)
        log = tmp.read().decode(errors="replace")
    return len(spaces), log


# -- build, tune, check --------------------------------------------------------------------------------------


def tune(mod, target, trials: int, per_iter: int, builder) -> tuple[object, float]:
    """The best schedule of a short MetaSchedule tuning of ``mod``, and its wall seconds."""
    from tvm.s_tir import meta_schedule as ms

    work = tempfile.mkdtemp(prefix="winograd-ms-")
    t0 = time.perf_counter()
    try:
        db = ms.tune_tir(
            mod,
            target,
            work,
            max_trials_global=trials,
            num_trials_per_iter=per_iter,
            builder=builder,
            runner="local",
            num_tuning_cores=2,
            seed=0,
        )
        sch = ms.tir_integration.compile_tir(db, mod, target)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return (sch.mod if sch is not None else None), time.perf_counter() - t0


def run_full(mod, target, args: list[np.ndarray]) -> np.ndarray:
    """Run ``mod`` as it would run in a model (its weight layout rewrite inside); the output."""
    import tvm

    lib = tvm.build(mod, target=target)
    dev = tvm.cpu()
    tensors = [tvm.runtime.tensor(a, dev) for a in args]
    lib["main"](*tensors)
    return tensors[-1].numpy()


def reference(x_nhwc: np.ndarray, s: dict) -> np.ndarray:
    """conv + bias + ReLU in float64 numpy (NHWC)."""
    p = s["pad"]
    x = np.pad(x_nhwc.astype(np.float64), ((0, 0), (p, p), (p, p), (0, 0)))
    w = s["weight"].astype(np.float64)
    oh, ow = x.shape[1] - 2, x.shape[2] - 2
    y = np.zeros((1, oh, ow, s["co"]))
    for kh in range(3):
        for kw in range(3):
            y += np.einsum("nhwc,oc->nhwo", x[:, kh : kh + oh, kw : kw + ow, :], w[:, :, kh, kw])
    return np.maximum(y + s["bias"].astype(np.float64), 0.0)


def rel_err(got: np.ndarray, want: np.ndarray) -> float:
    from dynatune.compiler.compile import compare

    return float(compare([got], [want]).max_rel_err)


# -- main ----------------------------------------------------------------------------------------------------


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", action="append", help="ONNX model (default: ../shared/models/*.onnx)")
    ap.add_argument("--trials", type=int, default=64, help="MetaSchedule trials per tuned variant")
    ap.add_argument("--per-iter", type=int, default=32, help="MetaSchedule trials per iteration")
    ap.add_argument("--rounds", type=int, default=15)
    ap.add_argument("--seeds", type=int, default=3, help="random inputs for the error")
    ap.add_argument("--max-shapes", type=int, default=0, help="only the first N shapes (0: all)")
    ap.add_argument("--json", default=os.path.join(ROOT, "bench", "results", "winograd.json"))
    args = ap.parse_args()
    started = time.perf_counter()

    import tvm
    from kernels import tvm_timer  # bench/kernels.py: a kernel timed as tuning times it, >= 50 ms a timing
    from tvm.s_tir import meta_schedule as ms

    from dynatune.machine.load import LoadProbe, QuietPolicy, quiet_or_wait
    from dynatune.machine.target import cpu_model_and_isa, make_target, usable_cores
    from dynatune.machine.vector import vector_unit
    from dynatune.model.extract import extract_tasks
    from dynatune.model.importer import load_model
    from dynatune.search.analytic import analytic_candidates
    from dynatune.search.builder import PersistentBuilder

    target, cores = make_target(), usable_cores()
    unit = vector_unit(target)
    cpu, isa_flags = cpu_model_and_isa()
    isa = "avx512f" if "avx512f" in isa_flags else "avx2" if "avx2" in isa_flags else "other"
    print(f"target {target}; {cpu} ({isa}); TVM_NUM_THREADS={os.environ.get('TVM_NUM_THREADS')}", flush=True)
    rules = RuleCalls()
    builder = PersistentBuilder(max_workers=cores, batched=False)  # MetaSchedule's runner: one library each

    shapes, model_flops, notes = [], {}, []
    for path in args.model or MODELS:
        found = conv3x3_shapes(path)
        if not found:
            notes.append(f"{os.path.basename(path)}: no 3x3 stride-1 ungrouped convolution")
            continue
        tasks = extract_tasks(load_model(path), target)
        model_flops[os.path.basename(path)] = sum(t.weight * t.flops for t in tasks)
        for s in found:
            s["task"] = matching_task(tasks, s)
            if s["task"] is None:
                notes.append(f"{s['model']} {shape_name(s)}: no dynatune task found")
                continue
            s["weight_count"] = s["task"].weight
            shapes.append(s)
    if args.max_shapes:
        shapes = shapes[: args.max_shapes]

    rows, timers = [], {}
    for s in shapes:
        name, task = shape_name(s), s["task"]
        print(f"\n== {s['model']} {name}: task {task.name} x{task.weight}", flush=True)
        row = {
            "model": s["model"],
            "shape": name,
            "nodes": s["nodes"],
            "task": task.name,
            "weight": task.weight,
            "mflop": s["flops"] / 1e6,
            "model_flop_share": s["flops"] * len(s["nodes"]) / model_flops[s["model"]],
        }
        variants = {}
        ctx = ms.TuneContext(mod=task.mod, target=target, space_generator="post-order-apply")
        spaces, postprocs = ctx.generate_design_space(), ctx.space_generator.postprocs
        for k, c in enumerate(analytic_candidates(task.mod, spaces, postprocs, unit, cores)):
            variants[f"analytic{k}"] = c.sch.mod
        direct, row["tune_s_direct"] = tune(task.mod, target, args.trials, args.per_iter, builder)
        if direct is not None:
            variants["direct_ms"] = direct
        wmod = winograd_module(s)
        before = dict(rules.calls)
        n_spaces, log = design_space_log(wmod, target)
        row["winograd_rules"] = {
            "design_spaces": n_spaces,
            "rule_calls": {k: rules.calls[k] - before.get(k, 0) for k in rules.calls},
            "unknown_rule_warning": "Unknown schedule rule" in log,
            "native_log": log.strip()[-2000:],
        }
        print(
            f"   winograd rules: {row['winograd_rules']['rule_calls']}, unknown-rule warning: "
            f"{row['winograd_rules']['unknown_rule_warning']}",
            flush=True,
        )
        wino, row["tune_s_winograd"] = tune(wmod, target, args.trials, args.per_iter, builder)
        if wino is not None:
            variants["winograd_ms"] = wino

        # error: real weights, post-ReLU-like inputs, kernels as they run in a model
        w_ohwi = np.ascontiguousarray(s["weight"].transpose(0, 2, 3, 1))
        kpack = transform_weight(s["weight"])
        errs = collections.defaultdict(list)
        oh, ow = s["h"] + 2 * s["pad"] - 2, s["w"] + 2 * s["pad"] - 2
        for seed in range(args.seeds):
            x = np.maximum(np.random.default_rng(seed).standard_normal((1, s["h"], s["w"], s["ci"])), 0)
            x = x.astype(np.float32)
            ref = reference(x, s)
            outs = {}
            for vname, vmod in variants.items():
                out = np.zeros((1, oh, ow, s["co"]), np.float32)
                if vname.startswith("winograd"):
                    fargs = [x, kpack, s["bias"].reshape(1, 1, 1, -1), out]
                else:
                    fargs = _direct_args(vmod, x, w_ohwi, s["bias"], out)
                outs[vname] = run_full(vmod, target, fargs)
                errs[f"{vname}_vs_f64"].append(rel_err(outs[vname], ref))
            direct_out = outs.get("analytic0", outs.get("direct_ms"))
            if "winograd_ms" in outs and direct_out is not None:
                errs["winograd_vs_direct"].append(rel_err(outs["winograd_ms"], direct_out.astype(np.float64)))
        row["max_rel_err"] = {k: max(v) for k, v in errs.items()}
        print(f"   errors: { {k: f'{v:.2e}' for k, v in row['max_rel_err'].items()} }", flush=True)
        timers[name] = {vname: tvm_timer(vmod, target)[0] for vname, vmod in variants.items()}
        rows.append(row)
    builder.close()

    # timing: every variant of every shape once per round, after waiting (a little) for a quiet machine;
    # the load besides the timing is recorded per round
    before_timing = quiet_or_wait(cores, QuietPolicy())
    times = {name: collections.defaultdict(list) for name in timers}
    round_loads = []
    for _ in range(args.rounds):
        probe = LoadProbe()
        for name, ts in timers.items():
            for vname, once in ts.items():
                times[name][vname].append(once())
        round_loads.append(round(probe.stop().busy_cores, 2))
    print(f"load before timing: {before_timing.describe()}; busy cores per round: {round_loads}")
    for row in rows:
        t = times[row["shape"]]
        med = {v: statistics.median(xs) * 1e3 for v, xs in t.items()}
        row["ms"] = {v: round(x, 4) for v, x in med.items()}
        # direct-equivalent GFLOP/s (the direct convolution's FLOPs over the time): MFLOP / ms = GFLOP/s
        row["gflops"] = {v: round(row["mflop"] / x, 1) for v, x in med.items()}
        row["per_round_ms"] = {v: [round(x * 1e3, 4) for x in xs] for v, xs in t.items()}
        directs = [v for v in med if not v.startswith("winograd")]
        best = min(directs, key=med.get) if directs else None
        row["best_direct"] = best
        if best and "winograd_ms" in t:
            ratios = [w / d for w, d in zip(t["winograd_ms"], t[best])]
            row["winograd_over_direct"] = {
                "median": round(statistics.median(ratios), 3),
                "min": round(min(ratios), 3),
                "max": round(max(ratios), 3),
            }
        row["winograd_faster_by_10pct"] = bool(
            row.get("winograd_over_direct") and row["winograd_over_direct"]["max"] < 1 / 1.1
        )

    print(
        "\nshape                      MFLOP  share  direct(best) ms  winograd ms  ratio [min,max]  "
        "rel err wino/direct  wino/f64"
    )
    for row in rows:
        r = row.get("winograd_over_direct", {})
        e = row["max_rel_err"]
        print(
            f"{row['shape']:<26} {row['mflop']:6.1f} {row['model_flop_share']:5.1%} "
            f"{row['ms'].get(row['best_direct'], float('nan')):8.4f} ({row['best_direct']})  "
            f"{row['ms'].get('winograd_ms', float('nan')):8.4f}   {r.get('median', float('nan')):.3f} "
            f"[{r.get('min', float('nan')):.3f}, {r.get('max', float('nan')):.3f}]  "
            f"{e.get('winograd_vs_direct', float('nan')):.2e}  "
            f"{e.get('winograd_ms_vs_f64', float('nan')):.2e}"
        )

    out = {
        "date": datetime.datetime.now().astimezone().isoformat(timespec="seconds"),
        "cpu": cpu,
        "isa": isa,
        "command": "python " + " ".join([os.path.relpath(sys.argv[0], ROOT)] + sys.argv[1:]),
        "target": str(target),
        "tvm": tvm.__version__,
        "threads": os.environ.get("TVM_NUM_THREADS"),
        "settings": {
            "trials": args.trials,
            "per_iter": args.per_iter,
            "rounds": args.rounds,
            "seeds": args.seeds,
            "tile": f"F({TILE}x{TILE},3x3)",
            "min_timing_ms": 50,
        },
        "winograd_rules_registered": rules.present,
        "winograd_rule_calls_total": dict(rules.calls),
        "model_flops": model_flops,
        "load_before_timing": before_timing.as_dict(),
        "busy_cores_per_round": round_loads,
        "notes": notes,
        "wall_s": round(time.perf_counter() - started, 1),
        "rows": rows,
    }
    os.makedirs(os.path.dirname(os.path.abspath(args.json)), exist_ok=True)
    with open(args.json, "w") as f:
        json.dump(out, f, indent=1)
    print(f"\nwrote {args.json} ({out['wall_s']:.0f} s)")


def _direct_args(mod, x, w_ohwi, bias, out) -> list[np.ndarray]:
    """The direct task's arguments in its order, by shape: data, OHWI weight, bias, output."""
    from tvm.s_tir.meta_schedule.arg_info import ArgInfo

    infos = ArgInfo.from_prim_func(mod["main"])
    fargs = []
    for k, a in enumerate(infos):
        shape = tuple(int(d) for d in a.shape)
        if k == len(infos) - 1:
            fargs.append(out)
        elif shape == x.shape:
            fargs.append(x)
        elif shape == w_ohwi.shape:
            fargs.append(w_ohwi)
        elif int(np.prod(shape)) == bias.size:
            fargs.append(bias.reshape(shape))
        else:
            raise ValueError(f"unexpected argument {k} of shape {shape}")
    return fargs


if __name__ == "__main__":
    main()
