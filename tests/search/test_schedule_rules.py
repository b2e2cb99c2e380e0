"""TVM's "Unknown schedule rule" warning (a max pool's ``meta_schedule.pool_max``, which TVM 0.27 does not
have) is not printed when dynatune builds a design space, and the design space is what TVM's own fallback
gives (real TVM, a small model with a max pool)."""

import subprocess
import sys

import pytest
from helpers import ROOT, make_maxpool_onnx

from dynatune.model.extract import extract_tasks
from dynatune.model.importer import load_model
from dynatune.search.measure import MeasureConfig
from dynatune.search.schedule_rules import named_rules, quiet_missing_rules
from dynatune.search.session import SearchConfig, TuningSession

WARNING = "Unknown schedule rule"


@pytest.fixture(scope="module")
def pool_task(tmp_path_factory, cpu_target):
    path = make_maxpool_onnx(str(tmp_path_factory.mktemp("pool") / "pool.onnx"))
    tasks = extract_tasks(load_model(path), cpu_target)
    (i,) = [t.index for t in tasks if "max_pool" in t.name]
    return path, tasks, i


def _traces(mod, target) -> list[str]:
    from tvm.s_tir import meta_schedule as ms

    ctx = ms.TuneContext(mod=mod, target=target, space_generator="post-order-apply", rand_state=7)
    return [str(s.trace) for s in ctx.generate_design_space()]


def test_design_space_of_a_max_pool_is_quiet_and_generic(pool_task, cpu_target, capfd):
    _, tasks, i = pool_task
    mod = tasks[i].mod
    assert named_rules(mod) == {"meta_schedule.pool_max"}
    quiet_missing_rules(mod, cpu_target)
    assert quiet_missing_rules(mod, cpu_target) == []  # registered once per process
    traces = _traces(mod, cpu_target)
    assert WARNING not in capfd.readouterr().err
    # TVM's fallback for a rule it lacks: the annotation goes, the generic rules schedule the block
    assert traces and all('unannotate(block_or_loop=b0, ann_key="schedule_rule")' in t for t in traces)
    assert all("meta_schedule.parallel" in t for t in traces)


@pytest.mark.slow
def test_tuning_a_max_pool_prints_no_tvm_warning(pool_task, cpu_target, tmp_path, capfd):
    path, tasks, i = pool_task
    # without dynatune's rule, TVM prints the warning for this very task (in a process of its own)
    code = (
        "import sys; sys.path[:0] = [sys.argv[1]]\n"
        "from tvm.s_tir import meta_schedule as ms\n"
        "from dynatune.machine.target import make_target\n"
        "from dynatune.model.extract import extract_tasks\n"
        "from dynatune.model.importer import load_model\n"
        "from dynatune.search.intrinsics import import_tensor_intrinsics\n"
        "import_tensor_intrinsics()\n"
        "target = make_target()\n"
        "task = [t for t in extract_tasks(load_model(sys.argv[2]), target) if 'max_pool' in t.name][0]\n"
        "ctx = ms.TuneContext(mod=task.mod, target=target, space_generator='post-order-apply')\n"
        "ctx.generate_design_space()\n"
    )
    base = subprocess.run(
        [sys.executable, "-c", code, ROOT, path], capture_output=True, text=True, timeout=600
    )
    assert base.returncode == 0, base.stderr[-2000:]
    assert WARNING in base.stderr and "meta_schedule.pool_max" in base.stderr
    capfd.readouterr()

    search = SearchConfig(trials_per_iter=2, population_size=16, init_min_unmeasured=8, genetic_num_iters=1)
    measure = MeasureConfig(repeat=2)
    session = TuningSession(tasks, cpu_target, str(tmp_path / "work"), search=search, measure=measure)
    try:
        r = session.tune(i, trials=2)
    finally:
        session.close()
    assert r.trials >= 2 and r.build_errors + r.run_errors < r.trials  # the pool task really was tuned
    err = capfd.readouterr().err
    assert WARNING not in err, err[-2000:]
