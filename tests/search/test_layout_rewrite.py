"""The weights' layout rewrite deferred from the search's schedules to the candidates built
(dynatune.search.layout_rewrite): real design spaces, real builds and measurements."""

import pytest
from test_analytic import conv_onnx, heaviest_task

PREPROC = "meta_schedule.layout_rewrite_preproc"  # the annotation RewriteLayout's own block carries


@pytest.fixture(scope="module")
def conv_task(cpu_target, tmp_path_factory):
    return heaviest_task(conv_onnx(tmp_path_factory.mktemp("m") / "conv.onnx"), cpu_target)


def deferring_session(task, target, work: str):
    """A real session sized for a few trials (batches of 4), its search deferring the layout rewrite."""
    from dynatune.search.measure import MeasureConfig
    from dynatune.search.session import SearchConfig, TuningSession

    search = SearchConfig(
        trials_per_iter=4, population_size=16, init_min_unmeasured=8, defer_layout_rewrite=True
    )
    return TuningSession(
        [task], target, work, search=search, measure=MeasureConfig(repeat=3, min_repeat_ms=5)
    )


def names(postprocs) -> list[str]:
    return [type(p).__name__ for p in postprocs]


def searched_candidates(task, target, n=6):
    """``n`` random candidates of the task's design space as the deferring search draws them, and the
    postprocessors deferred."""
    from tvm.s_tir import meta_schedule as ms

    from dynatune.search.sampled import sampled_candidates
    from dynatune.search.space import search_space

    generator, deferred = search_space(task.mod, target, defer_layout_rewrite=True)
    ctx = ms.TuneContext(mod=task.mod, target=target, space_generator=generator, num_threads=1)
    spaces = ctx.generate_design_space()
    return sampled_candidates(task.mod, spaces, ctx.space_generator.postprocs, n, seed=3), deferred, ctx


def test_the_search_leaves_out_only_the_layout_rewrite(conv_task, cpu_target):
    from tvm.s_tir import meta_schedule as ms

    from dynatune.search.space import post_order_apply

    full = ms.TuneContext(
        mod=conv_task.mod, target=cpu_target, space_generator=post_order_apply(conv_task.mod, cpu_target)
    ).space_generator.postprocs
    _, deferred, ctx = searched_candidates(conv_task, cpu_target, n=0)
    assert names(full)[-1] == "RewriteLayout" and names(deferred) == ["RewriteLayout"]
    assert names(ctx.space_generator.postprocs) == names(full)[:-1]


def test_a_finished_candidate_is_the_schedule_metaschedule_would_have_built(conv_task, cpu_target):
    """Each candidate built is a rewritten copy: the search's schedule is left as it was (the cost model
    learns what it ranked), and the copy is structurally what all of MetaSchedule's postprocessors give the
    same decisions, weights re-laid and all."""
    from tvm.s_tir import meta_schedule as ms
    from tvm_ffi import structural_hash

    from dynatune.search.layout_rewrite import finish_candidates
    from dynatune.search.reapply import reapply
    from dynatune.search.space import post_order_apply

    cands, deferred, _ = searched_candidates(conv_task, cpu_target)
    before = [structural_hash(c.sch.mod) for c in cands]
    finished = finish_candidates(cands, deferred)
    assert len(finished) == len(cands) >= 4
    assert [structural_hash(c.sch.mod) for c in cands] == before
    full = ms.TuneContext(
        mod=conv_task.mod, target=cpu_target, space_generator=post_order_apply(conv_task.mod, cpu_target)
    ).space_generator.postprocs
    for c, f in zip(cands, finished):
        assert PREPROC not in str(c.sch.trace) and PREPROC in str(f.sch.trace)
        whole = reapply(conv_task.mod, c.sch.trace, full)
        assert structural_hash(f.sch.mod) == structural_hash(whole.mod)
        weights = [list(a.shape) for a in c.args_info], [list(a.shape) for a in f.args_info]
        assert weights[0] != weights[1]  # the weight is an argument in its packed layout
    assert finish_candidates(cands, []) == cands  # nothing deferred: built as they are
    threaded = finish_candidates(cands, deferred, threads=2)  # two at a time: the same, in the same order
    assert [structural_hash(c.sch.mod) for c in threaded] == [structural_hash(c.sch.mod) for c in finished]


@pytest.mark.slow
def test_a_rejected_candidate_fails_alone_and_records_relearn_as_the_search_ranks_them(
    conv_task, cpu_target, tmp_path
):
    """A schedule the deferred rewrite rejects is recorded as a failed build; the rest of its batch is built,
    measured and recorded with the rewrite in its trace (the compile applies it). What a cost model started
    afresh (a work dir resumed without its cost model) learns from such a record is the candidate before its
    rewrite, as the search ranks its own, and finishing it gives the recorded schedule back. (One session:
    each real tuning session costs the suite seconds.)"""
    from tvm.ir.utils import derived_object
    from tvm.s_tir.meta_schedule.postproc import PyPostproc
    from tvm_ffi import structural_hash

    from dynatune.search.database import FAILED
    from dynatune.search.layout_rewrite import REJECTED, finish_candidates

    session = deferring_session(conv_task, cpu_target, str(tmp_path / "work"))
    calls = []

    @derived_object
    class RejectSecond(PyPostproc):
        def _initialize_with_tune_context(self, context) -> None:
            pass

        def apply(self, sch) -> bool:
            calls.append(1)
            return len(calls) != 2

    try:
        ctx = session._context(0)
        deferred = session._deferred[0]
        session._deferred[0] = deferred + [RejectSecond()]
        res = session.tune(0, trials=4, batch=4)
        records = session.db.memory.get_top_k(session.db.workload(conv_task.key, conv_task.mod), 100)
        assert res.trials == 4 and res.build_errors == 1 and res.run_errors == 0
        assert any(REJECTED in e for e in res.errors)
        measured = [r for r in records if float(r.run_secs[0]) < FAILED]
        assert len(measured) == 3 and all(PREPROC in str(r.trace) for r in measured)
        for r in measured:
            searched = session._as_searched(ctx, r, deferred)
            assert PREPROC not in str(searched.sch.trace)
            again = finish_candidates([searched], deferred)[0]
            assert structural_hash(again.sch.mod) == structural_hash(r.as_measure_candidate().sch.mod)
    finally:
        session.close()
