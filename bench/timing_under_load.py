"""The side-by-side timing on quiet cores and with one core busy: does the ratio hold, is the load flagged?

    python bench/timing_under_load.py MODEL.so MODEL.onnx [--repo OTHER_CHECKOUT] [--rounds 9]

Times the same compiled model against ONNX Runtime (``time_in_fresh_process`` of the checkout given, this
one by default) twice: on quiet cores, then with a Python busy loop pinned to the last core. Prints TVM's
and ONNX Runtime's medians, the ratio, and the load flag (checkouts before issue #28 have none).
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

TIME = """
import statistics, sys
from dynatune.compiler.fresh_timing import time_in_fresh_process
from dynatune.model.importer import load_model
t = time_in_fresh_process(sys.argv[1], load_model(sys.argv[2], {}), threads=2, rounds=int(sys.argv[3]))
d = t.as_dict()
flag = {k: d.get(k) for k in ("under_load", "load_cores", "attempts")}
print(f"TVM {statistics.median(t.tvm_ms):.3f} ms, ONNX Runtime {statistics.median(t.ort_ms):.3f} ms, "
      f"ratio {t.ratio_median:.3f}, {flag}")
"""

BUSY = "import os; os.sched_setaffinity(0, {max(os.sched_getaffinity(0))})\nwhile True: pass"


def timed(repo: str, artifact: str, onnx: str, rounds: int) -> str:
    env = dict(os.environ, PYTHONPATH=repo)
    out = subprocess.run(
        [sys.executable, "-c", TIME, artifact, onnx, str(rounds)],
        cwd=repo,
        env=env,
        capture_output=True,
        text=True,
        check=True,
    )
    return out.stdout.strip().splitlines()[-1]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("artifact")
    ap.add_argument("onnx")
    ap.add_argument("--repo", default=ROOT)
    ap.add_argument("--rounds", type=int, default=9)
    args = ap.parse_args()
    artifact, onnx = os.path.abspath(args.artifact), os.path.abspath(args.onnx)
    print("quiet:", timed(args.repo, artifact, onnx, args.rounds), flush=True)
    busy = subprocess.Popen([sys.executable, "-c", BUSY])
    try:
        time.sleep(1)
        print("busy core:", timed(args.repo, artifact, onnx, args.rounds), flush=True)
    finally:
        busy.kill()


if __name__ == "__main__":
    main()
