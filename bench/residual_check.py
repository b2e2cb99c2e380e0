"""Does the residual predict the model? For each periodic measurement after the first, compare the
model's time with two estimates made from the tasks alone, all timed in the same rounds:

- the plain estimate: Σ weight × task latency alone;
- the estimate plus the residual measured at the *previous* point (what the run's objective counts
  between two measurements).

    python bench/residual_check.py runs/mnasnet0_5 [more work dirs]
"""

from __future__ import annotations

import argparse
import json
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
from dynatune.files import WorkDir  # noqa: E402


def rows(work_dir: str) -> list[dict]:
    with open(WorkDir(work_dir).run_state) as f:
        points = [p for p in json.load(f).get("measurements", []) if p.get("residual_ms") is not None]
    out = []
    for prev, p in zip(points, points[1:]):
        model = p["same_time_model_ms"]
        out.append(
            {
                "elapsed_s": p["elapsed_s"],
                "model_ms": model,
                "plain_over_model": p["kernels_alone_ms"] / model,
                "with_residual_over_model": (p["kernels_alone_ms"] + prev["residual_ms"]) / model,
            }
        )
    return out


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("work_dirs", nargs="+")
    args = ap.parse_args(argv)
    print("| run | tuning s | model ms | plain estimate / model | + previous residual / model |")
    print("|---|---:|---:|---:|---:|")
    for d in args.work_dirs:
        for r in rows(d):
            print(
                f"| {os.path.basename(d.rstrip('/'))} | {r['elapsed_s']:.0f} | {r['model_ms']:.3f} | "
                f"{r['plain_over_model']:.3f} | {r['with_residual_over_model']:.3f} |"
            )


if __name__ == "__main__":
    main()
