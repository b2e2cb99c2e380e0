"""One tuning run, start to end, in one place: resume, warm start, coverage pass, rounds, periodic
whole-model measurement, compile + verify, profile, summary and report.

    from dynatune.run.config import load_config
    from dynatune.run.pipeline import run
    summary = run(load_config("configs/quickstart.yaml"), callbacks=[...])

No Prefect, no MLflow: observers are :class:`~dynatune.run.callbacks.RunCallback` objects, and how each
stage is executed is a :class:`Steps` object. The Prefect flow (``flows/tune_model.py``) passes Steps
whose members are Prefect tasks (one task run per round) and the MLflow callback; benches pass their
own settings. Without Prefect the library gives the same result.
"""

from __future__ import annotations

import datetime
import math
import os
import time
from dataclasses import dataclass

from dynatune import __version__
from dynatune.compiler import cold_choice
from dynatune.compiler.compiled_tasks import CompiledTasks
from dynatune.errors import DynatuneError
from dynatune.files import WorkDir, atomic_write_json
from dynatune.run.callbacks import CallbackList, RunStart, TaskRetired
from dynatune.run.lock import WorkDirLock
from dynatune.run.summary import RunSummary
from dynatune.search.intrinsics import import_tensor_intrinsics
from dynatune.search.measure import ColdProtocol

MAX_FAILED_ROUNDS = 3  # rounds in a row that may fail (after their retries) before the run gives up
PROFILE_HEADLINE = (
    "model_ms",
    "estimate_ms",
    "estimate_over_model",
    "kernel_ms",
    "calls_without_task_ms",
    "between_calls_ms",
    "model_run_ms",
    "between_calls_run_ms",
    "dispatch_ms",
    "gap_ms",
    "under_load",
    "load_cores",
    "attempts",
    "fastest_model_ms",
    "slow_spell",
)  # the profile's figures the summary carries


# -- the stages ---------------------------------------------------------------------------------------
def load_model(cfg):
    """ONNX -> Relax (weights as parameters)."""
    from dynatune.model.importer import load_model as load

    return load(cfg.model.path, cfg.model.shapes, name=cfg.model.name)


def extract(model, cfg):
    """(target, weighted tasks, cache hit): cached on (model content hash, shapes, target) in
    <work_dir>/cache."""
    from dynatune.machine.target import make_target
    from dynatune.model.cache import cached_extract

    target = make_target(cfg.target)
    tasks, hit = cached_extract(model, target, WorkDir(cfg.work_dir).cache, cfg.compile.lowering())
    return target, tasks, hit


def prepare(tuner) -> float:
    """Round 0: every task's untuned latency (once per work dir). Returns the estimate (s)."""
    return tuner.prepare()


def tune_round(tuner, round_no: int):
    """Choose a task -> tune it for one slot (or one first batch) -> record the round."""
    del round_no  # names the round (the Prefect task run is called after it)
    return tuner.step()


def compile_verify(
    model, target, database, cfg, artifact: str, on_stage=None, lowering=None, onnxruntime_reference_ms=None
):
    """``on_stage(name)``: called as compile, verify and timing start. ``lowering``: the config's unless
    the run chose another (:mod:`dynatune.compiler.winograd_choice`). ``onnxruntime_reference_ms``: ONNX
    Runtime's time alone at the run's start, what the timing's is held against (a slow spell)."""
    from dynatune.compiler.compile import compile_and_verify
    from dynatune.machine.target import usable_cores

    return compile_and_verify(
        model,
        target,
        database,
        artifact,
        threads=usable_cores(),
        rel_tol=cfg.compile.rel_tol,
        measure_untuned=cfg.compile.measure_untuned,
        measure_onnxruntime=cfg.compile.measure_onnxruntime,
        lowering=lowering or cfg.compile.lowering(),
        quiet=cfg.compile.quiet(),
        timing_processes=cfg.compile.timing_processes,
        onnxruntime_reference_ms=onnxruntime_reference_ms,
        on_stage=on_stage,
    )


@dataclass
class Steps:
    """How the stages run: plain calls by default; the Prefect flow passes Prefect tasks."""

    load_model: object = load_model
    extract: object = extract
    prepare: object = prepare
    tune_round: object = tune_round
    compile_verify: object = compile_verify


