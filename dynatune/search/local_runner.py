"""The local runner: a whole batch of candidates measured in one call to a kept worker process.

A batch built by :class:`~dynatune.search.builder.PersistentBuilder` is a few libraries (two shares per
build worker), a function per candidate. The runner sends the batch to its worker process once; the worker
loads each library once (it keeps the last four), times the candidates in order and returns their timings
together. A candidate still fails alone:

- one whose evaluator raises is an error, and the worker goes on with the next;
- one that crashes the worker, or runs past ``timeout_sec`` (a watchdog in the worker then ends the
  process), is an error too. The worker streams each candidate's outcome to a progress file as it goes (a
  temporary file per call, removed after it), so the runner knows which candidates were measured and which
  one was running; the rest of the batch goes to a fresh worker.
"""

from __future__ import annotations

import json
import os
import subprocess
import tempfile
import threading
from collections import OrderedDict

from tvm.ir.utils import derived_object
from tvm.s_tir.meta_schedule.runner import EvaluatorConfig, PyRunner
from tvm.s_tir.meta_schedule.runner.local_runner import LocalRunnerFuture
from tvm.support.popen_pool import PopenWorker

from dynatune.search import spare_workers
from dynatune.search.builder import split_artifact

_LIBRARIES: OrderedDict = OrderedDict()  # in the worker: library path -> loaded module
_KEEP = 4
_RAISED = "LocalRunner: An exception occurred\n"  # MetaSchedule's prefix of a candidate's error
_TIMED_OUT = 86  # the worker's exit status when its watchdog ends a candidate that ran too long


class _Candidate:
    """One function of a batch library, as an evaluator sees a candidate's module."""

    def __init__(self, library, name: str):
        self.library, self.entry_name = library, name

    def time_evaluator(self, *args, **kwargs):
        return self.library.time_evaluator(*args, **kwargs)


def load_candidate(artifact: str):
    """Worker side: the candidate's module, from the library loaded for an earlier candidate if any."""
    import tvm

    path, name = split_artifact(artifact)
    library = _LIBRARIES.pop(path, None) or tvm.runtime.load_module(path)
    _LIBRARIES[path] = library
    while len(_LIBRARIES) > _KEEP:
        _LIBRARIES.popitem(last=False)
    return library if name is None else _Candidate(library, name)


def measure_candidate(
    f_alloc_argument, f_run_evaluator, evaluator_config, alloc_repeat, artifact, device_type, args_info
):
    """Worker side: time one candidate (MetaSchedule's local worker, with :func:`load_candidate`)."""
    import tvm

    rt_mod = load_candidate(artifact)
    device = tvm.runtime.device(device_type, 0)
    repeated_args = f_alloc_argument(device, args_info, alloc_repeat)
    return f_run_evaluator(rt_mod, device, evaluator_config, repeated_args)


class _Watchdog:
    """The worker's timer for one candidate: past ``timeout_s`` it writes ``{"timeout": k}`` to the progress
    file and ends the process, unless the candidate has finished first (:meth:`finish`)."""

    def __init__(self, progress, k: int, timeout_s: float):
        self.progress, self.k, self.lock, self.finished = progress, k, threading.Lock(), False
        self.timer = threading.Timer(timeout_s, self._expire)
        self.timer.daemon = True
        self.timer.start()

    def _expire(self) -> None:
        with self.lock:
            if not self.finished:
                self.progress.write(json.dumps({"timeout": self.k}) + "\n")
                self.progress.flush()
                os._exit(_TIMED_OUT)

    def finish(self) -> None:
        with self.lock:
            self.finished = True
        self.timer.cancel()


def measure_batch(
    f_alloc_argument, f_run_evaluator, evaluator_config, alloc_repeat, jobs, timeout_s, progress
):
    """Worker side: time each ``(artifact, device_type, args_info)`` of ``jobs`` in order, each within
    ``timeout_s``; one ``{"secs": [...]}`` or ``{"error": traceback}`` per job, each also appended to the
    file ``progress`` as soon as it is known."""
    import traceback

    out = []
    with open(progress, "a") as log:
        for k, (artifact, device_type, args_info) in enumerate(jobs):
            watchdog = _Watchdog(log, k, timeout_s)
            try:
                secs = measure_candidate(
                    f_alloc_argument,
                    f_run_evaluator,
                    evaluator_config,
                    alloc_repeat,
                    artifact,
                    device_type,
                    args_info,
                )
                outcome = {"secs": [float(s) for s in secs]}
            except Exception:
                outcome = {"error": traceback.format_exc()}
            finally:
                watchdog.finish()
            log.write(json.dumps(outcome) + "\n")
            log.flush()
            out.append(outcome)
    return out


