"""Where the compiled model's time goes: every VM call timed inside the model, beside its task alone.

TVM 0.27's Relax VM has no profiler (``VirtualMachine(..., profile=True)`` and ``vm.profile`` are gone);
it has ``set_instrument``: a function called before and after every VM ``call`` instruction with the
callee's symbol. The symbols of the model's kernels are the names of the fused PrimFuncs, the same names
:func:`dynatune.model.extract.extract_tasks` gives the tasks (both come from
:func:`dynatune.model.extract.fuse`; FuseTIR merges identical functions, so a task with weight w is one symbol
called w times). Other calls are ``vm.builtin.*`` (allocation, reshape views, shape checks) or kernels no task
stands for.

Kernels (calls that return nothing: destination-passing PrimFuncs, not ``vm.builtin.*``) are timed
by the instrument itself: it calls the kernel with the VM's arguments and tells the VM to skip the call
(``SKIP_RUN``), so the timing holds only the kernel and one FFI call from Python (~0.5 us). Other calls
are timed from the end of the ``before`` callback to the start of the ``after`` one, minus the window of
``vm.builtin.null_value`` (which does nothing); that still counts the conversion of their arguments to
Python objects, so their time is an upper bound. The model is also timed without the instrument, and
each task's best schedule is re-timed alone, in the same rounds (so all three see the same machine).
The model is timed as the compile report times it: the mean over a block of runs, and here the median
over rounds. A task alone is timed twice: warm, as tuning times it (a block of runs on data in cache:
what its % of the peak reads), and cold, as the model runs it (single runs, every argument but the
input flushed from the caches before each: what the estimate adds up; issue #55). A call's time in the
model is the median over runs of its total per run: robust to the interruptions a shared machine
brings (a mean would charge a whole time slice to whichever call was running); those interruptions land
in the time between calls.

The model time splits exactly into: kernels of tasks + calls no task stands for + time between calls
(the remainder); and its gap to the estimate (sum of weight x latency alone, cold) into: kernels slower
or faster in the model than alone, tasks the model never calls, calls no task stands for, and time
between calls.
"""

from __future__ import annotations

import json
import os
import re
import time
from collections import defaultdict
from dataclasses import asdict, dataclass, field

import numpy as np

from dynatune.compiler.residual import TaskTimers, kernels_alone_ms
from dynatune.compiler.timing import set_entry_input, vm_block_timer, vm_run_timer
from dynatune.machine.load import LoadProbe, QuietPolicy, quiet_or_wait
from dynatune.machine.roofline import Roofline, compulsory_bytes
from dynatune.model.placement import PLACED

NOOP_CALL = "vm.builtin.null_value"


@dataclass
class KernelRow:
    """One VM callee: per model run, its calls and time inside the model; its task's latency alone."""

    name: str
    task: int | None
    calls: int
    in_model_ms: float
    weight: int | None = None
    alone_ms: float | None = None  # one call of the task's best schedule, alone, warm (as tuning times it)
    flops: float | None = None  # per call
    onnxruntime_op_ms: float | None = None  # ONNX Runtime's kernel for the same operator, in its model
    bytes: float | None = None  # per call: its compulsory traffic (each argument once)
    roofline: Roofline | None = field(default=None, repr=False)  # this machine's, for "% of peak/roof"
    cold_ms: float | None = None  # one call alone, cold: its arguments but the input flushed from the caches

    @property
    def alone_total_ms(self) -> float | None:
        return None if self.alone_ms is None else self.alone_ms * self.weight

    @property
    def cold_total_ms(self) -> float | None:
        """What the estimate counts for it: weight x its time alone, cold."""
        return None if self.cold_ms is None else self.cold_ms * self.weight

    def as_dict(self) -> dict:
        d, roof = asdict(self), self.roofline
        del d["roofline"]
        d["alone_total_ms"] = self.alone_total_ms
        d["cold_total_ms"] = self.cold_total_ms
        d["gflops_in_model"] = _gflops(self.flops, self.in_model_ms / max(self.calls, 1))
        d["gflops_alone"] = _gflops(self.flops, self.alone_ms)
        # a task with no reduction has no FLOPs (dynatune.model.flops): its roof is its bytes
        flops, nbytes = self.flops or 0.0, self.bytes or 0.0
        known = bool(roof and (flops or nbytes) and self.alone_ms)
        d["peak_flops"] = roof.peak_flops if roof else None
        d["pct_of_peak_alone"] = 100 * d["gflops_alone"] * 1e9 / roof.peak_flops if known and flops else None
        # memory-bound kernels are judged against the bandwidth roof, compute-bound ones against the peak
        d["bound_by"] = roof.limit(flops, nbytes) if known else None
        share = roof.share_of_roof(flops, nbytes, self.alone_ms * 1e-3) if known else None
        d["pct_of_roof_alone"] = None if share is None else 100 * share
        d["alone_vs_onnxruntime_op"] = (
            self.alone_ms / self.onnxruntime_op_ms if self.alone_ms and self.onnxruntime_op_ms else None
        )
        return d


