"""Index inputs (take, gather, embedding lookups) are measured with valid indices, and a task whose default
schedule really fails is left out of the estimate by name, never counted as infinite."""

import math

import numpy as np
import pytest
from helpers import make_embedding_onnx

from dynatune.model.extract import extract_tasks
from dynatune.model.importer import load_model
from dynatune.search.index_args import args_key, bounds_by_args, index_bounds
from dynatune.search.measure import MeasureConfig
from dynatune.search.session import TuningSession

VOCAB = 50
FAST = MeasureConfig(repeat=2, min_repeat_ms=1)


@pytest.fixture(scope="module")
def embedding_tasks(cpu_target, tmp_path_factory):
    model = load_model(make_embedding_onnx(str(tmp_path_factory.mktemp("m") / "emb.onnx"), vocab=VOCAB))
    return extract_tasks(model, cpu_target)


def _take(tasks):
    return next(t for t in tasks if t.name.startswith("take"))


def test_take_task_of_an_onnx_gather_has_its_ids_bounded_by_the_table(embedding_tasks):
    take = _take(embedding_tasks)
    func = take.mod["main"]
    ((pos, high),) = index_bounds(func).items()
    assert str(func.params[pos].dtype) == "int64" and high == VOCAB
    # the other tasks (conv, the negative-index `where`, transpose/reshape) have no index arguments
    assert all(index_bounds(t.mod["main"]) == {} for t in embedding_tasks if t is not take)


def _te_func(build):
    from tvm import te

    table = te.placeholder((VOCAB, 8), "float32", "table")
    ids = te.placeholder((4, 6), "int64", "ids")
    return te.create_prim_func([table, ids, build(table, ids)])


@pytest.mark.parametrize(
    "case, high", [("clip", VOCAB), ("wrap", VOCAB), ("gather_axis1", 8), ("through_where", VOCAB)]
)
def test_bound_found_through_clamps_and_intermediate_buffers(case, high):
    """Legalized ops wrap the index in min/max/if_then_else, or compute it into an intermediate buffer."""
    from tvm import te, tirx, topi

    def where(ids):
        return te.compute(
            ids.shape, lambda i, j: tirx.Select(ids[i, j] < 0, ids[i, j] + VOCAB, ids[i, j]), "w"
        )

    build = {
        "clip": lambda a, i: topi.take(a, i, axis=0, mode="clip"),
        "wrap": lambda a, i: topi.take(a, i, axis=0, mode="wrap"),
        "gather_axis1": lambda a, i: topi.gather(a, 1, i),
        "through_where": lambda a, i: topi.take(a, where(i), axis=0),
    }[case]
    assert index_bounds(_te_func(build)) == {1: high}


def test_allocator_fills_index_arguments_in_range(embedding_tasks):
    """What the runner worker does: index arguments in [0, high), cached per task and per bounds."""
    import tvm
    from tvm.s_tir.meta_schedule.arg_info import ArgInfo

    from dynatune.search.measure import _ARGS_CACHE, cached_alloc_argument

    take = _take(embedding_tasks)
    args_info = ArgInfo.from_prim_func(take.mod["main"])
    hints = bounds_by_args([(args_info, index_bounds(take.mod["main"]))])
    args_json = tuple(a.as_json() for a in args_info)
    assert list(hints) == [args_key(args_json)]
    ((pos, _),) = hints[args_key(args_json)]
    _ARGS_CACHE.clear()
    repeated = cached_alloc_argument(tvm.cpu(), args_json, 2, index_bounds=hints)
    for args in repeated:
        ids = args[pos].numpy()
        assert ids.min() >= 0 and ids.max() < VOCAB and len(np.unique(ids)) > 1
    assert (
        cached_alloc_argument(tvm.cpu(), args_json, 2, index_bounds=hints) is repeated
    )  # shared by candidates
    random_ids = cached_alloc_argument(tvm.cpu(), args_json, 2)[0][
        pos
    ].numpy()  # no hints: MetaSchedule's fill
    assert random_ids.min() < 0 or random_ids.max() >= VOCAB


def test_take_default_schedule_measures_finite(embedding_tasks, cpu_target, tmp_path):
    """All defaults in one batch, the take task among them, in MetaSchedule's real runner worker."""
    sess = TuningSession(embedding_tasks, cpu_target, str(tmp_path / "work"), measure=FAST, num_workers=1)
    try:
        defaults = sess.measure_defaults()
        assert all(math.isfinite(d) and d > 0 for d in defaults.values()), {
            t.name: sess.state(t.index).note for t in embedding_tasks
        }
        assert sess.excluded_tasks() == [] and math.isfinite(sess.estimated_latency())
    finally:
        sess.close()


def test_estimate_leaves_out_a_failed_task_and_names_it(embedding_tasks, cpu_target, tmp_path):
    from dynatune.run.report import markdown_report

    sess = TuningSession(embedding_tasks, cpu_target, str(tmp_path / "work"), measure=FAST, num_workers=1)
    try:
        failed = _take(embedding_tasks)
        for t in embedding_tasks:  # as if measured: the take task's default schedule crashed the runner
            sess.state(t.index).default_s = math.inf if t is failed else 1e-3 * (t.index + 1)
        expected = sum(t.weight * 1e-3 * (t.index + 1) for t in embedding_tasks if t is not failed)
        assert sess.estimated_latency() == pytest.approx(expected)
        assert sess.untuned_estimated_latency() == pytest.approx(expected)
        assert sess.excluded_tasks() == [failed.name]
    finally:
        sess.close()
    text = markdown_report(
        {"model": "emb.onnx", "estimated_latency_ms": expected * 1e3, "estimate_excludes": [failed.name]},
        [],
        str(tmp_path / "report.md"),
    )
    assert (
        "leaves out 1 task(s) with no measured latency (default schedule failed, no tuned record): "
        f"{failed.name}" in text
    )
