"""Measurement protocols on one fixed candidate set: seconds per candidate, repeats per candidate (AdaTune's
adaptive measurement against the fixed protocol, issue #5).

    python -m bench.measure_protocols ../shared/models/squeezenet1_1.onnx [--tasks 3] [--trials 48]
    python -m bench.measure_protocols M.onnx --work-dir RUN     # a finished run's records instead

The candidates: the ``--tasks`` heaviest tasks (weight x FLOPs), each tuned for ``--trials`` trials under
the fixed protocol (or, with ``--work-dir``, the records a run measured for them), every record built once.
Then the same candidates run through the runner under each protocol of :data:`VARIANTS`, every field of
which is stated (a protocol left to ``MeasureConfig()``'s defaults became adaptive when the defaults did,
and this benchmark reported "fixed" at the adaptive protocol's cost for a while):

- ``fixed``: 5 repeats of >= 10 ms;
- ``adaptive4`` and ``adaptive2``: AdaTune's, repeats of >= 4 ms or >= 2 ms until settled (3 to 10), raced
  against the task's best;
- ``timing_off``: one repeat with no minimum time, the per-candidate overhead floor.

Reported per protocol: seconds per candidate, repeats per candidate, why measuring stopped (``fixed``,
``settled``, ``raced``, ``max_repeats``), and the protocol's settings; written to
``bench/results/measure_protocols.json``.
"""

from __future__ import annotations

import collections
import tempfile
import time

from bench.harness import PROTOCOLS, heaviest, load_tasks, measure_config, parser, results_path, write_json

VARIANTS = {
    "fixed": PROTOCOLS["fixed"],
    "adaptive4": PROTOCOLS["adaptive"],
    "adaptive2": PROTOCOLS["adaptive"] | {"adaptive_repeat_ms": 2},
    "timing_off": {"adaptive": False, "number": 1, "repeat": 1, "min_repeat_ms": 0},
}


def candidate_groups(model_path: str, tasks_n: int, trials: int, work_dir: str | None):
    """``(session, [(task, built candidates, its best latency)])``: the candidates every protocol times,
    built by the session (close it when they are timed: its builder's directory holds them)."""
    from tvm.s_tir.meta_schedule.builder import BuilderInput

    from dynatune.files import WorkDir
    from dynatune.search.database import TuningDatabase
    from dynatune.search.session import TuningSession

    model, target, tasks = load_tasks(model_path, work_dir=work_dir)
    picked = heaviest(tasks, tasks_n)
    sess = TuningSession(tasks, target, tempfile.mkdtemp(), measure=measure_config("fixed"))
    groups = []
    try:
        if work_dir is not None:  # the run's records, read only
            sess.import_records(TuningDatabase(WorkDir(work_dir).db, read_only=True), [t.key for t in picked])
        else:
            sess.warm_up()
            for t in picked:
                for _ in range(max(1, trials // 16)):
                    sess.tune(t.index, trials=min(16, trials))
        for t in picked:
            recs = sess.db.memory.get_top_k(sess.db.workload(t.key, t.mod), 1000)
            cands = [r.as_measure_candidate() for r in recs]
            built = sess.builder.build([BuilderInput(c.sch.mod, target) for c in cands])
            ok = [(c, b) for c, b in zip(cands, built) if b.error_msg is None]
            if ok:
                groups.append((t, ok, sess.best_latency(t.index)))
    except BaseException:
        sess.close()
        raise
    return sess, groups


def time_protocol(cfg, target, groups) -> dict:
    """The candidates measured under ``cfg``: seconds and repeats per candidate, and why each stopped."""
    from tvm.s_tir.meta_schedule.runner import RunnerInput

    from dynatune.machine.target import target_device
    from dynatune.search.measure import Runner, why_stopped

    dev = target_device(target)
    runner = Runner(cfg, target)
    runner.warm_up()
    seconds, n, repeats, stops = 0.0, 0, 0, collections.Counter()
    try:
        for _, ok, incumbent in groups:
            runner.set_incumbent(incumbent)
            t0 = time.perf_counter()
            futures = runner.run([RunnerInput(b.artifact_path, dev, c.args_info) for c, b in ok])
            results = [f.result() for f in futures]
            seconds += time.perf_counter() - t0
            n += len(ok)
            for res in results:
                secs = [float(s) for s in res.run_secs or []]
                repeats += len(secs)
                stops[why_stopped(cfg, secs, incumbent) if secs else "error"] += 1
    finally:
        runner.close()
    return {"s_per_candidate": seconds / n, "repeats_per_candidate": repeats / n, "stops": dict(stops)}


def main(argv=None) -> dict:
    ap = parser(__doc__)
    ap.add_argument("model")
    ap.add_argument("--tasks", type=int, default=3, help="the heaviest tasks whose candidates are timed")
    ap.add_argument("--trials", type=int, default=48, help="trials per task (fixed protocol, batches of 16)")
    ap.add_argument("--work-dir", help="a finished run's work dir: its records are the candidates")
    ap.add_argument("--out", default=results_path("measure_protocols.json"))
    args = ap.parse_args(argv)
    sess, groups = candidate_groups(args.model, args.tasks, args.trials, args.work_dir)
    n = sum(len(ok) for _, ok, _ in groups)
    print(f"{n} candidates of {len(groups)} tasks", flush=True)
    rows = {}
    try:
        for name, fields in VARIANTS.items():
            cfg = measure_config("adaptive" if fields["adaptive"] else "fixed", **fields)
            rows[name] = time_protocol(cfg, sess.target, groups) | {"settings": fields}
            r = rows[name]
            print(
                f"{name:>10}: {r['s_per_candidate']:.4f} s per candidate, "
                f"{r['repeats_per_candidate']:.2f} repeats, stopped {r['stops']}",
                flush=True,
            )
    finally:
        sess.close()
    fixed = rows["fixed"]["s_per_candidate"]
    for name, r in rows.items():
        r["vs_fixed"] = r["s_per_candidate"] / fixed
    out = {
        "model": args.model,
        "work_dir": args.work_dir,
        "candidates": n,
        "tasks": [t.name for t, _, _ in groups],
        "protocols": rows,
    }
    write_json(args.out, out)
    return out


if __name__ == "__main__":
    main()
