"""dynatune.run.report: plots are valid PNGs, tables show the expected rows, missing values are "-"."""

import math

import pytest

from dynatune.run import report

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


def _check_png(path):
    with open(path, "rb") as f:
        assert f.read(8) == PNG_SIGNATURE
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.image as mpimg

    img = mpimg.imread(path)
    assert img.ndim == 3 and img.shape[0] > 0 and img.shape[1] > 0


def _round(i, name, est_s, elapsed_s, weight=2, before=None, after=None, trials=64):
    return {
        "round": i,
        "task": i % 3,
        "task_name": name,
        "result": {
            "trials": trials,
            "build_errors": 0,
            "run_errors": 0,
            "best_before_s": before if before is not None else math.inf,
            "best_after_s": after if after is not None else math.inf,
            "wall_s": 10.0,
            "search_s": 1.0,
            "build_s": 4.0,
            "measure_s": 5.0,
            "exhausted": False,
            "repeats": 10,
            "repeats_saved": 2,
            "errors": [],
        },
        "belief": {
            "task": i % 3,
            "name": name,
            "weight": weight,
            "best_s": before,
            "gain_mean_s": 1e-4,
            "gain_std_s": 5e-5,
            "score": 1.0,
            "visits": i,
            "retired": False,
            "note": "",
        },
        "estimated_latency_s": est_s,
        "elapsed_s": elapsed_s,
        "decision_s": 0.001,
        "wall_s": 10.5,
    }


@pytest.fixture
def rounds():
    return [
        _round(
            0, "fused_nn_conv2d_add_nn_relu_" + "x" * 40, 0.010, 10.0, weight=2, before=0.003, after=0.002
        ),
        _round(1, "fused_dense_add", 0.008, 20.0),
        _round(2, "fused_nn_conv2d_add", 0.0075, 30.0),
        _round(3, "fused_dense_add", 0.0075, 40.0, trials=0),
    ]


def test_curve_from_rounds(rounds):
    assert report.curve_from_rounds(rounds) == [(10.0, 0.010), (20.0, 0.008), (30.0, 0.0075), (40.0, 0.0075)]
    c = report.curve_from_rounds(rounds, initial_s=0.02)
    assert c[0] == (0.0, 0.02) and len(c) == 5
    assert report.curve_from_rounds([], initial_s=0.02) == [(0.0, 0.02)]
    assert report.curve_from_rounds([]) == []
    # rounds without a finite estimate are skipped
    bad = [dict(rounds[0], estimated_latency_s=None), dict(rounds[1], estimated_latency_s=math.inf)]
    assert report.curve_from_rounds(bad) == []


def test_round_gains(rounds):
    g = report.round_gains(rounds)
    assert g[0] == pytest.approx(0.002)  # (3 - 2) ms x weight 2: from the result, "before" unknown
    assert g[1] == pytest.approx(0.002) and g[2] == pytest.approx(0.0005) and g[3] == pytest.approx(0.0)
    assert report.round_gains(rounds, initial_s=0.015)[0] == pytest.approx(0.005)
    assert report.round_gains([_round(0, "t", 0.01, 1.0)]) == [None]  # nothing known -> None


def test_convergence_plot(tmp_path, rounds):
    curves = {"dynatune": report.curve_from_rounds(rounds), "greedy": [(15.0, 0.009), (40.0, 0.0085)]}
    path = str(tmp_path / "sub" / "convergence.png")
    out = report.convergence_plot(curves, path, title="tiny", initial={"dynatune": 0.02, "greedy": 0.02})
    assert out == path
    _check_png(path)