# -- the run ------------------------------------------------------------------------------------------
class TuningRun:
    """The set-up half of a run, as a context manager: the work dir locked and checked, the model imported,
    its tasks extracted, the session opened (warm-started if asked), the tuner ready and every task's
    untuned latency measured. On exit the tuner and its worker pools are closed and the lock released.

    :func:`run` drives it to the end; benches use it with their own settings and loops.
    """

    def __init__(self, cfg, steps: Steps | None = None, on_stage=None):
        """``on_stage(name, detail="")``: called as each stage starts (:meth:`RunCallback.on_stage`)."""
        self.cfg = cfg
        self.steps = steps or Steps()
        self.on_stage = on_stage or (lambda name, detail="": None)
        self.tuner = None
        self.library = None
        self.roofline = None  # this machine's, read or measured once per run (the beliefs' and the profile's)
        self._compiled_tasks = None  # what the profile reads, when the compiled model's tasks differ
        self.onnxruntime_reference_ms = None  # ONNX Runtime alone at the start (the final timing's reference)
        self._compiled_with = None  # (database, lowering) of the compile
        self._lock = None

    def __enter__(self) -> "TuningRun":
        from dynatune.library.link import RunLibrary
        from dynatune.machine.roofline import machine_roofline
        from dynatune.run.tuner import Tuner, check_same_run
        from dynatune.search.batch_callbacks import default_batch_callbacks
        from dynatune.search.session import TuningSession

        cfg, steps = self.cfg, self.steps
        os.makedirs(cfg.work_dir, exist_ok=True)
        self._lock = WorkDirLock(cfg.work_dir).acquire(wait_s=2.0)
        try:
            self.config_hash = cfg.config_hash()
            check_same_run(cfg.work_dir, self.config_hash)  # before anything in the work dir is written
            atomic_write_json(WorkDir(cfg.work_dir).config, cfg.to_record())
            self.on_stage("import", cfg.model.path)
            self.model = steps.load_model(cfg)
            self.on_stage("extraction")
            self.target, self.tasks, self.cache_hit = steps.extract(self.model, cfg)
            import_tensor_intrinsics()
            self.library = RunLibrary.for_config(cfg, self.target, self.model.name)
            self.session = TuningSession(
                self.tasks,
                self.target,
                cfg.work_dir,
                search=cfg.search,
                measure=cfg.measure,
                batch_callbacks=default_batch_callbacks() + self.library.callbacks()
                if self.library
                else None,
            )
            self.warm_start = None
            if cfg.warm_start:
                from dynatune.run.warmstart import warm_start

                self.warm_start = warm_start(self.session, cfg.warm_start)
            if self.library:
                self.library.seed(self.session)
            self.anchors = self._anchors()
            # a device farm measures elsewhere: this machine's roofline does not apply
            self.roofline = None if cfg.measure.rpc else machine_roofline(self.target)
            self.onnxruntime_reference_ms = self._onnxruntime_reference()
            self.tuner = Tuner(
                self.session,
                cfg.scheduler.name,
                budget_s=cfg.budget_s,
                slot_s=cfg.slot_s,
                seed=cfg.scheduler.seed,
                scheduler_params=cfg.scheduler.params,
                warmup_share=cfg.warmup_share,
                warmup_trials=cfg.warmup_trials,
                roofline=self.roofline,
                anchors=self.anchors,
                stopping=cfg.stopping.rule(),
                warm_sources=cfg.warm_start,
            )
            atomic_write_json(WorkDir(cfg.work_dir).tasks, [t.as_dict() for t in self.tasks])
            self.on_stage("untuned latencies", f"{len(self.tasks)} tasks")
            self.untuned_estimate_s = steps.prepare(self.tuner)
        except BaseException:
            self.__exit__(None, None, None)
            raise
        return self

    def _anchors(self) -> dict[int, float]:
        """ONNX Runtime's time per task's operator on this machine (``anchors``; none on a device farm)."""
        from dynatune.compiler.anchors import run_anchors
        from dynatune.machine.target import usable_cores

        if not self.cfg.anchors or self.cfg.measure.rpc:
            return {}
        self.on_stage("anchors", "ONNX Runtime's time per operator")
        return run_anchors(
            self.model,
            self.tasks,
            self.cfg.work_dir,
            usable_cores(),
            sources=self.cfg.warm_start,
            target=str(self.target),
        )

    def _onnxruntime_reference(self, when: str = "before tuning") -> float | None:
        """ONNX Runtime's fastest block alone, in fresh processes, before tuning: the final timing's ONNX
        Runtime side is held against it to tell a slow spell (:mod:`dynatune.compiler.fresh_timing`). Taken
        by every invocation, a resumed one too: the machine may not be the one the run started on; and again
        before the final timing (:meth:`compile`)."""
        from dynatune.compiler.fresh_timing import onnxruntime_reference_ms
        from dynatune.machine.target import usable_cores

        c = self.cfg.compile
        if not (c.measure_onnxruntime and c.timing_slow_onnxruntime):
            return None
        self.on_stage("onnxruntime reference", f"ONNX Runtime's time alone, {when}")
        return onnxruntime_reference_ms(self.model, threads=usable_cores(), quiet=c.quiet())

    def start_event(self) -> RunStart:
        return RunStart(
            self.cfg,
            self.model,
            self.tasks,
            self.tuner.run_state,
            self.untuned_estimate_s,
            self.tuner.rounds_done,
            self.tuner.elapsed_s,
            self.cache_hit,
            self.warm_start,
            self.config_hash,
            self.library.report() if self.library else None,
        )

    def compile(self, artifact: str | None = None):
        """Compile with the best schedules, verify against ONNX Runtime (the worker pools are stopped first:
        idle pools must not share the cores with the final timing)."""
        database, lowering = self.session.compile_database(), self.cfg.compile.lowering()
        # kernels timed cold, as the model runs them: each task's among its best few, and Winograd's duels
        cold = ColdProtocol() if self.cfg.compile.cold_choice and cold_choice.applies(self.target) else None
        if cold is not None:
            database = self._choose_cold(database, cold)
        if lowering.winograds(self.target):
            database, lowering = self._choose_winograd(database, lowering, cold)
        self.session.close_workers()
        # what the profile's model with empty kernels is built from
        self._compiled_with = (database, lowering)
        if self.onnxruntime_reference_ms is not None:
            # a reference taken in a slow spell reads high and checks nothing (a README job's read 5.46 ms
            # where 3.62-3.68 was usual): the least of it and one taken again now, on the quiet cores
            again = self._onnxruntime_reference("again, before the final timing")
            self.onnxruntime_reference_ms = min(self.onnxruntime_reference_ms, again or math.inf)
        return self.steps.compile_verify(
            self.model,
            self.target,
            database,
            self.cfg,
            artifact or WorkDir(self.cfg.work_dir).model_so,
            on_stage=self.on_stage,
            lowering=lowering,
            onnxruntime_reference_ms=self.onnxruntime_reference_ms,
        )

    def _choose_cold(self, database, protocol: ColdProtocol):
        """Each task's kernel chosen among its best few as the model runs them (:mod:`.cold_choice`)."""
        self.on_stage("cold choice")
        choice = cold_choice.choose_cold(self.session, database, protocol)
        choice.write(WorkDir(self.cfg.work_dir).report_dir)
        self.on_stage("cold choice", choice.summary())
        estimate = self.session.estimated_latency()
        self._compiled_tasks = CompiledTasks(self.target, self.session.tasks, choice.database, estimate)
        return choice.database

    def _choose_winograd(self, database, lowering, cold: ColdProtocol | None):
        """Winograd kept only where its tuned kernel beats the direct one (:mod:`.winograd_choice`), its
        duels timed ``cold`` where the compile times kernels cold."""
        from dynatune.compiler.winograd_choice import choose_winograd

        self.on_stage("winograd choice")
        choice = choose_winograd(self.model, self.session, lowering, database, cold=cold)
        choice.write(WorkDir(self.cfg.work_dir).report_dir)
        if choice.duels:
            self.on_stage("winograd choice", choice.summary())
        if choice.lowering.winograd_direct:  # the compiled model's tasks are not the session's
            self._compiled_tasks = CompiledTasks(
                self.target, choice.tasks, choice.database, choice.estimated_latency()
            )
        return choice.database, choice.lowering

    def profile(self, artifact: str, fastest_model_ms: float | None = None) -> dict:
        """Per-kernel profile of the compiled model (``report/profile.json`` and ``.md``): each call timed in
        the model beside its task's best schedule timed alone, and where the gap to the estimate goes; taken
        again while its model is slow against ``fastest_model_ms`` (the final timing's fastest block)."""
        from dynatune.compiler.dispatch import empty_kernels_executable
        from dynatune.compiler.profile import write_profile

        self.on_stage("profile")
        database, lowering = self._compiled_with or (
            self.session.compile_database(),
            self.cfg.compile.lowering(),
        )
        return write_profile(
            artifact,
            self.model,
            self._compiled_tasks or self.session,
            WorkDir(self.cfg.work_dir).report_dir,
            quiet=self.cfg.compile.quiet(),
            roofline=self.roofline,  # the one the run's beliefs used: not measured again
            fastest_model_ms=fastest_model_ms,
            # the same calls with empty kernels: what they cost, measured (.dispatch)
            dispatch=empty_kernels_executable(self.model, self.target, database, lowering),
        )

    def __exit__(self, *exc) -> None:
        try:
            if self.tuner is not None:
                self.tuner.close()
        finally:
            if self.library is not None:
                self.library.close()
            self._lock.release()


