"""Seconds to import TVM's tensor-intrinsic registry: plain ``import tvm.s_tir.tensor_intrin`` vs
:func:`dynatune.search.intrinsics.import_tensor_intrinsics`, each in a fresh process, bare and with Prefect
and MLflow imported first (as in a flow run). TVM itself is imported before the clock starts.

    python bench/intrinsics_import.py [--repeat 1]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

CHILD = """
import sys, time
import tvm  # noqa: F401
if {with_prefect}:
    import mlflow, prefect  # noqa: F401
t0 = time.perf_counter()
if {light}:
    from dynatune.search.intrinsics import import_tensor_intrinsics
    import_tensor_intrinsics()
else:
    import tvm.s_tir.tensor_intrin  # noqa: F401
print(time.perf_counter() - t0)
"""


def timed(light: bool, with_prefect: bool) -> float:
    out = subprocess.run(
        [sys.executable, "-c", CHILD.format(light=light, with_prefect=with_prefect)],
        cwd=ROOT,
        env=dict(os.environ, PYTHONPATH=ROOT),
        capture_output=True,
        text=True,
        check=True,
    )
    return float(out.stdout.strip().splitlines()[-1])


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--repeat", type=int, default=1)
    args = ap.parse_args(argv)
    rows = {}
    for with_prefect in (False, True):
        for light in (False, True):
            name = f"{'light' if light else 'plain'}{' + prefect, mlflow' if with_prefect else ''}"
            rows[name] = [round(timed(light, with_prefect), 2) for _ in range(args.repeat)]
    print(json.dumps(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
