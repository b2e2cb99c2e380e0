"""Failing collaborators for the fault tests: injected into a TuningSession, run in its worker processes.

They are pickled by value (the workers cannot import this test module), see :func:`register`.
"""

import os
import time


def failing_build(mod, target, out_dir):
    raise RuntimeError("injected build failure")


def dying_build(mod, target, out_dir):
    os._exit(3)  # the build worker dies


def dying_evaluator(*args, **kwargs):
    os._exit(3)  # the runner worker dies


def hanging_evaluator(*args, **kwargs):
    time.sleep(3600)  # the runner worker hangs


def register() -> None:
    """Send these functions to worker processes by value."""
    import sys

    import cloudpickle

    cloudpickle.register_pickle_by_value(sys.modules[__name__])
