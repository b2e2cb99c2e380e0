"""What one schedule of the evolutionary search costs, step by step, for a task's design space and two
variants of where a padded convolution's padding goes (issue #29: the search's per-schedule C++ work).

    python bench/schedule_cost.py ../shared/models/squeezenet1_1.onnx --task fused_conv2d7_add4_relu41 \
        --samples 40 [--records WORK_DIR]

For each ``--task`` and space, ``--samples`` schedules are drawn as the search's initial population draws
them (a design space's trace replayed with fresh decisions), then each of MetaSchedule's postprocessors
runs on them in turn and the features the cost model reads are extracted; ms per schedule, one thread.
Spaces: ``sampled`` (the session's: MetaSchedule samples the padding's compute location), ``inlined``
(AutoInline allowed to inline the padding), ``root`` (no compute location sampled: the padding in a pass
of its own). With ``--records``, the tuned work dir's records of each task are grouped by the padding's
sampled location (``-2`` inlined, ``-1`` root, ``k`` the k-th loop), each with its best latency relative to
the task's best.
"""

from __future__ import annotations

import argparse
import collections
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

SPACES = ("sampled", "inlined", "root")


def space_generator(mod, target, space: str):
    from tvm.s_tir import meta_schedule as ms

    from dynatune.search.space import post_order_apply

    rules = list(post_order_apply(mod, target).sch_rules)
    if space == "inlined":
        rules = [_inlining_padding(r) if isinstance(r, ms.schedule_rule.AutoInline) else r for r in rules]
    elif space == "root":
        rules = [r for r in rules if not isinstance(r, ms.schedule_rule.RandomComputeLocation)]
    return ms.space_generator.PostOrderApply(
        sch_rules=rules, postprocs="from-target", mutator_probs="from-target"
    )


def _inlining_padding(rule):
    from tvm.s_tir import meta_schedule as ms

    return ms.schedule_rule.AutoInline(
        into_producer=bool(rule.into_producer),
        into_consumer=bool(rule.into_consumer),
        inline_const_tensor=bool(rule.inline_const_tensor),
        disallow_if_then_else=False,
        require_injective=bool(rule.require_injective),
        require_ordered=bool(rule.require_ordered),
        disallow_op=[str(op.name) for op in rule.disallow_op],
    )


def schedule_costs(task, target, space: str, samples: int) -> dict[str, float]:
    """ms per schedule: the replay, each postprocessor, the features."""
    from tvm.s_tir import Schedule
    from tvm.s_tir import meta_schedule as ms
    from tvm.s_tir.meta_schedule.feature_extractor import PerStoreFeature
    from tvm.s_tir.schedule import Trace

    from dynatune.search.replay import measure_candidate

    ctx = ms.TuneContext(
        mod=task.mod, target=target, space_generator=space_generator(task.mod, target, space)
    )
    spaces, postprocs = ctx.generate_design_space(), ctx.space_generator.postprocs
    seconds: dict[str, list[float]] = collections.defaultdict(list)
    candidates = []
    for k in range(samples):
        trace = Trace(spaces[k % len(spaces)].trace.insts, {})  # no decisions: each drawn afresh
        t0 = time.perf_counter()
        sch = Schedule(task.mod, seed=k + 1, debug_mask="none")
        trace.apply_to_schedule(sch, remove_postproc=True)
        seconds["replay"].append(time.perf_counter() - t0)
        sch.enter_postproc()
        for p in postprocs:
            t0 = time.perf_counter()
            ok = p.apply(sch)
            seconds[type(p).__name__].append(time.perf_counter() - t0)
            if not ok:
                break
        else:
            candidates.append(measure_candidate(sch))
    t0 = time.perf_counter()
    PerStoreFeature().extract_from(ctx, candidates)
    out = {k: 1e3 * sum(v) / samples for k, v in seconds.items()}
    out["features"] = 1e3 * (time.perf_counter() - t0) / max(1, len(candidates))
    out["total"] = sum(out.values())
    out["valid"] = len(candidates) / samples
    return out


def locations(task, db) -> list[tuple]:
    """(the padding's sampled locations, records, best latency / the task's best), best first."""
    by: dict[tuple, list[float]] = collections.defaultdict(list)
    for r in db.memory.get_top_k(db.workload(task.key, task.mod), 1 << 30):
        chosen = tuple(
            int(r.trace.decisions[i]) for i in r.trace.insts if i.kind.name == "SampleComputeLocation"
        )
        by[chosen].append(statistics.median(float(x) for x in r.run_secs) if r.run_secs else float("inf"))
    if not by or all(not k for k in by):
        return []
    best = min(min(v) for v in by.values())
    return sorted(((k, len(v), min(v) / best) for k, v in by.items()), key=lambda x: x[2])


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("model")
    ap.add_argument("--task", action="append", required=True)
    ap.add_argument("--samples", type=int, default=40)
    ap.add_argument("--records", default=None, help="a tuned work dir of the model")
    args = ap.parse_args(argv)

    from dynatune.machine.target import make_target
    from dynatune.model.extract import extract_tasks
    from dynatune.model.importer import load_model

    target = make_target()
    tasks = {t.name: t for t in extract_tasks(load_model(args.model), target)}
    for name in args.task:
        for space in SPACES:
            c = schedule_costs(tasks[name], target, space, args.samples)
            steps = " ".join(
                f"{k} {v:.2f}" for k, v in c.items() if k not in ("total", "valid") and v >= 0.05
            )
            print(f"{name} {space:8} total {c['total']:5.1f} ms/schedule ({steps}; valid {c['valid']:.0%})")
    if args.records:
        from dynatune.files import WorkDir
        from dynatune.search.database import TuningDatabase

        db = TuningDatabase(WorkDir(args.records).db, read_only=True)
        for name, task in tasks.items():
            if rows := locations(task, db):
                print(f"{name}: " + ", ".join(f"{k}: {n} records, best {b:.2f}x" for k, n, b in rows[:6]))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
