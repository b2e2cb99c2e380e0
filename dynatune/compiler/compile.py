"""The final compile: build the whole model with the best schedules found, export it, verify it against
ONNX Runtime, and time it.

- :func:`build` / :func:`export`: a Relax executable with the tuned functions from the database (the rest
  default-scheduled: as lowered on CPU, DLight's rules on GPU), exported as a shared library that plain
  TVM loads (``tvm.runtime.load_module`` + ``relax.VirtualMachine``): no dynatune needed to run it.
- :func:`verify` / :func:`compare`: the compiled model's outputs against ONNX Runtime's on
  ``VERIFY_INPUTS`` (3) different seeded random inputs: per input, the max absolute error and the relative
  error max|tvm - ort| / max|ort|; the check fails when any float32 output of any input is above
  ``rel_tol`` (1e-4 by default). The report carries the max over the inputs and each input's error.
- :func:`compile_and_verify`: all of it, into a :class:`CompileReport`, which also carries the untuned
  TVM latency and ONNX Runtime's latency with the same thread count, so a run always says where it
  stands. The compiled model and ONNX Runtime are timed side by side in fresh processes
  (:mod:`dynatune.compiler.fresh_timing`: alternating rounds; ``timing_processes`` of them), so their
  ratio holds even when the machine's speed drifts; on a machine that stays busy the report says the ratio
  was taken under load.

Prepacked weights (CPU targets, ``compile.prepack``, on by default): a tuned conv2d/dense/matmul may read
its weight in a layout of its own choosing (MetaSchedule's ``RewriteLayout``). The compiler splits each
such kernel into a packing function and a ``*_prepacked`` kernel (``SplitLayoutRewritePreproc``), and,
as the model's weights are bound constants, folds the packing away (``FoldConstant``): the artifact
holds the packed weights, packs nothing per inference, and ``vm["main"](*inputs)`` is called exactly as
without prepacking (no ``transform_params`` call).
"""

from __future__ import annotations

import os
import time
from dataclasses import asdict, dataclass, field

import numpy as np

from dynatune.compiler import artifact_metadata
from dynatune.compiler.execution import load, onnxruntime_session, relax_vm, run, time_vm
from dynatune.compiler.fresh_timing import time_in_fresh_process
from dynatune.errors import DynatuneError
from dynatune.machine.load import QuietPolicy
from dynatune.machine.target import gpu_default_schedule
from dynatune.model.destination_entry import add_destination_entry_pass
from dynatune.model.extract import Lowering, backend_passes, fuse_passes
from dynatune.model.flat_storage import flatten_planned_tensors_pass
from dynatune.model.placement import concat_functions, place
from dynatune.model.resident_storage import keep_storages_resident_pass
from dynatune.model.shared_views import share_identical_views_pass

VERIFY_INPUTS = 3  # seeded random inputs the compiled model is checked on


@dataclass
class VerifyResult:
    max_abs_err: float
    max_rel_err: float
    ok: bool
    outputs: int
    per_input_rel_err: list[float] = field(default_factory=list)  # :func:`verify`: one per input
    seeds: list[int] = field(default_factory=list)  # ... the inputs' seeds (Model.random_inputs)
    reference: list = field(default_factory=list, repr=False)  # ... ONNX Runtime's outputs for the first