def run(cfg, callbacks=(), steps: Steps | None = None) -> RunSummary:
    """Tune ``cfg``'s model for its budget (resuming a run of the same config in its work dir), compile it,
    check it against ONNX Runtime, write the report and the summary. Returns the summary."""
    cbs = CallbackList(callbacks)
    t_start = time.perf_counter()
    started = False
    with TuningRun(cfg, steps, on_stage=cbs.on_stage) as r:
        try:
            cbs.on_start(r.start_event())
            started = True
            r.tuner.save_run_state(
                config_hash=r.config_hash
            )  # with what the callbacks keep (the MLflow run id)
            for t in r.tasks:  # a task whose untuned schedule does not build or run: say why
                st = r.session.state(t.index)
                if st.note and st.default_s is not None and not math.isfinite(st.default_s):
                    cbs.on_retired(TaskRetired(t.index, t.name, st.note))
            from dynatune.compiler.periodic import PeriodicMeasurement

            periodic = PeriodicMeasurement(cfg, r.model, r.target, r.tuner)
            _rounds(r.tuner, r.steps, cbs, periodic)
            report = r.compile() if cfg.compile.verify else None
            profile = (
                r.profile(report.artifact, report.latency_min_ms)
                if report is not None and cfg.compile.profile
                else None
            )
            summary = make_summary(
                cfg, r.model, r.tasks, r.tuner, report, periodic, time.perf_counter() - t_start
            )
            cbs.on_stage("report")
            summary.library = r.library.report() if r.library else None
            # the estimate when this process started tuning: with a library or a warm start, below the
            # untuned one
            summary.start_estimated_latency_ms = r.untuned_estimate_s * 1e3
            if profile is not None:
                summary.profile = {k: profile.get(k) for k in PROFILE_HEADLINE}
            summary = summary.model_copy(
                update=residual_fields(summary.estimated_latency_ms, r.tuner, profile)
            )
            out = write_report(cfg, r.tuner, summary)
            try:
                cbs.on_finish(summary, out)  # a callback may add to the summary (the MLflow run id)
            finally:
                summary.write(WorkDir(cfg.work_dir).summary)  # once per run, with what the callbacks added
            if report is not None and not report.numerics_ok:
                raise DynatuneError(
                    f"compiled model does not match ONNX Runtime: max relative error "
                    f"{report.max_rel_err:.2e} > {cfg.compile.rel_tol:g}",
                    "see the report in " + cfg.work_dir,
                )
            return summary
        except BaseException as exc:
            if started:
                cbs.on_failure(exc)
            raise


