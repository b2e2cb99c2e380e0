"""The compiled model against ONNX Runtime, timed side by side in a fresh process.

The tuning process is a poor place to time a model against ONNX Runtime. It holds other threads
(Prefect's and MLflow's workers, the cost model's), and ONNX Runtime's side of the comparison is a Python
loop of ``sess.run`` calls that needs the GIL after every call: on a 0.2 ms model, periodic in-process
timings put ONNX Runtime at 0.28-0.47 ms where a fresh process put it at 0.19 ms, and reported a parity
that was not there. TVM's side runs in C++ and does not see it.

:func:`time_in_fresh_process` therefore runs :func:`dynatune.compiler.timing.time_side_by_side` in child
processes (``python -m dynatune.compiler.fresh_timing``) on an exported artifact and the model's ONNX file
(at the shapes the model was tuned for), with the same threads and the same inputs
(``random_inputs(seed)``) as the tuning process; the child gets its spec as JSON on stdin and prints the
result as JSON. One process is not enough on a shared machine: the same artifact, timed this way twice in a
row, read 1.237 then 1.111 (its rounds share one thread placement and memory layout), and the ratio a run
reported was 1.02-1.34x the one its user then measured. So ``processes`` children (3 in a run) time it one
after another, and the ratio takes each side's fastest block among all their rounds
(:func:`dynatune.compiler.timing.pooled`, :func:`dynatune.compiler.timing.best_ratio`).

A shared machine: before each timing the parent probes the load on its cores
(:mod:`dynatune.machine.load`), and the child measures it during the rounds. When either is busy
(:meth:`~dynatune.machine.load.QuietPolicy.busy`), the timing is tried again ``quiet.wait_s`` later, at
most ``quiet.attempts`` times; if the machine stays busy, the least loaded timing is kept with
``under_load`` set and the load figure, and no parity is claimed from it
(:func:`dynatune.compiler.periodic.parity_s`).

A slow spell: these guests run some processes with both sides slow and ONNX Runtime more, while the load
probe reads nothing; the ratio then flatters dynatune. On the Zen 5 guest they came for minutes
(squeezenet1_1's end-of-run timing read 0.826 where the 20 processes after it read 0.914); on the Zen 4 guest
one process in two or three, back to back (the README job's model: ONNX Runtime alone 4.8-5.4 ms in three
processes of six, 3.49-3.63 in the others; a side-by-side process 0.759 with ONNX Runtime at 5.3 ms, the
others 0.918-0.927). Pooling the processes' fastest blocks hides a slow one among quiet ones, not a timing
whose every process was slow. :func:`onnxruntime_reference_ms` times ONNX Runtime alone in a few fresh
processes (a run does so before tuning, and again before its final timing, and keeps the lesser: one taken in
a slow spell reads high and checks nothing); given that ``reference_ms``, while the pooled ONNX Runtime's
fastest block is over ``quiet.slow_onnxruntime`` times it, another process is timed (``quiet.attempts - 1``
at most), and the timing is kept with ``onnxruntime_slow`` set when they all were slow (no parity from it
either).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

from dynatune.compiler.timing import SideBySide, pooled
from dynatune.errors import DynatuneError
from dynatune.machine.load import Load, QuietPolicy, probe

TIMEOUT_S = 600.0


def time_in_fresh_process(
    artifact: str,
    model,
    *,
    device: str = "cpu",
    threads: int | None = None,
    rounds: int = 7,
    seed: int = 0,
    block_ms: float = 200.0,
    quiet: QuietPolicy = QuietPolicy(),
    processes: int = 1,
    reference_ms: float | None = None,
) -> SideBySide:
    """Time ``artifact`` (an exported model) against ONNX Runtime on ``model``'s ONNX file in ``processes``
    child processes, one after another (their rounds pooled); ``model`` is
    a :class:`dynatune.model.importer.Model` (its path and input shapes are used). On a busy machine each
    timing is retried, then flagged (``under_load``), as ``quiet`` says; so is one in a slow spell
    (``onnxruntime_slow``) when ``reference_ms`` (:func:`onnxruntime_reference_ms`) is given."""
    from dynatune.machine.target import usable_cores

    if not os.path.isfile(artifact):  # before any probing or waiting
        name = os.path.basename(artifact)
        raise DynatuneError(f"timing {name} against ONNX Runtime failed: no such file {artifact}")
    threads = threads or usable_cores()
    spec = _onnxruntime_spec(model, threads, rounds, seed, block_ms) | {
        "artifact": os.path.abspath(artifact),
        "device": device,
    }
    timings = [_quiet_timing(spec, artifact, threads, quiet) for _ in range(processes)]
    for _ in range(quiet.attempts - 1):  # every process so far in a slow spell: one more
        if not quiet.slow(min(pooled(timings).ort_ms), reference_ms):
            break
        timings.append(_quiet_timing(spec, artifact, threads, quiet))
    result = pooled(timings)
    result.onnxruntime_reference_ms = reference_ms
    result.onnxruntime_slow = quiet.slow(min(result.ort_ms), reference_ms)
    return result


def onnxruntime_reference_ms(
    model,
    *,
    threads: int | None = None,
    rounds: int = 5,
    seed: int = 0,
    block_ms: float = 200.0,
    quiet: QuietPolicy = QuietPolicy(),
    processes: int = 3,
) -> float:
    """ONNX Runtime's fastest block on ``model`` (a :class:`dynatune.model.importer.Model`), alone, among
    ``processes`` fresh processes of ``rounds`` blocks each (one alone reads slow as often as not on a guest
    whose slow spells come process by process), timed as :func:`time_in_fresh_process` times its side, after
    waiting (as ``quiet`` says) for a quiet machine: what a later timing's ONNX Runtime side is held against
    (``reference_ms``). A few seconds, most of them importing ONNX Runtime."""
    from dynatune.machine.load import quiet_or_wait
    from dynatune.machine.target import usable_cores

    threads = threads or usable_cores()
    quiet_or_wait(threads, quiet)
    spec = _onnxruntime_spec(model, threads, rounds, seed, block_ms)
    name = os.path.basename(model.path)
    return min(min(_time_in_child(spec, name).ort_ms) for _ in range(processes))


def _onnxruntime_spec(model, threads: int, rounds: int, seed: int, block_ms: float) -> dict:
    return {
        "onnx": model.path,
        "inputs": [[i.name, list(i.shape), i.dtype] for i in model.inputs],
        "threads": threads,
        "rounds": rounds,
        "seed": seed,
        "block_ms": block_ms,
    }


def time_against_baseline(
    artifact: str,
    baseline: str,
    *,
    rounds: int = 7,
    seed: int = 0,
    block_ms: float = 200.0,
    quiet: QuietPolicy = QuietPolicy(),
) -> SideBySide:
    """Time two compiled models (each with its metadata beside it, :mod:`dynatune.runtime`) side by side
    in a child process, each on seeded random inputs of its own: ``tvm_ms`` are ``artifact``'s rounds,
    ``ort_ms`` the ``baseline``'s (the ratio is artifact / baseline). Each is loaded as its user loads it
    (:func:`dynatune.runtime.load`: the thread pool it was timed with). Retried and flagged on a busy
    machine as :func:`time_in_fresh_process` is."""
    from dynatune.runtime import read_metadata

    for path in (artifact, baseline):
        if not os.path.isfile(path):
            raise DynatuneError(f"timing {os.path.basename(artifact)} failed: no such file {path}")
    spec = {
        "artifact": os.path.abspath(artifact),
        "baseline": os.path.abspath(baseline),
        "rounds": rounds,
        "seed": seed,
        "block_ms": block_ms,
    }
    threads = int(read_metadata(artifact)["thread_pool"].get("TVM_NUM_THREADS", 0)) or None
    return _quiet_timing(spec, artifact, threads, quiet)


def _quiet_timing(spec: dict, artifact: str, threads: int | None, quiet: QuietPolicy) -> SideBySide:
    """The child's timing of ``spec``, tried again while the machine is busy (``threads``: the cores it
    needs), the least loaded kept and flagged when it stays busy."""
    from dynatune.machine.target import usable_cores

    threads = threads or usable_cores()
    kept = None
    for attempt in range(1, quiet.attempts + 1):
        before = probe(quiet.probe_s)
        last = attempt == quiet.attempts
        if quiet.busy(before, threads) and not last:
            time.sleep(quiet.wait_s)  # not worth a timing: wait for the machine to calm down
            continue
        result = _time_in_child(spec, artifact)
        result.load_before, result.attempts = before.as_dict(), attempt
        result.under_load = quiet.busy(before, threads) or quiet.busy(Load.from_dict(result.load), threads)
        if kept is None or (result.load_cores or 0.0) < (kept.load_cores or 0.0):
            kept = result
        if not result.under_load:
            return result
        if not last:
            time.sleep(quiet.wait_s)
    kept.attempts = quiet.attempts
    return kept


def _time_in_child(spec: dict, artifact: str) -> SideBySide:
    # the directory above dynatune/
    package_root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    env = dict(
        os.environ, PYTHONPATH=os.pathsep.join(p for p in (package_root, os.environ.get("PYTHONPATH")) if p)
    )
    try:
        out = subprocess.run(
            [sys.executable, "-m", "dynatune.compiler.fresh_timing"],
            input=json.dumps(spec),
            env=env,
            capture_output=True,
            text=True,
            timeout=TIMEOUT_S,
        )
    except subprocess.TimeoutExpired:
        raise DynatuneError(f"timing {os.path.basename(artifact)} took over {TIMEOUT_S:.0f} s") from None
    if out.returncode != 0:
        tail = (out.stderr.strip().splitlines() or ["no output"])[-1]
        raise DynatuneError(f"timing {os.path.basename(artifact)} against ONNX Runtime failed: {tail}")
    return SideBySide.from_dict(json.loads(out.stdout.strip().splitlines()[-1]))


def _time(spec: dict) -> SideBySide:
    if "baseline" in spec:
        return _time_two_artifacts(spec)
    import tvm

    from dynatune.compiler.execution import load
    from dynatune.compiler.timing import time_side_by_side

    dev = tvm.device(spec["device"], 0)
    vm = load(spec["artifact"], dev)
    sess, inputs = _onnxruntime_side(spec)
    return time_side_by_side(vm, sess, inputs, dev, rounds=spec["rounds"], block_ms=spec["block_ms"])


def _onnxruntime_side(spec: dict):
    """(ONNX Runtime's session on the spec's model, at its input shapes and threads; its seeded inputs)."""
    from dynatune.compiler.execution import onnxruntime_session
    from dynatune.model.importer import ModelInput, random_inputs, runtime_proto

    inputs = [ModelInput(name, tuple(shape), dtype) for name, shape, dtype in spec["inputs"]]
    sess = onnxruntime_session(runtime_proto(spec["onnx"], inputs), spec["threads"])
    return sess, random_inputs(inputs, spec["seed"])


def _time_onnxruntime(spec: dict) -> dict:
    """ONNX Runtime alone, its blocks as :func:`dynatune.compiler.timing.time_side_by_side` times them: a
    :class:`SideBySide`'s dict with no TVM side."""
    from dynatune.compiler.timing import interleave, ort_block_timer
    from dynatune.machine.load import LoadProbe

    timer = ort_block_timer(*_onnxruntime_side(spec), spec["block_ms"])
    load = LoadProbe()
    (ort_ms,) = interleave([timer], spec["rounds"], pause_s=0.05)
    return {"tvm_ms": [], "ort_ms": ort_ms, "load": load.stop().as_dict()}


def _time_two_artifacts(spec: dict) -> SideBySide:
    from dynatune.compiler.timing import interleave, predict_block_timer
    from dynatune.machine.load import LoadProbe
    from dynatune.model.importer import ModelInput, random_inputs
    from dynatune.runtime import load

    timers = []
    for path in (spec["artifact"], spec["baseline"]):
        model = load(path)
        inputs = random_inputs(
            [ModelInput(n, shape, dtype) for n, shape, dtype in model.inputs], spec["seed"]
        )
        timers.append(predict_block_timer(model.vm, inputs, model.device, spec["block_ms"]))
    load_probe = LoadProbe()
    ms, baseline_ms = interleave(timers, spec["rounds"], pause_s=0.05)
    return SideBySide(ms, baseline_ms, load=load_probe.stop().as_dict())


def main() -> int:
    spec = json.loads(sys.stdin.read())
    print(json.dumps(_time(spec).as_dict() if "artifact" in spec else _time_onnxruntime(spec)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
