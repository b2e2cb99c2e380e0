"""Outer reductions (``compile.outer_reduction``): a reduction over every axis but the innermost (a global
pooling in NHWC) is marked for dynatune's own schedule rule, whose design spaces (by channels, by slices)
compute it right whatever the search decides, and a tuned one matches ONNX Runtime."""

import random

import numpy as np
import pytest

from dynatune.model.extract import Lowering, extract_tasks
from dynatune.model.outer_reduction import RULE, mark, outer_reduction_space, register_rule


def _func(shape, reduce, axis, keepdims=True):
    from tvm import te

    x = te.placeholder(shape, "float32", name="x")
    return te.create_prim_func([x, reduce(x, axis=axis, keepdims=keepdims)])


def _sum(x, axis, keepdims):
    from tvm import topi

    return topi.sum(x, axis=axis, keepdims=keepdims)


def _max(x, axis, keepdims):
    from tvm import topi

    return topi.max(x, axis=axis, keepdims=keepdims)


def _mean(x, axis, keepdims):
    from tvm import topi

    return topi.divide(topi.sum(x, axis=axis, keepdims=keepdims), 192)  # 16 x 12 and 192 elements: a mean


def _marked(func) -> bool:
    return RULE in mark(func).script()


def test_a_global_pooling_in_nhwc_is_marked_and_other_reductions_are_not():
    assert _marked(_func((1, 16, 12, 24), _sum, [1, 2]))
    assert _marked(_func((1, 16, 12, 24), _max, [1, 2]))
    assert not _marked(_func((1, 64, 24), _sum, [2]))  # over the innermost axis (a softmax's, a norm's)
    assert not _marked(_func((1, 4, 4, 24), _sum, [1, 2]))  # 16 elements: MetaSchedule's rules
    assert not _marked(_func((4, 16, 12, 24), _sum, [1, 2]))  # a batch of 4: another kept axis
    func = _func((1, 64, 24), _sum, [2])
    assert mark(func).same_as(func)


@pytest.mark.parametrize(
    "reduce, shape, axis, keepdims",
    [
        (_mean, (1, 16, 12, 24), [1, 2], True),  # a global average pool in NHWC
        (_max, (1, 16, 12, 24), [1, 2], True),
        (_mean, (1, 192, 40), [1], False),  # a mean over a sequence's tokens, the axis dropped
    ],
    ids=["mean", "max", "tokens"],
)
def test_every_design_space_of_the_rule_computes_the_reduction(reduce, shape, axis, keepdims, cpu_target):
    """Both spaces (by channels, by slices), each with random decisions, built and run."""
    import tvm
    from tvm import s_tir
    from tvm.s_tir import meta_schedule as ms

    from dynatune.search.space import search_space

    mod = tvm.IRModule({"main": mark(_func(shape, reduce, axis, keepdims))})
    assert RULE in mod.script()
    generator, _ = search_space(mod, cpu_target)
    ctx = ms.TuneContext(mod=mod, target=cpu_target, space_generator=generator, num_threads=1)
    spaces = ctx.generate_design_space()
    assert len(spaces) == 2 and sum(i.kind.name == "RFactor" for s in spaces for i in s.trace.insts) == 1
    x = np.random.default_rng(0).standard_normal(shape).astype("float32")
    numpy_reduce = np.max if reduce is _max else np.mean
    want = numpy_reduce(x, axis=tuple(axis), keepdims=keepdims)
    rng, dev = random.Random(0), tvm.cpu()
    for space in spaces:
        for _ in range(3):
            trace = space.trace
            for inst in (i for i in trace.insts if i.kind.name == "SampleCategorical"):
                trace = trace.with_decision(inst, rng.randrange(len(inst.attrs[0])), True)
            sch = s_tir.Schedule(mod)
            trace.apply_to_schedule(sch, remove_postproc=True)
            assert all(p.apply(sch) for p in ctx.space_generator.postprocs)
            lib = tvm.compile(sch.mod, target=cpu_target)
            out = tvm.runtime.tensor(np.zeros(want.shape, "float32"), dev)
            lib["main"](tvm.runtime.tensor(x, dev), out)
            np.testing.assert_allclose(out.numpy(), want, rtol=1e-5, atol=1e-6)


def test_the_rule_names_the_spaces_loops_after_the_mark(cpu_target):
    """Called as MetaSchedule calls it, on a marked block: the mark is gone and the channels are a vector."""
    from tvm import s_tir

    register_rule()
    sch = s_tir.Schedule(mark(_func((1, 16, 12, 24), _sum, [1, 2])))
    block = sch.get_sblock("x_red")
    spaces = outer_reduction_space(sch, block)
    assert [RULE in s.mod.script() for s in spaces] == [False, False]
    assert all("T.vectorized" in s.mod.script() and "T.parallel" in s.mod.script() for s in spaces)


def test_the_lowering_marks_the_tiny_models_pooling_on_cpu_targets_only(tmp_path, cpu_target):
    import tvm
    from helpers import make_tiny_onnx

    from dynatune.model.importer import load_model

    model = load_model(make_tiny_onnx(str(tmp_path / "tiny.onnx"), batch=1))
    marked = [t for t in extract_tasks(model, cpu_target) if RULE in t.mod.script()]
    assert [t.name for t in marked] == ["mean1"]
    off = Lowering(outer_reduction=False)
    assert not [t for t in extract_tasks(model, cpu_target, off) if RULE in t.mod.script()]
    assert off.describe(cpu_target) != Lowering().describe(cpu_target)
    assert not Lowering().marks_outer_reductions(tvm.target.Target("cuda"))


@pytest.mark.slow
def test_a_tuned_outer_reduction_matches_onnxruntime(tmp_path, cpu_target):
    """A few real trials of the tiny model's pooling: its records are the rule's (a vector loop over the
    channels), and the model compiled from them matches ONNX Runtime."""
    import tvm
    from helpers import few_trials_session, make_tiny_onnx

    from dynatune.compiler.compile import build, verify
    from dynatune.compiler.execution import relax_vm
    from dynatune.model.importer import load_model

    model = load_model(make_tiny_onnx(str(tmp_path / "tiny.onnx"), batch=1, channels=16))
    tasks = extract_tasks(model, cpu_target)
    task = next(t for t in tasks if RULE in t.mod.script())
    session = few_trials_session(tasks, cpu_target, str(tmp_path / "work"))
    try:
        result = session.tune(task.index, trials=4)
        assert result.trials >= 4 and result.build_errors + result.run_errors == 0, result.errors
        db = session.compile_database()
        executable = build(model, cpu_target, db)
    finally:
        session.close()
    (record,) = db.get_top_k(db.commit_workload(task.mod), 1)
    assert any(i.kind.name == "Reorder" for i in record.trace.insts)  # the rule's, not the generic spaces'
    dev = tvm.cpu()
    check = verify(relax_vm(executable, dev), model, dev, threads=2)
    assert check.ok and check.max_rel_err < 1e-5, check
