"""The local runner: MetaSchedule's ``LocalRunner``, loading a batch's library once for all its candidates.

A batch built by :class:`~dynatune.search.builder.PersistentBuilder` is a few libraries (two shares per
build worker), a function per candidate. The runner's worker keeps the libraries it loaded (the last
four), so a batch costs one ``dlopen`` per library, not one per candidate. Each candidate is still its
own call to the worker: a candidate that crashes the worker or hangs past ``timeout_sec`` fails alone,
with its error, and the next one gets a fresh worker (which loads the library again).
"""

from __future__ import annotations

from collections import OrderedDict

from tvm.ir.utils import derived_object
from tvm.s_tir.meta_schedule.runner.local_runner import LocalRunner, LocalRunnerFuture

from dynatune.search.builder import split_artifact

_LIBRARIES: OrderedDict = OrderedDict()  # in the worker: library path -> loaded module
_KEEP = 4


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


@derived_object
class BatchLocalRunner(LocalRunner._cls):
    """``LocalRunner`` with :func:`measure_candidate` in its worker; ``f_alloc_argument`` and
    ``f_run_evaluator`` are functions (not registry names)."""

    def run(self, runner_inputs):
        results = []
        for ri in runner_inputs:
            future = self.pool.submit(
                measure_candidate,
                self.f_alloc_argument,
                self.f_run_evaluator,
                self.evaluator_config,
                self.alloc_repeat,
                str(ri.artifact_path),
                str(ri.device_type),
                tuple(arg.as_json() for arg in ri.args_info),
            )
            try:
                results.append(LocalRunnerFuture(res=future.result(), error_message=None))
            except TimeoutError:
                message = f"LocalRunner: Timeout, killed after {self.timeout_sec} seconds\n"
                results.append(LocalRunnerFuture(res=None, error_message=message))
            except Exception as exc:  # the worker crashed, or the evaluator raised
                message = "LocalRunner: An exception occurred\n" + str(exc)
                results.append(LocalRunnerFuture(res=None, error_message=message))
        return results
