"""Start-up timeline of the pipeline (what `dynatune tune` does), one line per stage.

    python bench/startup_timeline.py ../shared/models/squeezenet1_1.onnx 20

Arguments: model, tuning budget in seconds.
"""

import os
import sys
import tempfile
import time

T0 = time.perf_counter()
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))


def mark(s):
    print(f"{time.perf_counter() - T0:7.2f} {s}", flush=True)


from dynatune.cli import _quiet_env  # noqa: E402

_quiet_env()
from dynatune.run.callbacks import RunCallback  # noqa: E402
from dynatune.run.config import load_config  # noqa: E402

mark("config imported")
cfg = load_config(
    None,
    ["slot_s=20", "library.enabled=false"],
    model=sys.argv[1],
    budget=float(sys.argv[2]),
    work_dir=tempfile.mkdtemp(),
)
from dynatune.flows.startup import prestart  # noqa: E402

prestart()
mark("prestart done")
import dynatune.flows.tune_model as ftm  # noqa: E402

mark("flows imported (prefect)")


class Timeline(RunCallback):
    def on_start(self, run):
        mark(f"start: {len(run.tasks)} tasks, untuned estimate {run.untuned_estimate_s * 1e3:.2f} ms")

    def on_round(self, rec):
        mark(f"round {rec.round} ({rec.phase}) {rec.task_name}")

    def on_finish(self, summary, report_dir):
        mark("finish (compiled, report written)")


s = ftm.tune_model(cfg.to_dict(), callbacks=[Timeline()])
mark("flow returned")