@dataclass
class CompileReport:
    artifact: str
    metadata: str  # the artifact's metadata file (dynatune.compiler.artifact_metadata), beside it
    latency_ms: float
    latency_std_ms: float
    untuned_latency_ms: float | None
    onnxruntime_latency_ms: float | None
    max_abs_err: float
    max_rel_err: float
    numerics_ok: bool
    threads: int
    compile_s: float
    # side by side with ONNX Runtime (None when it was not measured): TVM latency / ONNX Runtime latency
    # (< 1: TVM is faster), each side's fastest block against the other's, over every timing process
    # (dynatune.compiler.timing.best_ratio); min and max: of the per-round ratios
    ratio_vs_onnxruntime: float | None = None
    ratio_vs_onnxruntime_min: float | None = None
    ratio_vs_onnxruntime_max: float | None = None
    side_by_side_rounds: int = 0
    # each fresh timing process's median ratio (ratio_vs_onnxruntime is their median)
    ratio_vs_onnxruntime_per_process: list[float] = field(default_factory=list)
    # the machine stayed busy during the side-by-side timing (dynatune.machine.load): the ratio is not a
    # fair one; timing_load_cores: the cores other work took from it; timing_attempts: timings tried
    timing_under_load: bool = False
    timing_load_cores: float | None = None
    timing_attempts: int = 0
    # ONNX Runtime ran over QuietPolicy.slow_onnxruntime times its reference (alone, before tuning:
    # onnxruntime_reference_ms) in every timing process: a slow spell, not a fair ratio (.fresh_timing)
    timing_onnxruntime_slow: bool = False
    onnxruntime_reference_ms: float | None = None
    # the TVM side's fastest block in that timing: what the profile's model is held against (.profile)
    latency_min_ms: float | None = None
    # the relative error on each of the verification inputs (max_rel_err is their max), and their seeds
    max_rel_err_per_input: list[float] = field(default_factory=list)
    verify_seeds: list[int] = field(default_factory=list)

    def as_dict(self) -> dict:
        return asdict(self)


def build(model, target, database=None, lowering: Lowering = Lowering(), after=()):
    """Relax executable for ``model``: tuned functions from ``database``, the rest default-scheduled.

    ``lowering`` must be what the tasks were extracted with (:func:`dynatune.model.extract.extract_tasks`).
    ``after``: passes run on the lowered module last, before code generation
    (:mod:`dynatune.compiler.dispatch`).
    """
    import tvm
    from tvm import relax
    from tvm.relax import pipeline as rp
    from tvm.relax.transform import MetaScheduleApplyDatabase

    is_gpu = rp.BackendDispatcher.is_gpu_target(target)
    prepack = lowering.prepacks(target)

    @tvm.transform.module_pass(opt_level=3)
    def pipeline(mod, _ctx):
        mod = tvm.transform.Sequential(fuse_passes(target, lowering))(mod)
        # the concatenations to place, recognised before their schedules are applied
        concats = concat_functions(mod) if lowering.places_concats(target) else {}
        if database is not None:
            mod = MetaScheduleApplyDatabase(enable_warning=False)(mod)
        if prepack:
            mod = tvm.transform.Sequential(weight_prepack_passes())(mod)
        mod = place(mod, concats)
        if is_gpu:
            mod = gpu_default_schedule()(mod)
        return tvm.transform.Sequential(
            backend_passes(target, "dataflow_lower_passes") + finalize_passes(target, lowering) + list(after)
        )(mod)

    import contextlib

    mod = model.bound_module()
    with (
        target,
        database if database is not None else contextlib.nullcontext(),
        tvm.transform.PassContext(opt_level=3),
    ):
        return relax.build(mod, target=target, relax_pipeline=pipeline)


def finalize_passes(target, lowering: Lowering = Lowering()) -> list:
    """TVM's finalize passes for ``target``, with the planned memory's run-time objects made once: after the
    memory is planned (``StaticPlanBlockMemory``, ``LowerAllocTensor``) and before each variable is released
    after its last use (``KillAfterLastUse``), kernels take their storages flat
    (:mod:`dynatune.model.flat_storage`) and the views left are made once per place
    (:mod:`dynatune.model.shared_views`). mnasnet0_5: 7 ``vm.builtin.alloc_tensor`` calls a run instead of 54.
    Then the storages only kernels read become the executable's constants (``Lowering.resident_storage``,
    :mod:`dynatune.model.resident_storage`): a run of ``main`` allocates only what it returns, and the views a
    reshape reads; and ``main_into`` is added, which writes the outputs into tensors its caller passes
    (:mod:`dynatune.model.destination_entry`): a run of it allocates nothing. CPU targets only
    (``Lowering.flattens_storage``): a GPU target keeps TVM's passes.
    """
    passes = backend_passes(target, "finalize_passes")
    names = [p.info.name for p in passes]
    if "KillAfterLastUse" not in names or not lowering.flattens_storage(target):
        return passes
    at = names.index("KillAfterLastUse")
    ours = [flatten_planned_tensors_pass(), share_identical_views_pass()]
    if lowering.keeps_storage_resident(target):
        ours.append(keep_storages_resident_pass())
    ours.append(add_destination_entry_pass())
    return [*passes[:at], *ours, *passes[at:]]


