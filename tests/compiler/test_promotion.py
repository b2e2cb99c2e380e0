"""The promotion rule on side-by-side timings (dynatune.compiler.promotion): the real timing is
tests/run/test_operations.py's."""

from types import SimpleNamespace

import pytest

from dynatune.compiler.promotion import is_slower


@pytest.mark.parametrize(
    "median, low, high, fastest, slower",
    [
        (1.00, 0.95, 1.06, 1.01, False),  # the same speed
        (1.04, 0.90, 1.20, 1.05, False),  # within what the rounds' spread cannot tell from 1
        (1.30, 0.95, 1.10, 1.08, True),  # beyond it
        (53.5, 2.75, 112.0, 50.0, True),  # slower in every round, however wide the spread (a busy machine)
        (105.6, 0.93, 212.0, 94.0, True),  # one round held the champion up: its fastest block says slower
        (1.02, 0.97, 1.15, 1.12, True),  # the same median, its fastest block 12 % slower
        (0.80, 0.70, 0.90, 0.82, False),  # faster
    ],
)
def test_a_model_is_slower_in_every_round_at_its_fastest_or_beyond_the_spread(
    median, low, high, fastest, slower
):
    sbs = SimpleNamespace(ratio_median=median, ratio_min=low, ratio_max=high, ratio=fastest)
    assert is_slower(sbs) is slower
