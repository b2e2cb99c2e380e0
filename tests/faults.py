"""Failing collaborators for the fault tests: injected into a TuningSession, run in its worker processes.

They are pickled by value (the workers cannot import this test module), see :func:`register`.
"""

import os
import time


def failing_build(mod, target, out_dir):
    raise RuntimeError("injected build failure")


def dying_build(mod, target, out_dir):
    os._exit(3)  # the build worker dies


SLOW_BUILD = "dynatune_slow_build"  # a PrimFunc attribute: its build takes 10 minutes


def _slow(mods) -> None:
    if any(SLOW_BUILD in (m["main"].attrs or {}) for m in mods):
        time.sleep(600)  # a pathological build (LLVM's back end has taken 35 s on a real candidate)


def slow_build(mod, target, out_dir):
    from dynatune.search.builder import build_and_export

    _slow([mod])
    return build_and_export(mod, target, out_dir)


def slow_batch(mods, target, out_dir):
    from dynatune.search.builder import build_batch

    _slow(mods)
    return build_batch(mods, target, out_dir)


def dying_evaluator(*args, **kwargs):
    os._exit(3)  # the runner worker dies


def hanging_evaluator(*args, **kwargs):
    time.sleep(3600)  # the runner worker hangs


def _second_call(counter: str) -> bool:
    """Whether this is the second call counted in the file ``counter`` (each call appends a byte to it, so
    the count survives the worker processes)."""
    with open(counter, "ab") as f:
        f.write(b".")
        return f.tell() == 2


def hanging_second_evaluator(*args, counter: str, **kwargs):
    """The second candidate timed hangs; the others are timed."""
    from dynatune.search.measure import adaptive_evaluator

    if _second_call(counter):
        time.sleep(3600)
    return adaptive_evaluator(*args, **kwargs)


def raising_second_evaluator(*args, counter: str, **kwargs):
    """The second candidate timed raises (the worker lives on); the others are timed."""
    from dynatune.search.measure import adaptive_evaluator

    if _second_call(counter):
        raise RuntimeError("injected evaluator error")
    return adaptive_evaluator(*args, **kwargs)


def register() -> None:
    """Send these functions to worker processes by value."""
    import sys

    import cloudpickle

    cloudpickle.register_pickle_by_value(sys.modules[__name__])