def read_progress(path: str) -> tuple[list[dict], bool]:
    """The outcomes a worker wrote to its progress file before it ended, and whether its watchdog ended it
    (a timeout) rather than a crash. A line cut short by the end is not an outcome."""
    outcomes, timed_out = [], False
    with open(path) as f:
        for line in f:
            try:
                entry = json.loads(line)
            except ValueError:
                break
            if "timeout" in entry:
                timed_out = True
                break
            outcomes.append(entry)
    return outcomes, timed_out


@derived_object
class BatchLocalRunner(PyRunner):
    """MetaSchedule's local runner, its worker measuring a batch per call (:func:`measure_batch`);
    ``f_alloc_argument`` and ``f_run_evaluator`` are functions, run in the worker."""

    def __init__(
        self, timeout_sec: float, evaluator_config, f_alloc_argument, f_run_evaluator, alloc_repeat=1
    ):
        super().__init__()
        self.timeout_sec, self.alloc_repeat = timeout_sec, alloc_repeat
        self.evaluator_config = EvaluatorConfig._normalized(evaluator_config)
        self.f_alloc_argument, self.f_run_evaluator = f_alloc_argument, f_run_evaluator
        # started by warm_up or the first batch, and again after a crash or a timeout; its stderr silenced
        # as LocalRunner's is (a crashing candidate's dump)
        self.worker_environment = spare_workers.environment()
        self.worker = spare_workers.take("runner worker") or PopenWorker(stderr=subprocess.DEVNULL)

    def run(self, runner_inputs):
        jobs = [
            (str(ri.artifact_path), str(ri.device_type), tuple(arg.as_json() for arg in ri.args_info))
            for ri in runner_inputs
        ]
        results: list = []
        while len(results) < len(jobs):
            outcomes, failure = self._measure(jobs[len(results) :])
            results += [
                LocalRunnerFuture(res=o["secs"], error_message=None)
                if "secs" in o
                else LocalRunnerFuture(res=None, error_message=_RAISED + o["error"])
                for o in outcomes
            ]
            if failure is not None:  # the candidate after those measured ended the worker
                results.append(LocalRunnerFuture(res=None, error_message=failure))
        return results

    def _measure(self, jobs) -> tuple[list[dict], str | None]:
        """One call to the worker: the outcomes of the first jobs, and the error of the job that ended the
        worker (None when it measured them all)."""
        fd, progress = tempfile.mkstemp(prefix="dynatune-progress-", suffix=".jsonl")
        os.close(fd)
        args = (self.f_alloc_argument, self.f_run_evaluator, self.evaluator_config, self.alloc_repeat)
        if not self.worker.is_alive():  # never started, or ended between batches: start it afresh
            self.worker.kill()
        try:
            # the watchdog times each candidate; the worker's own limit is only a backstop for the batch
            self.worker.send(
                measure_batch,
                (*args, jobs, self.timeout_sec, progress),
                timeout=self.timeout_sec * (len(jobs) + 1),
            )
            try:
                return self.worker.recv(), None
            except Exception as exc:  # the worker died (crash or watchdog) or the backstop killed it
                self.worker.kill()
                outcomes, timed_out = read_progress(progress)
                if timed_out or isinstance(exc, TimeoutError):
                    return outcomes, f"LocalRunner: Timeout, killed after {self.timeout_sec} seconds\n"
                return outcomes, _RAISED + str(exc)
        finally:
            os.unlink(progress)

    def warm_up(self, f_ready) -> None:
        """Start the worker now and run ``f_ready`` in it (imports, caches), so that the first batch's
        measuring does not pay for them."""
        self.worker.send(f_ready)
        self.worker.recv()

    def shutdown(self) -> None:
        """Stop the worker (or keep it for this process's next session: :mod:`.spare_workers`)."""
        kept = self.worker.is_alive() and spare_workers.keep(
            "runner worker", self.worker, PopenWorker.kill, self.worker_environment
        )
        if not kept:
            self.worker.kill()
