"""Why the run times its model against ONNX Runtime in a fresh process: a busy Python thread in the timing
process (as Prefect's and MLflow's workers are in a tuning run) slows ONNX Runtime's side, a Python loop
of ``sess.run`` calls that needs the GIL after every call, but not TVM's side, which loops in C++.

    python bench/inprocess_timing_bias.py --model ../shared/models/transformer_tiny.onnx

Times the untuned compiled model against ONNX Runtime side by side: in this process while a background
thread spins for 0, 10 and 30 % of every 10 ms, and in a fresh process
(``dynatune.compiler.fresh_timing``) at the same moments. Prints one line per condition (medians over
alternating rounds).
"""

from __future__ import annotations

import argparse
import os
import sys
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


class BusyThread:
    """A Python thread that spins for ``duty`` of every 10 ms, holding the GIL while it spins."""

    def __init__(self, duty: float):
        self.duty, self.stop = duty, False
        self.thread = threading.Thread(target=self._loop, daemon=True)

    def _loop(self):
        while not self.stop:
            t0 = time.perf_counter()
            while time.perf_counter() - t0 < 0.01 * self.duty:
                pass
            time.sleep(0.01 * (1 - self.duty))

    def __enter__(self):
        if self.duty > 0:
            self.thread.start()
        return self

    def __exit__(self, *exc):
        self.stop = True
        if self.thread.is_alive():
            self.thread.join()


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", required=True)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--artifact", default="/tmp/dynatune-timing-bias/model.so")
    args = ap.parse_args(argv)

    import tvm

    from dynatune.compiler.compile import build, export
    from dynatune.compiler.execution import onnxruntime_session, relax_vm
    from dynatune.compiler.fresh_timing import time_in_fresh_process
    from dynatune.compiler.timing import time_side_by_side
    from dynatune.machine.target import make_target, usable_cores
    from dynatune.model.importer import load_model

    model, target, dev = load_model(args.model), make_target(), tvm.cpu()
    os.makedirs(os.path.dirname(args.artifact), exist_ok=True)
    executable = build(model, target, None)
    artifact = export(executable, args.artifact)
    vm, inputs = relax_vm(executable, dev), model.random_inputs(0)
    sess = onnxruntime_session(model, usable_cores())
    for duty in (0.0, 0.1, 0.3):
        with BusyThread(duty):
            for where, timing in (
                ("in-process", lambda: time_side_by_side(vm, sess, inputs, dev, rounds=args.rounds)),
                ("fresh process", lambda: time_in_fresh_process(artifact, model, rounds=args.rounds)),
            ):
                t = timing()
                print(
                    f"busy thread {duty:4.0%}  {where:13s}  TVM {t.tvm_median_ms:8.3f} ms  "
                    f"ORT {t.ort_median_ms:7.3f} ms  ratio {t.ratio_median:6.2f}",
                    flush=True,
                )
    return 0


if __name__ == "__main__":
    sys.exit(main())