def test_convergence_plot_log_scale_and_empty(tmp_path):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    created = []
    orig = plt.subplots

    def spy(*a, **k):
        fig, ax = orig(*a, **k)
        created.append(ax)
        return fig, ax

    plt.subplots = spy
    try:
        report.convergence_plot(
            {"a": [(1.0, 0.001), (2.0, 0.0005)]}, str(tmp_path / "log.png"), initial={"a": 0.1}
        )
        report.convergence_plot({"a": [(1.0, 0.001), (2.0, 0.0009)]}, str(tmp_path / "lin.png"))
    finally:
        plt.subplots = orig
    assert created[0].get_yscale() == "log"
    assert created[1].get_yscale() == "linear"
    _check_png(str(tmp_path / "log.png"))
    # no data at all: still a valid plot
    _check_png(report.convergence_plot({}, str(tmp_path / "empty.png")))
    _check_png(report.convergence_plot({"a": []}, str(tmp_path / "empty2.png"), initial={"b": None}))


def _task(name, weight, default_s, history, mean=2e-4, std=1e-4, slot=30.0):
    return {
        "name": name,
        "weight": weight,
        "default_s": default_s,
        "history": history,
        "gain_mean_s": mean,
        "gain_std_s": std,
        "slot_s": slot,
    }


def test_belief_plot(tmp_path):
    tasks = [
        _task("conv_a", 2, 0.004, [[30.0, 64, 0.003], [60.0, 128, 0.0025]]),
        _task("dense_b", 1, 0.001, [[30.0, 64, None]]),  # no valid measurement yet
        _task("pool_c", 4, 0.0002, []),  # never tuned
        _task("broken", 1, None, [], mean=None, std=None),
    ]
    tasks += [_task(f"t{i}", 1, 0.0001 * (i + 1), [[30.0, 64, 0.0001 * i + 5e-5]]) for i in range(10)]
    path = report.belief_plot(tasks, str(tmp_path / "beliefs.png"), top=8)
    _check_png(path)
    _check_png(report.belief_plot(tasks[:1], str(tmp_path / "one.png")))
    _check_png(report.belief_plot([], str(tmp_path / "none.png")))


def test_rounds_table(rounds):
    text = report.rounds_table(rounds)
    lines = text.splitlines()
    assert lines[0].split() == ["round", "task", "trials", "gain", "ms", "est.", "ms", "elapsed", "s"]
    assert len(lines) == 2 + len(rounds)
    # long task names are truncated
    assert "fused_nn_conv2d_add_nn_relu_" in lines[2] and "x" * 40 not in lines[2]
    assert max(len(w) for w in lines[2].split()) <= report.TASK_NAME_WIDTH
    # round 0: gain from the result (1 ms x weight 2), est. 10 ms, elapsed 10 s
    assert lines[2].split()[2:] == ["64", "2.0000", "10.000", "10.0"]
    assert lines[3].split() == ["1", "fused_dense_add", "64", "2.0000", "8.000", "20.0"]
    assert lines[4].split() == ["2", "fused_nn_conv2d_add", "64", "0.5000", "7.500", "30.0"]
    assert lines[5].split() == ["3", "fused_dense_add", "0", "0.0000", "7.500", "40.0"]
    # fixed-width: the numeric columns end at the same place
    assert len({len(line) for line in lines[2:]}) == 1


def test_rounds_table_last_and_missing(rounds):
    lines = report.rounds_table(rounds, last=2).splitlines()
    assert len(lines) == 4
    assert lines[2].split()[0] == "2" and lines[3].split()[0] == "3"
    # gains are still computed from the whole run
    assert lines[2].split()[3] == "0.5000"
    odd = [{"round": 0, "task_name": "t", "estimated_latency_s": None, "elapsed_s": None}]
    row = report.rounds_table(odd).splitlines()[2].split()
    assert row == ["0", "t", "-", "-", "-", "-"]


def test_rounds_table_empty():
    assert report.rounds_table([]) == "no rounds yet"
    assert report.rounds_table([], last=5) == "no rounds yet"


