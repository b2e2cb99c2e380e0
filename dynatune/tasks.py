"""Tasks: the model split into weighted operator tasks, each with a stable key.

A task is one fused TIR function. Its *weight* is how many call sites the model has for it, its *key* is
the structural hash of its PrimFunc (so the same operator is recognised in another model or another
version of this one), and its FLOPs come from TVM's static estimate.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class Task:
    index: int
    name: str
    key: str
    weight: int
    flops: float
    mod: object = field(repr=False, compare=False)  # tvm.IRModule holding the PrimFunc as "main"

    def as_dict(self) -> dict:
        return {"index": self.index, "name": self.name, "key": self.key, "weight": self.weight,
                "flops": self.flops}


def fuse_passes(target):
    """The passes that turn the bound Relax module into fused TIR tasks.

    Extraction and compilation both use exactly this list, so a task's key in the tuning database always
    matches the function the compiler looks up. Batch norm is decomposed and folded into the preceding
    convolution's epilogue first, so it costs no task of its own.
    """
    from tvm import relax

    return backend_passes(target, "library_dispatch_passes") + [
        relax.transform.DecomposeOpsForInference(),
        relax.transform.LegalizeOps(),
        relax.transform.AnnotateTIROpPattern(),
        relax.transform.FoldConstant(),
        relax.transform.FuseOps(),
        relax.transform.FuseTIR(),
    ]


def backend_passes(target, name: str) -> list:
    """TVM's per-backend pass lists, from ``tvm.relax.backend.<kind>.pipeline``.

    (Read from the backend's own module: the package-level re-exports are incomplete in TVM 0.27.)
    """
    import importlib

    from tvm.relax.pipeline import BackendDispatcher

    kind = target.kind.name
    generic = "gpu_generic" if BackendDispatcher.is_gpu_target(target) else "cpu_generic"
    for backend in ([kind] if kind not in ("llvm",) else []) + [generic]:
        try:
            module = importlib.import_module(f"tvm.relax.backend.{backend}.pipeline")
        except ImportError:
            continue
        if hasattr(module, name):
            return list(getattr(module, name)(target))
    return []


def fuse(bound_mod, target):
    import tvm

    with target, tvm.transform.PassContext(opt_level=3):
        return tvm.transform.Sequential(fuse_passes(target))(bound_mod)


def task_key(mod) -> str:
    from tvm_ffi import structural_hash

    return f"{structural_hash(mod) & 0xFFFFFFFFFFFFFFFF:016x}"


def extract_tasks(model, target) -> list[Task]:
    """Every tunable task of ``model`` for ``target``, heaviest (weight x FLOPs) first."""
    from tvm.s_tir import meta_schedule as ms
    from tvm.s_tir.analysis import estimate_tir_flops

    fused = fuse(model.bound_module(), target)
    extracted = ms.relax_integration.extract_tasks(fused, target, module_equality="structural")
    tasks = []
    for ex in extracted:
        mod = ex.dispatched[0]
        if mod.attrs is not None and mod.attrs.get("tirx.is_scheduled", False):
            continue
        try:
            flops = float(estimate_tir_flops(mod))
        except Exception:  # some ops (e.g. with dynamic loops) have no estimate
            flops = 0.0
        tasks.append(Task(0, str(ex.task_name), task_key(mod), int(ex.weight), flops, mod))
    tasks.sort(key=lambda t: (-t.weight * t.flops, t.name))
    for i, t in enumerate(tasks):
        t.index = i
    return tasks
