"""`dynatune bench live`: real tuning of one model by each scheduler with the same budget, in one run."""

import json

import pytest

from dynatune.cli import main

pytestmark = pytest.mark.slow  # real tuning, servers or subprocesses


def test_bench_live_tunes_with_every_scheduler_and_reports_ttq(tiny_onnx, tmp_path):
    out = tmp_path / "live"
    rc = main(["bench", "live", "--model", tiny_onnx, "--shape", "x=1x3x16x16", "--budget", "6", "--slot", "3", "--trials-per-iter", "2",
               "--out", str(out)])
    assert rc == 0
    doc = json.loads((out / "live.json").read_text())
    assert doc["budget_s"] == 6 and doc["slot_s"] == 3
    (name, res), = doc["models"].items()
    assert set(res["runs"]) == {"dynatune", "gradient", "round_robin"}
    for sch, run in res["runs"].items():
        assert run["scheduler"] == sch and run["rounds"] >= 1 and run["trials"] >= 1
        assert run["curve"][0][0] == 0.0 and run["curve"][-1][1] <= run["curve"][0][1]  # estimate never rises
        assert run["latency_ms"] > 0 and run["numerics_ok"]  # the compiled model ran and matched ONNX Runtime
        assert (out / f"{name}-{sch}").is_dir()  # each run tuned from scratch in its own work dir
    # gradient reaches its own final quality; the ratios are defined (a censored run counts as the budget)
    assert res["runs"]["gradient"]["ttq_to_gradient_final_s"] is not None
    assert res["ttq_vs_gradient"] > 0 and res["ttq_vs_round_robin"] > 0
    assert abs(res["target_ms"] - res["runs"]["gradient"]["estimated_ms"]) < 1e-9
    assert (out / f"{name}.png").stat().st_size > 0