def _rounds(tuner, steps, cbs, periodic) -> None:
    """Rounds until the budget is spent or every task is retired. A round that fails (after the step's own
    retries) does not end the run; ``MAX_FAILED_ROUNDS`` in a row do."""
    failures, stage = 0, None
    while not tuner.done():
        now = "coverage pass" if tuner.warmup_choice() is not None else "tuning"
        if now != stage:
            stage = now
            cbs.on_stage(stage)
        try:
            rec = steps.tune_round(tuner, tuner.rounds_done)
            failures = 0
        except Exception as exc:
            failures += 1
            cbs.on_round_failed(str(exc).splitlines()[0][:200] if str(exc) else type(exc).__name__)
            if failures >= MAX_FAILED_ROUNDS:
                raise
            continue
        if rec is None:
            break
        cbs.on_round(rec)
        if rec.result.get("exhausted") and rec.result.get("note"):
            cbs.on_retired(TaskRetired(rec.task, rec.task_name, rec.result["note"]))
        if periodic.due():
            cbs.on_stage("measurement", "compile and time the model beside ONNX Runtime")
            cbs.on_measurement(periodic.measure())
            stage = None  # the next round says which stage it is in again
    cbs.on_tuning_end(tuner.ending())


# -- summary and report -------------------------------------------------------------------------------
def make_summary(cfg, model, tasks, tuner, report, periodic, wall_s) -> RunSummary:
    """The summary of what the run tuned and, with ``report`` (the compile-and-verify report), measured; the
    pipeline adds the library's part, the profile and the residual."""
    session = tuner.session
    elapsed_s = round(tuner.elapsed_s, 3)
    end = tuner.ending()
    parity_s = periodic.parity_s()  # with the final measurement, when there was one
    measured = {}
    if report is not None:  # no parity from a ratio taken on a busy machine
        fair = not (report.timing_under_load or report.timing_onnxruntime_slow)
        final_ratio = report.ratio_vs_onnxruntime if fair else None
        parity_s = periodic.parity_s(elapsed_s, final_ratio)
        measured = dict(
            latency_ms=report.latency_ms,
            untuned_latency_ms=report.untuned_latency_ms,
            onnxruntime_latency_ms=report.onnxruntime_latency_ms,
            max_rel_err=report.max_rel_err,
            max_rel_err_per_input=report.max_rel_err_per_input,  # one per verification input
            max_abs_err=report.max_abs_err,
            numerics_ok=report.numerics_ok,
            artifact=report.artifact,
            artifact_metadata=report.metadata,
            threads=report.threads,
            ratio_vs_onnxruntime=report.ratio_vs_onnxruntime,
            ratio_vs_onnxruntime_min=report.ratio_vs_onnxruntime_min,
            ratio_vs_onnxruntime_max=report.ratio_vs_onnxruntime_max,
            ratio_vs_onnxruntime_per_process=report.ratio_vs_onnxruntime_per_process or None,
            timing_under_load=report.timing_under_load,
            timing_load_cores=report.timing_load_cores,
            timing_attempts=report.timing_attempts,
            timing_onnxruntime_slow=report.timing_onnxruntime_slow,
            onnxruntime_reference_ms=report.onnxruntime_reference_ms,
        )
        if report.untuned_latency_ms:
            measured["speedup_vs_untuned"] = report.untuned_latency_ms / report.latency_ms
        if report.onnxruntime_latency_ms:
            measured["speedup_vs_onnxruntime"] = report.onnxruntime_latency_ms / report.latency_ms
    return RunSummary(
        model=model.name,
        model_sha256=model.sha256,
        model_version=cfg.model.version,
        scheduler=cfg.scheduler.name,
        tasks=len(tasks),
        rounds=len(tuner.rounds),
        trials=sum(r["result"]["trials"] for r in tuner.rounds),
        budget_s=cfg.budget_s,
        elapsed_s=elapsed_s,
        wall_s=round(wall_s, 3),
        estimated_latency_ms=session.estimated_latency() * 1e3,
        initial_estimated_latency_ms=session.untuned_estimated_latency() * 1e3,
        estimate_excludes=session.excluded_tasks(),
        warmup_rounds=sum(1 for r in tuner.rounds if r.get("phase") == "warmup"),
        never_tuned_tasks=tuner.never_tuned(),
        stopped_early=end.stopped_early,
        stop_reason=end.reason,
        tuning_s_used=elapsed_s,
        tuning_s_saved=round(end.saved_s, 3),
        stop_check=tuner.last_check(),
        confirmed=tuner.confirmation(),
        work_dir=cfg.work_dir,
        measurements=periodic.points,
        time_to_onnxruntime_parity_s=parity_s,
        periodic_measure_s=round(sum(p["seconds"] for p in periodic.points), 3),
        dynatune_version=__version__,
        retired_tasks={t.name: session.state(t.index).note for t in tasks if session.state(t.index).note},
        **measured,
    )