class CallRecorder:
    """VM instrument: appends (symbol, seconds) for every call instruction of the runs it watches.

    Symbols in ``kernels`` are called (and timed) here and skipped by the VM; the others are timed
    between the two callbacks. Symbols seen returning nothing (outside ``vm.builtin.*``) are collected
    in ``void_calls``: the kernels, for the next runs."""

    def __init__(self, device):
        from tvm.runtime.vm import VMInstrumentReturnKind

        self._no_op, self._skip = int(VMInstrumentReturnKind.NO_OP), int(VMInstrumentReturnKind.SKIP_RUN)
        self.calls: list[tuple[str, float]] = []
        self.kernels: set[str] = set()
        self.void_calls: set[str] = set()
        self._starts: list[float] = []
        self._sync = device.sync if device.dlpack_device_type() != 1 else lambda: None  # 1: kDLCPU

    def __call__(self, func, symbol, before, ret, *args):
        self._sync()
        if before and symbol in self.kernels:
            t0 = time.perf_counter()
            func(*args)
            self._sync()
            self.calls.append((symbol, time.perf_counter() - t0))
            return self._skip
        if before:
            self._starts.append(time.perf_counter())
        else:
            self.calls.append((symbol, time.perf_counter() - self._starts.pop()))
            if ret is None and not symbol.startswith("vm.builtin."):
                self.void_calls.add(symbol)
        return self._no_op


def make_vm(executable_or_path, device):
    """A Relax VM of an exported library (path) or of an executable in memory."""
    import tvm
    from tvm import relax

    mod = (
        tvm.runtime.load_module(executable_or_path)
        if isinstance(executable_or_path, str)
        else executable_or_path
    )
    return relax.VirtualMachine(mod, device)


def profile_calls(
    vm, model, inputs, device, block_ms: float, min_runs: int = 3
) -> tuple[list[dict], set[str]]:
    """Run the model under the instrument for about ``block_ms``; per run, {symbol: [calls, seconds]},
    and the symbols timed as kernels."""
    entry = set_entry_input(vm, {i.name: inputs[i.name] for i in model.inputs}, device)
    rec = CallRecorder(device)
    vm.set_instrument(rec)
    vm.invoke_stateful(entry)  # warm-up, which also finds the kernels
    rec.kernels = set(rec.void_calls)
    runs, t0 = [], time.perf_counter()
    while len(runs) < min_runs or (time.perf_counter() - t0) * 1e3 < block_ms:
        rec.calls.clear()
        vm.invoke_stateful(entry)
        per = defaultdict(lambda: [0, 0.0])
        for sym, secs in rec.calls:
            per[sym][0] += 1
            per[sym][1] += secs
        runs.append(dict(per))
    return runs, rec.kernels


def instrument_overhead_s(runs: list[dict]) -> float:
    """The instrument's cost per call: the median window of a call that does nothing (0 if none)."""
    per_call = [r[NOOP_CALL][1] / r[NOOP_CALL][0] for r in runs if NOOP_CALL in r]
    return float(np.median(per_call)) if per_call else 0.0


