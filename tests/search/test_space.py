"""The search space: MetaSchedule's own rules for the target, unrolled by the session's steps (real TVM)."""

from __future__ import annotations

import pytest

from tests.search.test_analytic import conv_onnx, heaviest_task, x86_target


def unroll_choices(space) -> list[list[int]]:
    """The unroll steps each ``SampleCategorical`` of a design space's trace chooses from."""
    return [[int(v) for v in i.attrs[0]] for i in space.trace.insts if i.kind.name == "SampleCategorical"]


@pytest.mark.parametrize("isa", ["avx2", "avx512"])
def test_the_space_unrolls_by_the_steps_asked_and_keeps_the_rest(isa, tmp_path):
    from tvm.s_tir import meta_schedule as ms

    from dynatune.search.space import UNROLL_STEPS, post_order_apply

    target = x86_target(isa)
    task = heaviest_task(conv_onnx(tmp_path / "m.onnx"), target)

    def spaces(generator):
        ctx = ms.TuneContext(mod=task.mod, target=target, space_generator=generator, num_threads=1)
        return ctx.generate_design_space(), ctx.space_generator

    theirs, their_generator = spaces("post-order-apply")
    ours, generator = spaces(post_order_apply(task.mod, target, UNROLL_STEPS))
    assert [unroll_choices(s) for s in theirs] == [[[0, 16, 64, 512]]] * len(theirs)
    assert [unroll_choices(s) for s in ours] == [[list(UNROLL_STEPS)]] * len(ours)
    # the same rules, postprocessors and mutators otherwise: the same design spaces, but for the unroll
    assert [type(r).__name__ for r in generator.sch_rules] == [
        type(r).__name__ for r in their_generator.sch_rules
    ]
    assert [type(p).__name__ for p in generator.postprocs] == [
        type(p).__name__ for p in their_generator.postprocs
    ]
    assert len(ours) == len(theirs)
    all_steps, _ = spaces(post_order_apply(task.mod, target, (0, 16, 64, 512)))
    assert [steps(s) for s in all_steps] == [steps(s) for s in theirs]


def steps(space) -> list[str]:
    """A design space's instructions and their attributes (not the decisions sampled)."""
    return [f"{i.kind.name}{list(i.attrs)}" for i in space.trace.insts]


def test_a_task_that_tiles_no_block_keeps_metaschedules_unroll_steps(tmp_path):
    """A pool (or a mean, a softmax) tiles no block: a small reduction unrolled whole (512 steps) ran 3.9x
    faster there, and its builds are cheap, so its space keeps MetaSchedule's own steps."""
    from helpers import make_maxpool_onnx
    from tvm.s_tir import meta_schedule as ms

    from dynatune.model.extract import extract_tasks
    from dynatune.model.importer import load_model
    from dynatune.search.space import post_order_apply, tiles_a_block

    target = x86_target("avx512")
    model = load_model(make_maxpool_onnx(str(tmp_path / "pool.onnx"), 32, size=16))
    pool = next(t for t in extract_tasks(model, target) if "pool" in t.name)
    ctx = ms.TuneContext(mod=pool.mod, target=target, space_generator=post_order_apply(pool.mod, target))
    spaces = ctx.generate_design_space()
    assert spaces and not any(tiles_a_block(s) for s in spaces)
    assert {tuple(c) for s in spaces for c in unroll_choices(s)} == {(0, 16, 64, 512)}


@pytest.mark.slow  # tunes (real builds and measurements)
def test_the_session_samples_only_the_configured_unroll_steps(cpu_target, tmp_path):
    from dynatune.model.extract import extract_tasks
    from dynatune.model.importer import load_model
    from dynatune.search.measure import MeasureConfig
    from dynatune.search.session import SearchConfig, TuningSession

    tasks = extract_tasks(load_model(conv_onnx(tmp_path / "m.onnx")), cpu_target)
    search = SearchConfig(trials_per_iter=4, population_size=16, unroll_steps=[0, 16])
    session = TuningSession(tasks, cpu_target, str(tmp_path / "work"), search=search, measure=MeasureConfig())
    try:
        res = session.tune(0, trials=8, batch=4)
        assert res.trials == 8 and res.build_errors == res.run_errors == 0
        unrolls = {
            int(v)
            for rec in session.db.memory.get_all_tuning_records()
            for v in _unroll_annotations(rec.trace)
        }
        assert unrolls and unrolls <= {0, 16}
    finally:
        session.close()


def _unroll_annotations(trace) -> list[int]:
    """The unroll steps a trace decided (its ``SampleCategorical`` decisions, as values)."""
    out = []
    for inst in trace.insts:
        if inst.kind.name == "SampleCategorical":
            decision = trace.decisions.get(inst)
            if decision is not None:
                out.append(int(inst.attrs[0][int(decision)]))
    return out


def test_unroll_steps_are_checked_in_the_config():
    from pydantic import ValidationError

    from dynatune.search.session import SearchConfig

    assert SearchConfig().unroll_steps == [0, 16, 64]
    with pytest.raises(ValidationError):
        SearchConfig(unroll_steps=[])
    with pytest.raises(ValidationError):
        SearchConfig(unroll_steps=[0, -16])
