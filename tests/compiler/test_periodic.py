"""Periodic whole-model measurement: when it is due, and the time to ONNX Runtime parity."""

from dynatune.compiler.periodic import interval_s, parity_s


def test_interval_is_auto_for_long_budgets_and_zero_turns_it_off():
    assert interval_s(None, 600) == 300 and interval_s(None, 599) == 0
    assert interval_s(60, 100) == 60 and interval_s(0, 3600) == 0


def test_parity_is_the_first_measurement_below_onnxruntime_the_final_one_last():
    points = [
        {"elapsed_s": 60, "ratio": 3.0},
        {"elapsed_s": 120, "ratio": 0.9},
        {"elapsed_s": 180, "ratio": 0.8},
    ]
    assert parity_s(points) == 120
    assert parity_s(points, 300, 0.7) == 120  # an earlier periodic point wins
    assert parity_s(points[:1]) is None
    assert parity_s(points[:1], 300, 0.95) == 300  # only the final measurement beat it
    assert parity_s(points[:1], 300, 1.2) is None and parity_s([], 300, None) is None


def test_no_parity_from_a_point_taken_under_load():
    """Load slows ONNX Runtime far more than TVM: a point that stayed busy never claims parity."""
    points = [
        {"elapsed_s": 60, "ratio": 0.97, "under_load": True, "load_cores": 1.0},
        {"elapsed_s": 120, "ratio": 0.9, "under_load": False},
    ]
    assert parity_s(points) == 120
    assert parity_s(points[:1]) is None
    assert parity_s(points[:1], 300, 0.95) == 300  # a quiet final measurement still counts