def profile_model(
    executable_or_path,
    model,
    session,
    *,
    rounds: int = 3,
    block_ms: float = 200.0,
    task_block_ms: float = 20.0,
    seed: int = 0,
    quiet: QuietPolicy = QuietPolicy(),
    roofline: Roofline | None = None,
    fastest_model_ms: float | None = None,
    dispatch=None,
) -> dict:
    """The profile as a dict (see :func:`write_profile`). It waits for a quiet machine first (bounded by
    ``quiet``); ``load_cores`` is the load on the cores while it ran, ``under_load`` when that was busy.
    ONNX Runtime runs the model with its profiler in the same rounds: each task's kernel is compared with
    ONNX Runtime's for the same operator (:mod:`dynatune.compiler.anchors`).

    ``fastest_model_ms``: the same model's fastest block in the final timing (fresh processes, just before).
    While the profile's model is over ``quiet.slow_profile`` times it (:meth:`QuietPolicy.profile_slow`), the
    profile is taken again ``quiet.wait_s`` later, ``quiet.attempts`` times at most, and the one with the
    fastest model kept: ``attempts``; ``slow_spell`` when even that one was slow.

    ``dispatch``: the model with its kernels emptied (:mod:`dynatune.compiler.dispatch`), timed in the same
    rounds: ``dispatch_ms``, what its calls cost a run without the kernels' work."""
    import tvm

    from dynatune.compiler.anchors import OnnxRuntimeProfile
    from dynatune.machine.target import target_device, usable_cores

    dev = tvm.device(target_device(session.target), 0)
    inputs = model.random_inputs(seed)
    plain, instrumented = make_vm(executable_or_path, dev), make_vm(executable_or_path, dev)
    kernels_alone = TaskTimers(session.target, dev, task_block_ms).kernels(
        session.tasks, session.compile_database()
    )
    onnxruntime = OnnxRuntimeProfile(model, usable_cores(), block_ms)
    empty = make_vm(dispatch, dev) if dispatch is not None else None

    def take() -> dict:  # one attempt's rounds, summarized once the attempt to keep is known
        model_block = vm_block_timer(plain, inputs, dev, block_ms)
        model_runs = vm_run_timer(plain, inputs, dev, block_ms)
        dispatch_block = vm_block_timer(empty, inputs, dev, block_ms) if empty is not None else None
        model_ms, run_ms, runs, alone, cold = [], [], [], defaultdict(list), defaultdict(list)
        dispatch_ms = []
        quiet_or_wait(usable_cores(), quiet)
        load = LoadProbe()
        for _ in range(rounds):  # the model, its calls and the tasks alone, all in each round
            model_ms.append(model_block())
            run_ms += model_runs()
            dispatch_ms += [dispatch_block()] if dispatch_block else []
            new_runs, kernels = profile_calls(instrumented, model, inputs, dev, block_ms)
            runs += new_runs
            for i, k in kernels_alone.items():
                alone[i].append(k.warm())
                cold[i].append(k.cold())
            onnxruntime.run_block()
        during = load.stop()
        return dict(
            model_ms=model_ms,
            runs=runs,
            kernels=kernels,
            alone_ms={i: float(np.median(v)) for i, v in alone.items()},
            cold_ms={i: float(np.median(v)) for i, v in cold.items()},
            run_ms=run_ms,
            dispatch_ms=dispatch_ms,
            during=during,
        )

    def model_of(taken: dict) -> float:
        return float(np.median(taken["model_ms"]))

    kept = None
    for attempt in range(1, max(1, quiet.attempts) + 1):
        if kept is not None:
            time.sleep(quiet.wait_s)  # a slow spell: give it time to pass
        taken = take()
        if kept is None or model_of(taken) < model_of(kept):
            kept = taken
        if not quiet.profile_slow(model_of(kept), fastest_model_ms):
            break
    during = kept.pop("during")
    # ONNX Runtime's ops: from every attempt's blocks (its profiler is read once)
    prof = summarize(
        session=session, onnxruntime_op_ms=onnxruntime.op_ms(session.tasks), roofline=roofline, **kept
    )
    return prof | {
        "load_cores": during.busy_cores,
        "under_load": quiet.busy(during, usable_cores()),
        "attempts": attempt,
        "fastest_model_ms": fastest_model_ms,
        "slow_spell": quiet.profile_slow(prof["model_ms"], fastest_model_ms),
    }


PREPACKED = "_prepacked"  # the suffix SplitLayoutRewritePreproc gives a kernel that reads packed weights


def kernel_task_name(symbol: str) -> str:
    """The name of the task a compiled kernel comes from: its symbol less the suffixes of prepacking and of
    a placed concatenation's producer (:mod:`dynatune.model.placement`)."""
    return re.sub(f"{PLACED}\\d*$", "", symbol).removesuffix(PREPACKED)


