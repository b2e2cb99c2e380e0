"""What the model's calls cost without their kernels: the VM's dispatch, measured rather than inferred.

The profile (:mod:`dynatune.compiler.profile`) times each kernel from its instrument, one call at a time,
and calls the rest of the model's time "between calls". That remainder holds the VM's own work (its
instructions, each call's argument conversion and checks), and also whatever the kernels lose when they run
back to back rather than one by one from the instrument, whose Python callback sits between any two of
them: on the Zen 4 guest it read 0.6-3.7 % of the README job's model and 3.2-6.0 % of the EfficientNet-like
model's in two campaigns, with the same kernels and calls.

:func:`empty_kernels_executable` builds the model with every kernel's body emptied, its parameters kept (so
its packed call still converts and checks every argument), every instruction and builtin call of the VM as
they are: a run of it is what the calls themselves cost, and nothing of the kernels' work. The profile
times it in the same rounds as the model (``dispatch_ms``).
"""

from __future__ import annotations


def empty_kernels_pass():
    """A module pass: every PrimFunc's body a no-op, its parameters (buffers, shapes) and attributes kept."""
    import tvm
    from tvm import tirx

    @tvm.transform.module_pass(opt_level=0, name="EmptyKernels")
    def empty(mod, _ctx):
        for gv, func in list(mod.functions_items()):
            if isinstance(func, tirx.PrimFunc):
                mod[gv] = func.with_body(tirx.Evaluate(0))
        return mod

    return empty


def empty_kernels_executable(model, target, database=None, lowering=None):
    """``model`` built as :func:`dynatune.compiler.compile.build` builds it from ``database`` with
    ``lowering`` (the compiled model's), with every kernel empty: the same calls, no work in them."""
    from dynatune.compiler.compile import build
    from dynatune.model.extract import Lowering

    return build(model, target, database, lowering or Lowering(), after=[empty_kernels_pass()])