def test_compare_table():
    runs = {
        "run-a": {
            "model": "/models/resnet50.onnx",
            "scheduler": "dynatune",
            "rounds": 12,
            "trials": 768,
            "elapsed_s": 360.4,
            "estimated_latency_ms": 5.1234,
            "latency_ms": 5.0,
            "untuned_latency_ms": 15.0,
            "onnxruntime_latency_ms": 6.0,
        },
        "run-b": {"scheduler": "greedy", "rounds": 3},
    }
    lines = report.compare_table(runs).splitlines()
    assert lines[0].split()[:3] == ["run", "model", "scheduler"]
    assert len(lines) == 4
    a = lines[2].split()
    assert a == [
        "run-a",
        "resnet50.onnx",
        "dynatune",
        "12",
        "768",
        "360.4",
        "5.123",
        "5.000",
        "3.00x",
        "1.20x",
    ]
    b = lines[3].split()
    assert b == ["run-b", "-", "greedy", "3", "-", "-", "-", "-", "-", "-"]
    assert report.compare_table({}) == "no runs"
    # NaN / zero latencies don't crash and show "-"
    nan = report.compare_table({"x": {"latency_ms": float("nan"), "untuned_latency_ms": 3.0}})
    assert nan.splitlines()[2].split()[-3:] == ["-", "-", "-"]


def test_markdown_report(tmp_path, rounds):
    summary = {
        "model": "/m/tiny.onnx",
        "scheduler": "dynatune",
        "rounds": 4,
        "trials": 192,
        "elapsed_s": 40.0,
        "estimated_latency_ms": 7.5,
        "latency_ms": 7.0,
        "untuned_latency_ms": 14.0,
        "max_rel_err": 2.5e-6,
        "numerics_ok": True,
        "wall_s": 55.2,
        "budget_s": 40.0,
        "artifact": "out/tiny.so",
    }
    path = str(tmp_path / "report" / "report.md")
    text = report.markdown_report(summary, rounds, path)
    with open(path) as f:
        assert f.read() == text
    assert (
        text.startswith("# ") and "tiny.onnx" in text.splitlines()[0] and "dynatune" in text.splitlines()[0]
    )
    assert "| measured latency (ms) | 7.000 |" in text
    assert "| speedup vs untuned | 2.00x |" in text
    assert "| speedup vs ONNX Runtime | - |" in text  # missing key
    assert "| numerics ok | yes |" in text
    assert "| max relative error | 2.5e-06 |" in text
    assert "| artifact | out/tiny.so |" in text
    assert "convergence.png" in text and "beliefs.png" in text
    # the gains table is sorted by gain, largest first
    section = text.split("## Rounds with the largest gains")[1].split("## Plots")[0]
    rows = [line for line in section.splitlines() if line.startswith("| ") and not line.startswith("| round")]
    gains = [float(r.split("|")[4]) for r in rows]
    assert gains == sorted(gains, reverse=True) and len(rows) == 4


def test_markdown_report_top10_and_empty(tmp_path):
    many = [_round(i, f"task{i}", 0.1 - 0.001 * i * (i % 3 + 1) / 3, 10.0 * (i + 1)) for i in range(25)]
    text = report.markdown_report({}, many, str(tmp_path / "r.md"))
    section = text.split("## Rounds with the largest gains")[1].split("## Plots")[0]
    rows = [line for line in section.splitlines() if line.startswith("| ") and not line.startswith("| round")]
    assert len(rows) == 10
    assert "| model | - |" in text and "| rounds | - |" in text
    empty = report.markdown_report({"model": "m.onnx"}, [], str(tmp_path / "e.md"))
    assert "no rounds yet" in empty and "convergence.png" in empty


def test_library_imports_no_pipeline_tools():
    import subprocess
    import sys

    code = (
        "import sys, dynatune.run.report; "
        "bad = [m for m in ('prefect', 'mlflow', 'matplotlib.pyplot') if m in sys.modules]; "
        "assert not bad, bad"
    )
    subprocess.run([sys.executable, "-c", code], check=True, cwd=report.__file__.rsplit("/dynatune/", 1)[0])