def summarize(
    model_ms: list[float],
    runs: list[dict],
    kernels: set[str],
    alone_ms: dict[int, float],
    cold_ms: dict[int, float],
    session,
    onnxruntime_op_ms: dict[int, float] | None = None,
    roofline: Roofline | None = None,
    run_ms: list[float] | None = None,
    dispatch_ms: list[float] | None = None,
) -> dict:
    """Split the model time into kernels, calls no task stands for and time between calls; and its gap
    to the estimate (sum of weight x latency alone, cold: ``cold_ms``) into what causes it.

    ``model_ms`` are blocks' means, which take in the interruptions a shared machine brings; the calls'
    times are medians over runs, which do not. ``run_ms`` (single runs of the model, uninstrumented) gives
    the like-for-like split: a run's median less the calls' medians is ``between_calls_run_ms``.
    ``dispatch_ms`` (blocks of runs of the model with its kernels emptied, :mod:`dynatune.compiler.dispatch`)
    gives what the calls themselves cost a run, measured: ``dispatch_ms`` (their median)."""
    overhead = instrument_overhead_s(runs)
    by_name = {t.name: t for t in session.tasks}
    rows = []
    for sym in sorted({s for r in runs for s in r}):
        calls = int(np.median([r.get(sym, [0, 0.0])[0] for r in runs]))
        cost = 0.0 if sym in kernels else overhead
        secs = float(np.median([max(0.0, r[sym][1] - r[sym][0] * cost) if sym in r else 0.0 for r in runs]))
        t = by_name.get(sym) or by_name.get(kernel_task_name(sym))  # tuned on packed weights, or placed
        rows.append(
            KernelRow(
                sym,
                t.index if t else None,
                calls,
                secs * 1e3,
                t.weight if t else None,
                alone_ms.get(t.index) if t else None,
                t.flops if t else None,
                (onnxruntime_op_ms or {}).get(t.index) if t else None,
                compulsory_bytes(t.mod) if t else None,
                roofline,
                cold_ms.get(t.index) if t else None,
            )
        )
    rows.sort(key=lambda r: -r.in_model_ms)
    model = float(np.median(model_ms))
    run_model = float(np.median(run_ms)) if run_ms else None
    called = {r.task for r in rows if r.task is not None}
    absent = [t for t in session.tasks if t.index not in called]
    matched = [r for r in rows if r.task is not None]
    kernel_ms = sum(r.in_model_ms for r in matched)
    unmatched_ms = sum(r.in_model_ms for r in rows if r.task is None)
    estimate = kernels_alone_ms(session.tasks, cold_ms)
    gap = {
        "in_model_vs_alone_ms": sum(r.in_model_ms - r.cold_total_ms for r in matched),
        "tasks_not_called_ms": -kernels_alone_ms(absent, cold_ms),
        "calls_without_task_ms": unmatched_ms,
        "between_calls_ms": model - kernel_ms - unmatched_ms,
    }
    return {
        "model_ms": model,
        "model_ms_rounds": model_ms,
        "runs": len(runs),
        "instrument_overhead_us": overhead * 1e6,
        "kernels_timed_by_call": sorted(kernels),
        "kernel_ms": kernel_ms,
        "calls_without_task_ms": unmatched_ms,
        "between_calls_ms": gap["between_calls_ms"],
        "model_run_ms": run_model,
        "between_calls_run_ms": None if run_model is None else run_model - kernel_ms - unmatched_ms,
        "dispatch_ms": float(np.median(dispatch_ms)) if dispatch_ms else None,
        "estimate_ms": estimate,
        "estimate_over_model": estimate / model if model > 0 else None,
        "warm_estimate_ms": kernels_alone_ms(session.tasks, alone_ms),  # the kernels as tuning times them
        "session_estimate_ms": session.estimated_latency() * 1e3,
        "gap_ms": model - estimate,
        "gap": gap,  # the parts of gap sum to model_ms - estimate_ms
        "kernels": [r.as_dict() for r in rows],
        "tasks_not_called": [
            {
                "task": t.index,
                "name": t.name,
                "weight": t.weight,
                "alone_ms": alone_ms[t.index],
                "cold_ms": cold_ms[t.index],
            }
            for t in absent
        ],
    }


