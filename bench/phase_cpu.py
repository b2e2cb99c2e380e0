"""How busy both cores are in each phase of tuning (issue #29: is there idle time to overlap phases?).

    python bench/phase_cpu.py tune /tmp/bench_cfg.yaml --model M.onnx --budget 240 [--out F.json]

Runs ``dynatune`` with the given arguments in this process, the tuning session's search (its next batch),
build and measure calls wrapped so that each label the time they run, and samples ``/proc/stat`` every
20 ms: per phase, its seconds and the share of both cores that was busy. Writes ``--out`` (JSON).
"""

from __future__ import annotations

import collections
import json
import os
import sys
import threading
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

OUT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "results", "phase_cpu.json")


class Phases:
    """The phase the tuning thread is in, set by wrapped methods, and the CPU samples of each."""

    def __init__(self):
        self.current, self.tuning = "other", False
        self.samples = collections.defaultdict(lambda: [0, 0, 0.0])  # busy, total jiffies, seconds

    def labelled(self, label: str, call):
        """``call``, run in the phase ``label``."""

        def wrapped(*args, **kwargs):
            before, self.current = self.current, label
            try:
                return call(*args, **kwargs)
            finally:
                self.current = before

        return wrapped

    def wrap(self, owner, name: str, label: str) -> None:
        setattr(owner, name, self.labelled(label, getattr(owner, name)))

    def sample(self, stop: threading.Event, every_s: float = 0.02) -> None:
        busy0, total0 = _cpu()
        t0 = time.perf_counter()
        while not stop.wait(every_s):
            busy1, total1 = _cpu()
            t1 = time.perf_counter()
            s = self.samples[self.current if self.tuning else "outside tuning"]
            s[0], s[1], s[2] = s[0] + busy1 - busy0, s[1] + total1 - total0, s[2] + t1 - t0
            busy0, total0, t0 = busy1, total1, t1

    def table(self) -> dict:
        return {p: {"seconds": s[2], "busy": s[0] / s[1] if s[1] else None} for p, s in self.samples.items()}


class LabelledBuilder:
    """A session's builder whose ``build`` runs in the "build" phase."""

    def __init__(self, inner, phases: Phases):
        self.inner, self.phases = inner, phases

    def __getattr__(self, name):
        return getattr(self.inner, name)

    def build(self, *args, **kwargs):
        return self.phases.labelled("build", self.inner.build)(*args, **kwargs)


def _cpu() -> tuple[int, int]:
    """(busy, total) jiffies of all cores."""
    with open("/proc/stat") as f:
        values = [int(x) for x in f.readline().split()[1:]]
    idle = values[3] + values[4]
    return sum(values) - idle, sum(values)


def main() -> int:
    from dynatune.cli import main as dynatune
    from dynatune.search import session

    argv = sys.argv[1:]
    out = OUT
    if "--out" in argv:
        k = argv.index("--out")
        out, argv = argv[k + 1], argv[:k] + argv[k + 2 :]
    phases = Phases()
    cls = session.TuningSession
    phases.wrap(cls, "_next_batch", "search")
    phases.wrap(cls, "_first_batch", "search")
    phases.wrap(cls, "_build_and_run", "measure")  # its build is labelled inside it
    init, tune = cls.__init__, cls.tune

    def init_with_labelled_builder(self, *args, **kwargs):
        init(self, *args, **kwargs)
        self.builder = LabelledBuilder(self.builder, phases)

    def tune_labelled(self, *args, **kwargs):
        phases.tuning = True
        try:
            return tune(self, *args, **kwargs)
        finally:
            phases.tuning = False

    cls.__init__, cls.tune = init_with_labelled_builder, tune_labelled
    stop = threading.Event()
    sampler = threading.Thread(target=phases.sample, args=(stop,), daemon=True)
    sampler.start()
    rc = dynatune(argv)
    stop.set()
    sampler.join()
    table = phases.table()
    print(json.dumps(table, indent=1))
    with open(out, "w") as f:
        json.dump(table, f, indent=1)
    return rc


if __name__ == "__main__":
    sys.exit(main())
