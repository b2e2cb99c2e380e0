"""Records carried from another version of a model (warm start): the two versions' global-pooling tasks share
a key, but their blocks are named after each model's own variables, so a record of one does not replay on
the other. Only records that replay on this run's own task are imported, under this run's workload;
MetaSchedule stopped on the others ("Cannot find a block with the name ...") in the search or the compile."""

import pytest
from helpers import make_tiny_onnx

from dynatune.model.extract import extract_tasks
from dynatune.model.importer import load_model
from dynatune.search.database import TuningDatabase


@pytest.fixture(scope="module")
def pooling_tasks(tmp_path_factory, cpu_target):
    """The pooling task of version 1 and of version 2 (one more layer before it): one key, other names.
    (16 channels: whole register blocks on AVX2 and AVX-512 alike; with 8, AVX2 pads the extra layer's
    channels and its pooling slices them back, another task.)"""
    d = tmp_path_factory.mktemp("versions")
    v1 = make_tiny_onnx(str(d / "v1.onnx"), batch=1, channels=16)
    v2 = make_tiny_onnx(str(d / "v2.onnx"), batch=1, channels=16, extra_layer=True)
    first = {t.key: t for t in extract_tasks(load_model(v1), cpu_target) if t.name.startswith("mean")}
    second = [t for t in extract_tasks(load_model(v2), cpu_target) if t.key in first]
    assert len(second) == 1
    return first[second[0].key], second[0]


def _record_of(task, db, target):
    """A record of ``task`` in ``db``: its design space's trace, as MetaSchedule writes one."""
    from tvm.s_tir import meta_schedule as ms
    from tvm.s_tir.meta_schedule.arg_info import ArgInfo

    ctx = ms.TuneContext(mod=task.mod, target=target, space_generator="post-order-apply")
    sch = ctx.generate_design_space()[0]
    wl = db.workload(task.key, task.mod)
    args = ArgInfo.from_prim_func(task.mod["main"])
    db.commit(task.key, ms.database.TuningRecord(sch.trace, wl, [1e-3], target, args))


def test_a_record_of_another_version_is_not_imported_and_this_runs_task_is_the_workload(
    pooling_tasks, cpu_target, tmp_path
):
    old, new = pooling_tasks
    source = TuningDatabase(str(tmp_path / "v1"))
    _record_of(old, source, cpu_target)
    assert old.mod.script() != new.mod.script()  # the same computation, its blocks named otherwise

    here = TuningDatabase(str(tmp_path / "v2"))
    assert here.import_records(source, {new.key}, mods={new.key: new.mod}) == 0
    assert here.num_records() == 0
    assert here.workload(new.key, new.mod).mod.same_as(new.mod)  # this run's own task, not version 1's

    same = TuningDatabase(str(tmp_path / "v1-again"))  # the same version: its records come along
    assert same.import_records(source, {old.key}, mods={old.key: old.mod}) == 1
