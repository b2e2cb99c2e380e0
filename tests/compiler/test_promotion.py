"""The promotion rule on side-by-side timings (dynatune.compiler.promotion): the real timing is
tests/run/test_operations.py's."""

from types import SimpleNamespace

import pytest

from dynatune.compiler.promotion import is_slower


@pytest.mark.parametrize(
    "median, low, high, slower",
    [
        (1.00, 0.95, 1.06, False),  # the same speed
        (1.04, 0.90, 1.20, False),  # within what the rounds' spread cannot tell from 1
        (1.30, 0.95, 1.10, True),  # beyond it
        (53.5, 2.75, 112.0, True),  # slower in every round, however wide the spread (a busy machine)
        (0.80, 0.70, 0.90, False),  # faster
    ],
)
def test_a_model_is_slower_in_every_round_or_beyond_the_spread(median, low, high, slower):
    assert is_slower(SimpleNamespace(ratio_median=median, ratio_min=low, ratio_max=high)) is slower
