"""Where a thread's wall time goes, from a sampling profiler's stacks (issue #29: a candidate's life).

    py-spy record --idle --threads --format raw --rate 40 -o spy.txt -- \
        python -m dynatune.cli tune /tmp/bench_cfg.yaml --model M.onnx --budget 120
    python bench/stack_shares.py spy.txt --under "TuningSession.tune (" [--thread MainThread] [--top 60]

``--idle`` keeps the samples where the thread waits (for the build workers, for the runner), so the
shares are of wall time. Only the samples of ``--thread`` whose stack passes through a frame containing
``--under`` count; each frame at or below it gets the time of every sample it is on (inclusive time),
once per sample. py-spy is not one of dynatune's dependencies: install it where you profile.
"""

from __future__ import annotations

import argparse
import collections
import re


def inclusive_seconds(lines, under: str, thread: str, rate: float) -> tuple[float, collections.Counter]:
    """(seconds under the anchor, {frame: inclusive seconds}) from py-spy's raw lines."""
    seconds: collections.Counter = collections.Counter()
    total = 0
    for line in lines:
        stack, _, count = line.rstrip("\n").rpartition(" ")
        frames = stack.split(";")
        where = next((k for k, f in enumerate(frames) if f.startswith("thread (")), None)
        if where is None or thread not in frames[where]:
            continue
        names = [re.sub(r":\d+\)$", ")", f) for f in frames[where + 1 :]]
        anchors = [k for k, f in enumerate(names) if under in f]
        if not anchors:
            continue
        total += int(count)
        for frame in dict.fromkeys(names[anchors[-1] :]):
            seconds[frame] += int(count)
    return total / rate, collections.Counter({f: n / rate for f, n in seconds.items()})


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("raw", help="py-spy's --format raw output")
    ap.add_argument("--under", required=True, help="count the samples whose stack has this frame")
    ap.add_argument("--thread", default="MainThread")
    ap.add_argument("--rate", type=float, default=40.0, help="py-spy's --rate")
    ap.add_argument("--top", type=int, default=60)
    args = ap.parse_args()
    with open(args.raw) as f:
        total, seconds = inclusive_seconds(f, args.under, args.thread, args.rate)
    print(f"{total:.1f} s under {args.under!r}")
    for frame, s in seconds.most_common(args.top):
        print(f"{s:8.1f} s {100 * s / total:5.1f} %  {frame}")


if __name__ == "__main__":
    main()
