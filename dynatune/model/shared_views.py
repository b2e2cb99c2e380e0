"""One view per place in the planned memory: tensors the memory plan puts at the same offset of the same
storage, with the same shape and type, are one tensor object, made once a run.

Relax plans a model's intermediate tensors statically (``StaticPlanBlockMemory``): a few storages, and each
intermediate tensor a view of one of them (``R.memory.alloc_tensor(storage, offset, shape, dtype)``), made
just before the kernel that writes it: a ``vm.builtin.alloc_tensor`` call a run, which makes a tensor object
(a small heap allocation, not the tensor's data). Most views are gone once the kernels take their storages
flat (:mod:`dynatune.model.flat_storage`); this pass is for the views left, which something other than a
kernel reads (a reshape, the model's output), and for every view where a kernel cannot take its storage flat.

A view describes memory and nothing else: kernels write through it, none changes it. So a later view with
the same (storage, offset, shape, dtype) as an earlier one is replaced by the earlier one, which then lives
until the later one's last use (``KillAfterLastUse``, which runs after this pass, sees the merged uses). The
storage is the same either way, so the memory a run holds does not change; the run makes fewer objects.
(Before the flat storages, this pass alone took mnasnet0_5's 53 views a run to 36.)
"""

from __future__ import annotations


def share_identical_views_pass():
    """A function pass: in every Relax function, each ``R.memory.alloc_tensor`` whose storage, offset,
    shape and dtype an earlier one of the same function already has is replaced by that earlier one.

    To run after ``StaticPlanBlockMemory`` and ``LowerAllocTensor`` and before ``KillAfterLastUse``
    (:func:`dynatune.compiler.compile.finalize_passes`)."""
    import tvm
    from tvm import relax
    from tvm.relax.expr_functor import PyExprMutator, mutator
    from tvm_ffi import structural_equal, structural_hash

    alloc_tensor = tvm.ir.Op.get("relax.memory.alloc_tensor")

    @mutator
    class _ShareViews(PyExprMutator):
        def __init__(self, mod):
            super().__init__(mod)
            self.views: dict = {}

        def visit_function_(self, func):
            self.views = {}
            return super().visit_function_(func)

        def visit_var_binding_(self, binding):
            value = binding.value
            if isinstance(value, relax.Call) and value.op.same_as(alloc_tensor):
                storage = self.visit_expr(value.args[0])
                key = (storage, *(structural_hash(arg) for arg in value.args[1:]))
                earlier = self.views.get(key)
                if earlier is not None and all(
                    structural_equal(a, b) for a, b in zip(value.args[1:], earlier[1])
                ):
                    self.set_var_remap(binding.var, earlier[0])
                    return
                super().visit_var_binding_(binding)
                self.views[key] = (binding.var, list(value.args[1:]))
                return
            super().visit_var_binding_(binding)

    @tvm.transform.module_pass(opt_level=0, name="ShareIdenticalViews")
    def share(mod, _ctx):
        rewriter = _ShareViews(mod)
        for gv, func in list(mod.functions.items()):
            if isinstance(func, relax.Function):
                rewriter.builder_.update_func(gv, rewriter.visit_expr(func))
        return rewriter.builder_.get()

    return share