def residual_fields(estimate_ms: float, tuner, profile: dict | None) -> dict:
    """The estimate counting what the kernels alone miss (:mod:`dynatune.compiler.residual`): plus the final
    profile's residual (the model minus its tasks alone, timed in the same rounds), unless that was taken in
    a slow spell (``slow_spell``: the model slows more than its kernels alone), else the last periodic
    measurement's; None when neither was measured."""
    if profile is not None and not profile.get("slow_spell"):
        residual, source = profile["gap_ms"], "final profile"
    elif (r := tuner.residual_s()) is not None:
        residual, source = r * 1e3, "periodic measurement"
    else:
        return {"residual_ms": None, "residual_source": None, "estimated_model_latency_ms": None}
    return {
        "residual_ms": residual,
        "residual_source": source,
        "estimated_model_latency_ms": estimate_ms + residual,
    }


def write_report(cfg, tuner, summary: RunSummary) -> str:
    """The work dir's ``report/``: convergence and belief plots, markdown report. Returns the dir. (Its
    ``summary.json`` is written by :func:`run`, once, after the callbacks.)"""
    from dynatune.run import report as rp

    wd = WorkDir(cfg.work_dir)
    os.makedirs(wd.report_dir, exist_ok=True)
    initial = summary.initial_estimated_latency_ms / 1e3
    rp.convergence_plot(
        {cfg.scheduler.name: rp.curve_from_rounds(tuner.rounds, initial)},
        wd.convergence_png,
        title=f"{summary.model} ({cfg.scheduler.name})",
    )
    ctx = tuner.context()
    table = {b.task: b for b in tuner.belief_table()}
    rp.belief_plot(
        [
            {
                "name": t.name,
                "weight": t.weight,
                "default_s": t.default_s,
                "history": t.history,
                "gain_mean_s": table[t.index].gain_mean_s if t.index in table else 0.0,
                "gain_std_s": table[t.index].gain_std_s if t.index in table else 0.0,
                "slot_s": cfg.slot_s,
            }
            for t in ctx.tasks
        ],
        wd.beliefs_png,
    )
    rp.markdown_report(summary, tuner.rounds, wd.report_md)
    return wd.report_dir