def weight_prepack_passes() -> list:
    """After the tuned schedules are applied: move each kernel's weight-layout rewrite into a function of
    its own (``<kernel>_weight_prepack``, leaving ``<kernel>_prepacked``) and run it at compile time.

    ``relax.get_pipeline("static_shape_tuning", cpu_weight_prepack=True)`` also runs
    ``LiftTransformParams``, which lifts the packing of weights passed as *parameters* into a
    ``main_transform_params`` the user must call. dynatune binds the weights as constants, so there is
    nothing to lift (the pass would only add an empty ``main_transform_params``): ``FoldConstant``
    evaluates the packing calls instead, and the artifact stores the packed weights.

    Folding leaves the packing's results behind: where a kernel packs two weights (a weight and a bias),
    the tuple of packed constants bound to a variable, and a ``TupleGetItem`` of it per weight, which the
    kernel call reads. Each kernel call of the model ran four more VM instructions (a ``make_tuple`` of
    constants, two ``tuple_getitem``, a ``null_value``; mnasnet0_5: 212 of 387 a run).
    ``CanonicalizeBindings`` takes each known tuple's items apart (the call then reads the constants
    themselves) and ``DeadCodeElimination`` drops what is left, and the packing functions with them.
    (DCE alone, from ``d9140ea``, removed none of them: the items were still read. Side by side, removing
    them and making one tensor per planned storage: mnasnet0_5 0.965 of before, BENCHMARKS.md #55.)
    """
    from tvm import relax

    from dynatune.model.constant_folding import fold_constants_passes

    return [
        relax.transform.SplitLayoutRewritePreproc(),
        *fold_constants_passes(),
        relax.transform.CanonicalizeBindings(),
        relax.transform.DeadCodeElimination(["main"]),
    ]


def export(executable, path: str) -> str:
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    tmp = path + ".tmp.so"
    executable.export_library(tmp)
    os.replace(tmp, path)
    return path


def compare(outputs, reference, rel_tol: float = 1e-4) -> VerifyResult:
    if len(outputs) != len(reference):
        raise DynatuneError(f"compiled model has {len(outputs)} outputs, ONNX Runtime {len(reference)}")
    max_abs, max_rel, ok = 0.0, 0.0, True
    for o, r in zip(outputs, reference):
        r = np.asarray(r)
        o = np.asarray(o).reshape(r.shape)
        if r.dtype.kind in "fc":
            diff = float(np.max(np.abs(o.astype(np.float64) - r.astype(np.float64)))) if r.size else 0.0
            scale = float(np.max(np.abs(r))) if r.size else 0.0
            rel = diff / scale if scale > 0 else diff
            max_abs, max_rel = max(max_abs, diff), max(max_rel, rel)
            if r.dtype == np.float32 and rel > rel_tol:
                ok = False
        elif not np.array_equal(o, r):
            ok = False
            max_rel = max(max_rel, 1.0)
    return VerifyResult(max_abs, max_rel, ok, len(reference))


def verify(
    vm, model, device, *, threads: int, rel_tol: float = 1e-4, seeds=None, reference=None
) -> VerifyResult:
    """The compiled model (``vm``) against ONNX Runtime on several seeded random inputs (``seeds``:
    ``VERIFY_INPUTS`` of them by default): the max errors over the inputs, each input's relative error,
    and ``ok`` only when every input is within ``rel_tol``. ``reference``: the ONNX model ONNX Runtime runs
    (default: ``model`` itself)."""
    seeds = list(range(VERIFY_INPUTS) if seeds is None else seeds)
    sess = onnxruntime_session(model if reference is None else reference, threads)
    checks, references = [], []
    for seed in seeds:
        inputs = model.random_inputs(seed)
        references.append(sess.run(None, inputs))
        checks.append(compare(run(vm, model, inputs, device), references[-1], rel_tol))
    return VerifyResult(
        max_abs_err=max(c.max_abs_err for c in checks),
        max_rel_err=max(c.max_rel_err for c in checks),
        ok=all(c.ok for c in checks),
        outputs=checks[0].outputs,
        per_input_rel_err=[c.max_rel_err for c in checks],
        seeds=seeds,
        reference=references[0],
    )


