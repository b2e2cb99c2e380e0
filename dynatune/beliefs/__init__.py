"""Belief models: what DynaTune's scheduler expects one more slot to gain on each task.

``headroom`` (the default) measures how far a task is from its roofline and models the staircase of real
curves; ``curves`` extrapolates each task's learning curve. See :mod:`.base` for what they share.
"""

from dynatune.beliefs.base import Beliefs, TaskCurve, task_curve
from dynatune.beliefs.curves import FAMILIES, BeliefModel, CurveBeliefs, CurveFit, basis, fit_curve
from dynatune.beliefs.headroom import HeadroomBeliefs, operator_kind

BELIEFS = {"curves": CurveBeliefs, "headroom": HeadroomBeliefs}


def make_beliefs(name: str, **params) -> Beliefs:
    from dynatune.errors import DynatuneError

    if name not in BELIEFS:
        raise DynatuneError(f"unknown belief model {name!r}", "use one of: " + ", ".join(BELIEFS))
    return BELIEFS[name](**params)


__all__ = [
    "BELIEFS",
    "Beliefs",
    "BeliefModel",
    "CurveBeliefs",
    "CurveFit",
    "FAMILIES",
    "HeadroomBeliefs",
    "TaskCurve",
    "basis",
    "fit_curve",
    "make_beliefs",
    "operator_kind",
    "task_curve",
]
