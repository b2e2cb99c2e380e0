"""Start-up timeline of the pipeline (what `dynatune tune` does), one line per stage.

    python bench/startup_timeline.py ../shared/models/squeezenet1_1.onnx 20

Arguments: model, tuning budget in seconds.
"""
import time, sys, os, json, tempfile
T0 = time.perf_counter()
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), '..'))
def mark(s): print(f"{time.perf_counter()-T0:7.2f} {s}", flush=True)
from dynatune.cli import _quiet_env
_quiet_env()
from dynatune.config import load_config
mark("config imported")
cfg = load_config(None, ["slot_s=20"], model=sys.argv[1], budget=float(sys.argv[2]), work_dir=tempfile.mkdtemp())
from flows.startup import prestart
prestart()
mark('prestart done')
import flows.tune_model as ftm
mark("flows imported (prefect)")
ftm.LISTENERS.append(lambda e, p: mark("event " + e))
import tasks.tracking as tr
orig_init = tr.Tracker.__init__
def init(self, *a, **k):
    mark("tracker init start"); orig_init(self, *a, **k); mark("tracker init done")
tr.Tracker.__init__ = init
import flows.tune_model
flows.tune_model.Tracker = tr.Tracker
orig_fin = ftm._finish
def fin(*a, **k):
    mark("finish start"); orig_fin(*a, **k); mark("finish done")
ftm._finish = fin
orig_cv = ftm.compile_verify
s = ftm.tune_model(cfg.to_dict())
mark("flow returned")