def write_profile(
    executable_or_path,
    model,
    session,
    out_dir: str,
    *,
    rounds: int = 3,
    block_ms: float = 200.0,
    task_block_ms: float = 20.0,
    top: int = 25,
    quiet: QuietPolicy = QuietPolicy(),
    roofline: Roofline | None = None,
    fastest_model_ms: float | None = None,
    dispatch=None,
) -> dict:
    """Profile the compiled model (an exported library's path, or the executable) and write
    ``profile.json`` and ``profile.md`` into ``out_dir``; returns the profile. ``fastest_model_ms`` and
    ``dispatch``: see :func:`profile_model`."""
    prof = profile_model(
        executable_or_path,
        model,
        session,
        rounds=rounds,
        block_ms=block_ms,
        task_block_ms=task_block_ms,
        quiet=quiet,
        roofline=roofline,
        fastest_model_ms=fastest_model_ms,
        dispatch=dispatch,
    )
    os.makedirs(out_dir, exist_ok=True)
    with open(os.path.join(out_dir, "profile.json"), "w") as f:
        json.dump(prof, f, indent=1)
    with open(os.path.join(out_dir, "profile.md"), "w") as f:
        f.write(markdown(prof, top))
    return prof


def markdown(prof: dict, top: int = 25) -> str:
    model = prof["model_ms"]
    g = prof["gap"]
    lines = [
        "# Where the time goes",
        "",
        f"Model {model:.3f} ms (median of {len(prof['model_ms_rounds'])} rounds, no instrument); estimate "
        f"(sum of weight x task alone, cold: its weights flushed from the caches, as the model runs it; "
        f"re-timed in the same rounds) {prof['estimate_ms']:.3f} ms = "
        f"{_pct(prof['estimate_ms'], model)} of the model. The same kernels warm (looped on data in cache, "
        f"as tuning times them): {prof['warm_estimate_ms']:.3f} ms; the session's estimate "
        f"{prof['session_estimate_ms']:.3f} ms.",
        "",
        "| model time | ms | share |",
        "|---|---:|---:|",
        f"| kernels of tasks | {prof['kernel_ms']:.3f} | {_pct(prof['kernel_ms'], model)} |",
        f"| calls no task stands for | {prof['calls_without_task_ms']:.3f} | "
        f"{_pct(prof['calls_without_task_ms'], model)} |",
        f"| between calls | {prof['between_calls_ms']:.3f} | {_pct(prof['between_calls_ms'], model)} |",
        *_run_split_lines(prof),
        *_dispatch_lines(prof),
        "",
        "| model - estimate | ms |",
        "|---|---:|",
        f"| kernels in the model vs alone, cold | {g['in_model_vs_alone_ms']:+.3f} |",
        f"| tasks the model never calls | {g['tasks_not_called_ms']:+.3f} |",
        f"| calls no task stands for | {g['calls_without_task_ms']:+.3f} |",
        f"| between calls | {g['between_calls_ms']:+.3f} |",
        f"| total | {prof['gap_ms']:+.3f} |",
        "",
        f"{prof['runs']} instrumented runs. Kernels are timed by calling them from the instrument; other "
        f"calls between its callbacks, less {prof['instrument_overhead_us']:.2f} us (a no-op call's window), "
        "which leaves their arguments' conversion in: an upper bound. The peak is the rate at which the "
        "cores issue vector FMAs (a register-only FMA loop), which no kernel's FLOPs pass: its reductions' "
        "(a convolution's multiply-adds, a mean's sums; not an activation's ops). A kernel's roof "
        "is the least time its FLOPs take at the peak or its bytes (each argument once) at the memory "
        "bandwidth, whichever is longer (compute- or memory-bound); a memory-bound kernel whose data "
        "stays in the caches passes it.",
        "",
        "| kernel | task | calls | in model ms | share | alone ms x weight | cold ms x weight "
        "| in model / cold | GFLOP/s in model | % of peak alone | % of roof alone (bound by) "
        "| ONNX Runtime op ms | alone / ONNX Runtime op |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    lines += [_kernel_line(k, model) for k in prof["kernels"][:top]]
    if len(prof["kernels"]) > top:
        lines.append(f"\n{len(prof['kernels']) - top} more calls in profile.json.")
    if prof.get("under_load"):
        lines += ["", f"Taken under load: other work took {prof['load_cores']:.2f} cores while profiling."]
    lines += _slow_spell_lines(prof)
    if prof["tasks_not_called"]:
        never = [f"{t['name']} ({t['weight']} x {t['cold_ms']:.4f} ms)" for t in prof["tasks_not_called"]]
        lines += ["", "Tasks the model never calls (in the estimate only): " + ", ".join(never)]
    return "\n".join(lines) + "\n"


def _slow_spell_lines(prof: dict) -> list[str]:
    """What the profile's check for a slow spell found: nothing to say when its first attempt was not slow."""
    fastest, attempts = prof.get("fastest_model_ms"), prof.get("attempts", 1)
    if not fastest or (attempts == 1 and not prof.get("slow_spell")):
        return []
    ratio = prof["model_ms"] / fastest
    if prof.get("slow_spell"):
        return [
            "",
            f"Taken in a slow spell: in each of {attempts} attempts the model ran over the final timing's "
            f"fastest block ({fastest:.3f} ms; this one {ratio:.2f}x), which the load probe does not see. "
            "Kernels in the model slow down more than alone in such a spell: the split and the gap to the "
            "estimate above are not the quiet machine's.",
        ]
    return [
        "",
        f"Taken {attempts} times: the model ran slow against the final timing's fastest block ({fastest:.3f} "
        f"ms) before; this one is {ratio:.2f}x it.",
    ]


def _dispatch_lines(prof: dict) -> list[str]:
    """What the calls cost a run, measured with the kernels emptied (profiles without it: nothing)."""
    dispatch = prof.get("dispatch_ms")
    if dispatch is None:
        return []
    # against a single run's median where the profile has it (like for like), else the blocks' mean
    run = prof.get("model_run_ms")
    model, between = (
        (run, prof["between_calls_run_ms"]) if run else (prof["model_ms"], prof["between_calls_ms"])
    )
    rest = between + prof["calls_without_task_ms"] - dispatch
    return [
        "",
        f"The model with every kernel emptied, the same calls (`dispatch_ms`: the VM's instructions, each "
        f"call's argument checks, the builtins): {dispatch:.4f} ms a run = {_pct(dispatch, model)} of the "
        f"model. The rest of the time between calls and in calls no task stands for, {rest:+.3f} ms "
        f"({_pct(rest, model)}{' of a single run' if run else ''}), is the kernels running slower back to "
        "back than one by one from the instrument, and a shared machine's noise.",
    ]


def _run_split_lines(prof: dict) -> list[str]:
    """The like-for-like split: a single run's median, against the calls' medians (profiles before it have
    none)."""
    run = prof.get("model_run_ms")
    if run is None:
        return []
    between = prof["between_calls_run_ms"]
    return [
        "",
        f"A single run's median, uninstrumented: {run:.3f} ms ({prof['model_ms'] - run:+.3f} ms in the "
        "blocks' means above: the interruptions a shared machine brings, which the calls' medians leave "
        "out). "
        f"Against it, between calls: {between:.3f} ms = {_pct(between, run)}; calls no task stands for "
        f"{_pct(prof['calls_without_task_ms'], run)}.",
    ]


def _kernel_line(k: dict, model_ms: float) -> str:
    alone, cold = k["alone_total_ms"], k["cold_total_ms"]
    cells = [
        k["name"],
        _opt(k["task"]),
        str(k["calls"]),
        f"{k['in_model_ms']:.4f}",
        _pct(k["in_model_ms"], model_ms),
        "-" if alone is None else f"{alone:.4f} ({k['weight']}x)",
        "-" if cold is None else f"{cold:.4f}",
        f"{k['in_model_ms'] / cold:.2f}" if cold else "-",
        "-" if k["gflops_in_model"] is None else f"{k['gflops_in_model']:.1f}",
        "-" if k.get("pct_of_peak_alone") is None else f"{k['pct_of_peak_alone']:.0f}%",
        "-" if k.get("pct_of_roof_alone") is None else f"{k['pct_of_roof_alone']:.0f}% ({k['bound_by']})",
        "-" if k.get("onnxruntime_op_ms") is None else f"{k['onnxruntime_op_ms']:.4f}",
        "-" if k.get("alone_vs_onnxruntime_op") is None else f"{k['alone_vs_onnxruntime_op']:.2f}",
    ]
    return "| " + " | ".join(cells) + " |"


def _gflops(flops, ms):
    return flops / (ms * 1e-3) / 1e9 if flops and ms else None


def _pct(x: float, total: float) -> str:
    return f"{100 * x / total:.1f}%" if total else "-"


def _opt(x) -> str:
    return "-" if x is None else str(x)
