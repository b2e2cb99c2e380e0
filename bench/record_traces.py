"""Record per-task tuning traces for the replay benchmark, several search seeds per task; resumable.

Each task of the model is tuned alone, batch after batch, for ``--seconds-per-task`` seconds, once per
seed; after every batch we record (tuning seconds so far, trials so far, best latency so far). The model's
tasks are those a run extracts (same lowering, search and measurement settings as ``--config``). The
traces are committed as data (``dynatune/bench/data/traces/<model>.json``) and replayed by
``dynatune bench replay``.

Run it again with the same arguments to go on where it stopped (after a kill too): the document is written
after every task, and each seed's session lives in ``--work-root``/<model>/seed<N>.

    python -m bench.record_traces ../shared/models/squeezenet1_1.onnx --protocol fixed --seeds 0 1 2 \\
        --seconds-per-task 20 [--trials-per-iter 8] [--config C] [--out-dir dynatune/bench/data/traces]

The measurement protocol is stated (``--protocol``, one of :data:`bench.harness.PROTOCOLS`; the committed
traces were measured with the fixed one), over whatever ``--config`` says of ``measure``.
"""

from __future__ import annotations

import os
import sys

from bench.harness import PROTOCOLS, parser, protocol_sets, stem
from dynatune.bench.traces import TRACE_DIR, record, traces_per_task
from dynatune.errors import DynatuneError
from dynatune.model.importer import parse_shape
from dynatune.run.config import load_config


def main(argv=None) -> int:
    ap = parser(__doc__)
    ap.add_argument("models", nargs="+")
    ap.add_argument("--shape", action="append", default=[])
    ap.add_argument("--config", default=None, help="run config whose search/measure/compile settings to use")
    ap.add_argument("--protocol", required=True, choices=sorted(PROTOCOLS), help="measurement protocol")
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    ap.add_argument("--seconds-per-task", type=float, default=20.0)
    ap.add_argument("--trials-per-iter", type=int, default=8)
    ap.add_argument("--out-dir", default=TRACE_DIR)
    ap.add_argument(
        "--work-root", default=os.path.join(os.path.expanduser("~"), ".cache", "dynatune", "traces")
    )
    args = ap.parse_args(argv)
    os.makedirs(args.out_dir, exist_ok=True)
    try:
        for path in args.models:
            cfg = load_config(
                args.config,
                [f"search.trials_per_iter={args.trials_per_iter}", *protocol_sets(args.protocol)],
                model=path,
                shapes=dict(parse_shape(s) for s in args.shape) or None,
            )
            name = stem(path)
            doc = record(
                cfg,
                args.seeds,
                args.seconds_per_task,
                os.path.join(args.out_dir, name + ".json"),
                os.path.join(args.work_root, name),
                log=lambda m: print(m, flush=True),
            )
            print(f"{name}: {traces_per_task(doc)} traces per task", flush=True)
    except DynatuneError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
