"""TVM's runtime runs on every usable core once dynatune is imported (alone, it would use half of an x86
machine's cores: one thread on two cores)."""

import os
import subprocess
import sys

from dynatune.machine.target import TVM_SPIN_COUNT, usable_cores


def _tvm_threads(env: dict, first: str) -> int:
    code = f"import {first}, dynatune, tvm; print(tvm.get_global_func('runtime.NumThreads')())"
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    return int(out.stdout.strip().splitlines()[-1])


def test_tvm_runs_on_every_usable_core_whatever_is_imported_first():
    env = {k: v for k, v in os.environ.items() if k != "TVM_NUM_THREADS"}
    assert _tvm_threads(env, "tvm") == usable_cores()
    assert _tvm_threads(env, "os") == usable_cores()


def test_the_pool_spins_briefly_unless_the_user_says_otherwise():
    env = {k: v for k, v in os.environ.items() if k != "TVM_THREAD_POOL_SPIN_COUNT"}
    code = "import dynatune, os; print(os.environ['TVM_THREAD_POOL_SPIN_COUNT'])"
    run = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    assert int(run.stdout.strip()) == TVM_SPIN_COUNT
    code_bind = "import dynatune, os; print(os.environ['TVM_BIND_THREADS'])"
    env_bind = {k: v for k, v in env.items() if k != "TVM_BIND_THREADS"}
    run_bind = subprocess.run([sys.executable, "-c", code_bind], env=env_bind, capture_output=True, text=True)
    assert run_bind.stdout.strip() == "0"  # threads the OS may move off a busy core
    env["TVM_THREAD_POOL_SPIN_COUNT"] = "5"
    run = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    assert run.stdout.strip() == "5"


def test_a_thread_count_the_user_set_is_kept():
    env = {k: v for k, v in os.environ.items()} | {"TVM_NUM_THREADS": "1"}
    assert _tvm_threads(env, "os") == 1