# -- retunes --------------------------------------------------------------------------------------------
def retune_config(cfg, now: datetime.datetime | None = None):
    """The config of a retune of ``cfg``: same model, search, store; a new dated work directory.

    The new run is warm-started from the newest earlier run of this config that has records (the base
    work dir or an earlier retune), so matched tasks start at their best known schedules and the search
    carries on from them; it is tracked as a new MLflow run (``trigger=retune``) in the same store and
    experiment, so nightly runs line up in the MLflow UI.
    """
    stamp = (now or datetime.datetime.now(datetime.timezone.utc)).strftime("%Y%m%dT%H%M%SZ")
    base = cfg.work_dir
    work_dir = WorkDir(base).retune(stamp)
    prev = latest_run_dir(base)
    warm = list(cfg.warm_start)
    if prev and prev not in warm:
        warm.append(prev)
    # unnamed, the MLflow run is named after the model, the date and time, the scheduler and "retune"
    tracking = cfg.tracking.model_copy(
        update={"tags": {**cfg.tracking.tags, "trigger": "retune", "retune_of": base}}
    )
    return cfg.model_copy(update={"work_dir": work_dir, "warm_start": warm, "tracking": tracking})


def latest_run_dir(base: str) -> str | None:
    """The newest of ``base`` and ``base/retune/*`` that holds tuning records (None if none does)."""

    def has_records(d):
        p = WorkDir(d).records
        return os.path.exists(p) and os.path.getsize(p) > 0

    root = WorkDir(base).retune_root
    dated = sorted(os.listdir(root), reverse=True) if os.path.isdir(root) else []
    for d in [WorkDir(base).retune(x) for x in dated] + [base]:
        if has_records(d):
            return d
    return None
