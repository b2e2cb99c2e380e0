"""Weight prepacking: tasks mark their weights layout-free, tuned kernels choose the weight layout, and the
compiled model packs the weights at compile time (no ``transform_params`` call for its user)."""

import re

import pytest
from helpers import make_tiny_onnx, randomized_light_model, run_in_plain_tvm

from dynatune.model.extract import Lowering, extract_tasks, fuse, task_key, uses_prepack
from dynatune.model.importer import load_model


def layout_free(task):
    attr = task.mod["main"].attrs.get("layout_free_buffers")
    return None if attr is None else [int(i) for i in attr]


def test_conv_and_matmul_tasks_mark_their_weights(tiny_tasks):
    tasks = tiny_tasks
    marked = {t.name: layout_free(t) for t in tasks}
    heavy = [n for n in marked if "conv2d" in n or "matmul" in n]
    assert len(heavy) == 3
    for n in heavy:  # (input, weight, bias): weight and bias are constants of the model
        assert marked[n] == [1, 2], n
    assert all(marked[n] == [] for n in marked if n not in heavy)


def test_without_prepack_tasks_are_as_before(tiny_model, tiny_tasks, cpu_target):
    model, tasks = tiny_model, tiny_tasks
    plain = extract_tasks(model, cpu_target, Lowering(prepack=False))
    assert all(layout_free(t) is None for t in plain)
    assert {t.key for t in plain}.isdisjoint(t.key for t in tasks)  # the attribute is part of the key


def test_gpu_targets_never_prepack(cpu_target):
    import tvm

    assert uses_prepack(cpu_target) and not uses_prepack(cpu_target, False)
    assert not uses_prepack(tvm.target.Target("cuda"))


def test_extraction_keys_match_the_compiled_functions(tiny_model, tiny_tasks, cpu_target):
    """The compiler looks tuned functions up by the same key: every task is among the functions it fuses."""
    import tvm
    from tvm.s_tir.meta_schedule.tune_context import _normalize_mod

    model, tasks = tiny_model, tiny_tasks
    fused = fuse(model.bound_module(), cpu_target)
    compiled = {
        task_key(_normalize_mod(f)) for f in fused.functions.values() if isinstance(f, tvm.tirx.PrimFunc)
    }
    assert {t.key for t in tasks} <= compiled


def test_same_operator_in_another_model_shares_its_key(tiny_tasks, cpu_target, tmp_path):
    tasks = tiny_tasks
    keys = {t.key for t in tasks}

    def keys_of(**kw):
        other = load_model(make_tiny_onnx(str(tmp_path / "other.onnx"), seed=1, **kw), {"x": (1, 3, 16, 16)})
        return {t.key for t in extract_tasks(other, cpu_target)}

    assert keys_of() == keys  # other weights, same operators
    # one more conv: its operators are new; the pooling after it is new too where the target's register
    # blocks pad the conv's channels (AVX2: the mean slices them back); every other key is shared
    bigger = keys_of(extra_layer=True)
    assert len(keys - bigger) <= 1 and len(bigger) > len(keys)


@pytest.mark.slow
def test_tuned_prepacked_model_matches_onnxruntime_in_plain_tvm(cpu_target, tmp_path):
    """A few real trials on the two heaviest convolutions, records read back from disk by a second
    session, compile: the tuned kernels are ``*_prepacked``, no packing is left for run time, and the
    artifact runs in plain TVM with ``vm["main"](x)`` alone and matches ONNX Runtime."""
    from dynatune.compiler.compile import build, export
    from dynatune.search.measure import MeasureConfig
    from dynatune.search.session import SearchConfig, TuningSession

    model = load_model(randomized_light_model("squeezenet", str(tmp_path / "squeezenet.onnx")))
    tasks = extract_tasks(model, cpu_target)
    assert all(layout_free(t) == [1, 2] for t in tasks[:2])
    work = str(tmp_path / "work")
    search = SearchConfig(trials_per_iter=4, population_size=32, init_min_unmeasured=16, genetic_num_iters=1)
    measure = MeasureConfig(repeat=3, min_repeat_ms=5)
    s1 = TuningSession(
        tasks, cpu_target, work, search=search, measure=measure
    )  # (no defaults: any record counts)
    for i in (0, 1):
        r = s1.tune(i, trials=4)
        assert r.trials >= 4 and r.build_errors + r.run_errors < r.trials, r.errors
    s1.close()

    s2 = TuningSession(tasks, cpu_target, work, search=search, measure=measure)  # records from disk
    try:
        db = s2.compile_database()
        tuned = {t.name for t in tasks if db.has_workload(t.mod)}
        assert tuned, "no tuned record beat the default schedule"
        for rec in db.get_all_tuning_records():  # the runner measured the kernel on the rewritten weights
            assert "meta_schedule.layout_rewrite_preproc" in str(rec.trace)
        executable = build(model, cpu_target, db)
        prepack_in_one_build_as_fold_constant_would(model, cpu_target, db)
    finally:
        s2.close()
    text = executable.as_text()
    assert set(re.findall(r"(\w+)_prepacked", text)) == tuned
    assert "weight_prepack" not in text  # packed at compile time, not per inference
    # and nothing of the packing is left to run: no tuple of constants made, to be taken apart, per call
    assert not re.search(r"vm\.builtin\.make_tuple in: c\[", text)
    artifact = export(executable, str(tmp_path / "model.so"))
    no_transform_params = "assert not vm.module.implements_function('main_transform_params')"
    check = run_in_plain_tvm(model, artifact, tmp_path, extra_check=no_transform_params)
    assert check.ok and check.max_rel_err < 1e-4


def prepack_in_one_build_as_fold_constant_would(model, target, db):
    """The compiler's weight packing (constants folded in one build) gives what FoldConstant alone gives (the
    packed weights' tuples taken apart at compile time, its dead bindings removed)."""
    import tvm
    import tvm_ffi
    from tvm import relax
    from tvm.relax.transform import MetaScheduleApplyDatabase

    from dynatune.compiler.compile import weight_prepack_passes
    from dynatune.model.constant_folding import calls_on_constants

    with target, db, tvm.transform.PassContext(opt_level=3):
        tuned = MetaScheduleApplyDatabase(enable_warning=False)(fuse(model.bound_module(), target))
        split = relax.transform.SplitLayoutRewritePreproc()(tuned)
        assert calls_on_constants(split, split["main"])  # weights to pack at compile time
        ours = tvm.transform.Sequential(weight_prepack_passes())(tuned)
        folded = relax.transform.CanonicalizeBindings()(relax.transform.FoldConstant()(split))
        theirs = relax.transform.DeadCodeElimination(["main"])(folded)
    assert tvm_ffi.structural_equal(ours, theirs)