def compile_and_verify(
    model,
    target,
    database,
    artifact_path: str,
    *,
    threads: int,
    rel_tol: float = 1e-4,
    measure_untuned: bool = True,
    measure_onnxruntime: bool = True,
    seed: int = 0,
    repeat: int = 10,
    lowering: Lowering = Lowering(),
    quiet: QuietPolicy = QuietPolicy(),
    timing_processes: int = 3,
    onnxruntime_reference_ms: float | None = None,
    on_stage=None,
) -> CompileReport:
    """``on_stage(name)`` is called as each stage starts: "compile", "verify", "timing", "untuned model".
    The artifact's metadata (:mod:`dynatune.compiler.artifact_metadata`) is written beside it once it is
    verified, and gets the side-by-side timing once that is taken; a timing whose every process ran ONNX
    Runtime slow against ``onnxruntime_reference_ms`` gets another process, then is flagged
    (:func:`dynatune.compiler.fresh_timing.time_in_fresh_process`)."""
    import tvm

    from dynatune.machine.target import target_device

    stage = on_stage or (lambda name: None)
    stage("compile")
    t0 = time.perf_counter()
    ex = build(model, target, database, lowering)
    export(ex, artifact_path)
    compile_s = time.perf_counter() - t0
    dev = tvm.device(target_device(target), 0)
    vm = load(artifact_path, dev)
    stage("verify")
    check = verify(vm, model, dev, threads=threads, rel_tol=rel_tol, seeds=range(seed, seed + VERIFY_INPUTS))
    metadata = artifact_metadata.write(
        artifact_path, artifact_metadata.describe(artifact_path, model, target, check.reference, threads)
    )
    inputs = model.random_inputs(seed)
    side = {}
    stage("timing")
    if measure_onnxruntime:  # latency_ms: the median of the TVM rounds, timed in a fresh process
        sbs = time_in_fresh_process(
            artifact_path,
            model,
            device=target_device(target),
            threads=threads,
            rounds=repeat,
            seed=seed,
            quiet=quiet,
            processes=timing_processes,
            reference_ms=onnxruntime_reference_ms,
        )
        artifact_metadata.record_timing(artifact_path, sbs)
        lat, std, ort_ms = sbs.tvm_median_ms, float(np.std(sbs.tvm_ms)), sbs.ort_median_ms
        side = dict(
            ratio_vs_onnxruntime=sbs.ratio,
            ratio_vs_onnxruntime_min=sbs.ratio_min,
            ratio_vs_onnxruntime_max=sbs.ratio_max,
            side_by_side_rounds=len(sbs.tvm_ms),
            ratio_vs_onnxruntime_per_process=sbs.per_process_ratios,
            timing_under_load=sbs.under_load,
            timing_load_cores=sbs.load_cores,
            timing_attempts=sbs.attempts,
            timing_onnxruntime_slow=sbs.onnxruntime_slow,
            onnxruntime_reference_ms=onnxruntime_reference_ms,
            latency_min_ms=min(sbs.tvm_ms),
        )
    else:
        (lat, std), ort_ms = time_vm(vm, model, inputs, dev, repeat=repeat), None
    untuned = None
    if measure_untuned:
        stage("untuned model")
        vm0 = relax_vm(build(model, target, None, lowering), dev)
        untuned = time_vm(vm0, model, inputs, dev, repeat=max(3, repeat // 3))[0]
    return CompileReport(
        artifact=os.path.abspath(artifact_path),
        metadata=os.path.abspath(metadata),
        latency_ms=lat,
        latency_std_ms=std,
        untuned_latency_ms=untuned,
        onnxruntime_latency_ms=ort_ms,
        max_abs_err=check.max_abs_err,
        max_rel_err=check.max_rel_err,
        numerics_ok=check.ok,
        threads=threads,
        compile_s=compile_s,
        max_rel_err_per_input=check.per_input_rel_err,
        verify_seeds=check.seeds,
        **side,
    )
