"""Tasks: the model split into weighted operator tasks, each with a stable key.

A task is one fused TIR function. Its *weight* is how many call sites the model has for it, its *key* is
the structural hash of its PrimFunc (so the same operator is recognised in another model or another
version of this one), and its FLOPs come from TVM's static estimate.

Weight prepacking (CPU targets, on by default): every task is marked with the indices of its arguments
that are model weights (``layout_free_buffers``, by ``relax.transform.AttachAttrLayoutFreeBuffers``), so
MetaSchedule's ``RewriteLayout`` postprocessor lets a tuned conv2d/dense/matmul schedule pick the weight
layout it reads best; the compiler then repacks the weights once at compile time (see
:func:`dynatune.compiler.compile.build`). The attribute is part of the PrimFunc, hence of the key: a model
tuned with prepacking and one tuned without have different keys for the same operator. The pass also renames
the functions it marks (``fused_conv2d_add_relu`` becomes ``fused_conv2d_add_relu1``). GPU targets never
prepack: MetaSchedule's CUDA postprocessors have no ``RewriteLayout``, and it is not verified there.

Convolutions are converted to NHWC first on CPU targets (:mod:`dynatune.model.layout`), and exp, erf,
tanh, sigmoid, softmax and GELU become vectorizable polynomials (:mod:`dynatune.model.fast_math`). These
choices, and anything else that changes the tasks, are one :class:`Lowering`, which extraction and
compilation share.
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
        from dynatune.machine.roofline import compulsory_bytes

        return {
            "index": self.index,
            "name": self.name,
            "key": self.key,
            "weight": self.weight,
            "flops": self.flops,
            "bytes": compulsory_bytes(self.mod) if self.mod is not None else 0.0,
        }


@dataclass(frozen=True)
class Lowering:
    """How the model is lowered to tasks; extraction and compilation must use the same one, or no task key
    matches. From the config: ``compile.prepack``, ``compile.conv_layout`` and ``compile.fast_math``."""

    prepack: bool = True
    conv_layout: str = "auto"
    # CPU targets: exp/erf/tanh/sigmoid/softmax/GELU as vectorizable polynomials (dynatune.model.fast_math)
    fast_math: bool = True
    # a concatenation's producers write into their slices of it (dynatune.model.placement): the
    # concatenation's own task is not extracted
    place_concat: bool = True
    # CPU targets, NHWC: 3x3 stride-1 convolutions as Winograd F(4x4, 3x3) (dynatune.model.winograd)
    winograd: bool = True
    # ... except the convolutions of these signatures (dynatune.model.winograd.signature): the compile's
    # per-task choice (dynatune.compiler.winograd_choice) keeps them direct where that is faster
    winograd_direct: tuple[str, ...] = ()
    # CPU targets, NHWC: a convolution's output channels padded to whole register blocks where a global
    # pooling follows, or sliced back inside its own kernel (dynatune.model.channel_padding)
    pad_channels: bool = True
    # CPU targets: a reduction over every axis but the innermost (a global pooling in NHWC) is scheduled as
    # a vector loop over that axis (dynatune.model.outer_reduction)
    outer_reduction: bool = True
    # CPU targets, NHWC: a convolution of the model's NCHW input reads it as it lies, with no transpose
    # kernel before it (dynatune.model.input_layout)
    read_input: bool = True
    # compile only (the tasks are the same either way, so not in :meth:`describe`): CPU targets' kernels take
    # their planned storages flat, the views left made once (dynatune.compiler.compile.finalize_passes)
    flat_storage: bool = True
    # compile only, with flat_storage: the storages only kernels read are the executable's own constants,
    # made once at load, not taken from the VM's pool each run (dynatune.model.resident_storage)
    resident_storage: bool = True

    def prepacks(self, target) -> bool:
        return uses_prepack(target, self.prepack)

    def fast_maths(self, target) -> bool:
        """Whether transcendental functions are rewritten for ``target``: as asked on CPU targets (where
        libm's are scalar), never on GPU targets."""
        return bool(self.fast_math) and not _is_gpu(target)

    def places_concats(self, target) -> bool:
        """Whether concatenations are placed for ``target``: as asked on CPU targets, never on GPU targets
        (their default schedules are not verified on a producer that writes a slice)."""
        return bool(self.place_concat) and not _is_gpu(target)

    def flattens_storage(self, target) -> bool:
        """Whether kernels take their planned storages flat for ``target``: as asked on CPU targets, never on
        GPU targets (not tried there)."""
        return bool(self.flat_storage) and not _is_gpu(target)

    def keeps_storage_resident(self, target) -> bool:
        """Whether the storages only kernels read are constants of the executable on ``target``: with the
        flat storages only (it keeps their flat tensors)."""
        return bool(self.resident_storage) and self.flattens_storage(target)

    def marks_outer_reductions(self, target) -> bool:
        """Whether outer reductions get their own schedule rule on ``target``: as asked on CPU targets (the
        rule is registered for the CPU target keys), never on GPU targets."""
        return bool(self.outer_reduction) and not _is_gpu(target)

    def winograds(self, target) -> bool:
        """Whether eligible convolutions are lowered as Winograd for ``target``: as asked on CPU targets whose
        convolutions are in NHWC, never otherwise."""
        return bool(self.winograd) and self._nhwc_cpu(target)

    def reads_input(self, target) -> bool:
        """Whether a convolution of a model input reads it in NCHW for ``target``: as asked on CPU targets
        whose convolutions are in NHWC, never otherwise."""
        return bool(self.read_input) and self._nhwc_cpu(target)

    def pads_channels(self, target):
        """The vector unit convolutions' output channels are padded for on ``target`` (``None``: no padding):
        as asked on CPU targets whose convolutions are in NHWC and whose vectors hold more than one float."""
        from dynatune.machine.vector import vector_unit

        unit = vector_unit(target) if self.pad_channels and self._nhwc_cpu(target) else None
        return unit if unit is not None and unit.lanes > 1 else None

    def _padding(self, target) -> str:
        """How channels are padded, for the task cache's key: lanes x accumulators, and where the slices land
        (0: no padding)."""
        unit = self.pads_channels(target)
        return f"{unit.lanes}x{unit.accumulators}+sliced" if unit is not None else "0"

    def _nhwc_cpu(self, target) -> bool:
        from dynatune.model.layout import resolve_conv_layout

        return not _is_gpu(target) and resolve_conv_layout(target, self.conv_layout) == "NHWC"

    def describe(self, target) -> str:
        """What changes the tasks, resolved for ``target`` (part of the task cache's key)."""
        from dynatune.model.layout import resolve_conv_layout

        return (
            f"prepack={self.prepacks(target)}|conv_layout={resolve_conv_layout(target, self.conv_layout)}"
            f"|fast_math={self.fast_maths(target)}|place_concat={self.places_concats(target)}"
            f"|winograd={self.winograds(target)}|pad_channels={self._padding(target)}"
            f"|read_input={self.reads_input(target)}|outer_reduction={self.marks_outer_reductions(target)}"
            + (
                f"|winograd_direct={','.join(self.winograd_direct)}"
                if self.winograds(target) and self.winograd_direct
                else ""
            )
        )


def _conv_legalize(target, lowering: Lowering) -> dict | None:
    """The lowering's own legalization of ``relax.nn.conv2d`` (None: TVM's): Winograd where eligible, and a
    convolution that reads the model's NCHW input (:mod:`dynatune.model.input_layout`)."""
    import tvm

    winograd, reads_input = lowering.winograds(target), lowering.reads_input(target)
    if not (winograd or reads_input):
        return None
    if winograd:
        from functools import partial

        from dynatune.model.winograd import legalize

        direct = partial(legalize, direct=lowering.winograd_direct)
    else:
        direct = tvm.ir.Op.get("relax.nn.conv2d").get_attr("FLegalize")
    if not reads_input:
        return {"relax.nn.conv2d": direct}
    from dynatune.model.input_layout import legalize as reading_input
    from dynatune.model.input_layout import reads_nchw

    return {"relax.nn.conv2d": lambda bb, call: (reading_input if reads_nchw(call) else direct)(bb, call)}


def _is_gpu(target) -> bool:
    from tvm.relax.pipeline import BackendDispatcher

    return BackendDispatcher.is_gpu_target(target)


def uses_prepack(target, prepack: bool = True) -> bool:
    """Whether weights are prepacked for ``target``: as asked on CPU targets, never on GPU targets."""
    return bool(prepack) and not _is_gpu(target)


def fuse_passes(target, lowering: Lowering = Lowering()):
    """The passes that turn the bound Relax module into fused TIR tasks.

    Extraction and compilation both use exactly this list, so a task's key in the tuning database always
    matches the function the compiler looks up. Batch norm is decomposed and folded into the preceding
    convolution's epilogue first, so it costs no task of its own (nor does the activation after it).
    Convolutions are converted to the lowering's layout before anything else, the activations between them
    too (:mod:`dynatune.model.layout`). With ``fast_math`` (and a CPU target) exp, erf, tanh, sigmoid,
    softmax and GELU become vectorizable polynomials before legalization, so they fuse as the originals
    would (:mod:`dynatune.model.fast_math`). With ``prepack`` (and a CPU target) the fused functions carry
    their layout-free (weight) arguments.
    """
    from tvm import relax

    from dynatune.model.constant_folding import fold_constants_passes
    from dynatune.model.fast_math import fast_math_pass
    from dynatune.model.layout import conv_layout_passes, resolve_conv_layout

    passes = conv_layout_passes(resolve_conv_layout(target, lowering.conv_layout))
    if unit := lowering.pads_channels(target):
        from dynatune.model.channel_padding import pad_channels_pass

        passes.append(pad_channels_pass(unit))
    if lowering.reads_input(target):
        from functools import partial

        from dynatune.model.input_layout import read_input_pass
        from dynatune.model.winograd import computes_winograd

        winograd = partial(computes_winograd, direct=lowering.winograd_direct)
        passes.append(read_input_pass(keep=winograd if lowering.winograds(target) else None))
    passes += backend_passes(target, "library_dispatch_passes") + [
        relax.transform.DecomposeOpsForInference(),
        # batch norm decomposes into (y, mean, var)[0]: the tuple would stop the activation after it from
        # fusing into the convolution's epilogue
        relax.transform.CanonicalizeBindings(),
    ]
    if lowering.fast_maths(target):
        passes.append(fast_math_pass())
    passes.append(relax.transform.LegalizeOps(customize_legalize_map=_conv_legalize(target, lowering)))
    if lowering.marks_outer_reductions(target):
        from dynatune.model.outer_reduction import mark_pass

        passes.append(mark_pass())
    passes += [
        relax.transform.AnnotateTIROpPattern(),
        *fold_constants_passes(),
        relax.transform.FuseOps(),
        relax.transform.FuseTIR(),
    ]
    if lowering.prepacks(target):
        # weights must be visible as constants at the call sites (the pass recommends canonical bindings)
        passes += [relax.transform.CanonicalizeBindings(), relax.transform.AttachAttrLayoutFreeBuffers()]
    return passes


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


def fuse(bound_mod, target, lowering: Lowering = Lowering()):
    import tvm

    with target, tvm.transform.PassContext(opt_level=3):
        return tvm.transform.Sequential(fuse_passes(target, lowering))(bound_mod)


def task_key(mod) -> str:
    from tvm_ffi import structural_hash

    return f"{structural_hash(mod) & 0xFFFFFFFFFFFFFFFF:016x}"


def extract_tasks(model, target, lowering: Lowering = Lowering(), fused=None) -> list[Task]:
    """Every tunable task of ``model`` for ``target``, heaviest (weight x FLOPs) first.

    ``lowering`` must be what the compiler is given (:func:`dynatune.compiler.compile.build`), or no key
    matches. ``fused``: the model already lowered so (:func:`fuse`), not lowered again.
    """
    from tvm.s_tir import meta_schedule as ms

    from dynatune.model.flops import task_flops

    if fused is None:
        fused = fuse(model.bound_module(), target, lowering)
    extracted = ms.relax_integration.extract_tasks(fused, target, module_equality="structural")
    placed = set()
    if lowering.places_concats(target):
        from dynatune.model.placement import placed_concat_keys

        placed = placed_concat_keys(fused, task_key)
    tasks = []
    for ex in extracted:
        mod = ex.dispatched[0]
        if mod.attrs is not None and mod.attrs.get("tirx.is_scheduled", False):
            continue
        if task_key(mod) in placed:  # the compiled model never calls it
            continue
        try:
            flops = task_flops(mod)
        except Exception:  # some ops (e.g. with dynamic loops) have no estimate
            flops = 0.0
        tasks.append(Task(0, str(ex.task_name), task_key(mod), int(ex.weight), flops, mod))
    tasks.sort(key=lambda t: (-t.weight * t.flops, t.name))
    for i, t in enumerate(tasks):
        t.index = i
    return tasks
