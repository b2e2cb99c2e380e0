"""The model with its kernels emptied (dynatune.compiler.dispatch): the same calls as the model, in the
same numbers, with none of the kernels' work (real TVM builds of the tiny conv net)."""

import tvm

from dynatune.compiler.compile import build
from dynatune.compiler.dispatch import empty_kernels_executable
from dynatune.compiler.profile import make_vm, profile_calls
from dynatune.compiler.timing import vm_block_timer


def _calls(vm, model, inputs) -> dict:
    runs, _ = profile_calls(vm, model, inputs, tvm.cpu(), block_ms=1, min_runs=1)
    return {sym: calls for sym, (calls, _secs) in runs[-1].items()}


def test_the_empty_model_makes_the_models_calls_without_their_work(tiny_model, cpu_target):
    model, dev = tiny_model, tvm.cpu()
    inputs = model.random_inputs(0)
    full = make_vm(build(model, cpu_target, None), dev)
    empty = make_vm(empty_kernels_executable(model, cpu_target), dev)
    calls = _calls(full, model, inputs)
    assert [s for s in calls if not s.startswith("vm.builtin.")]  # the kernels, called
    assert _calls(empty, model, inputs) == calls  # every call, kernels and builtins, as many times
    # ... and nothing of the kernels' work: a run of it takes a fraction of the model's
    full_ms, empty_ms = vm_block_timer(full, inputs, dev, 50)(), vm_block_timer(empty, inputs, dev, 50)()
    assert 0 < empty_ms < full_ms / 3
