"""The incremental tuning session: tune task k for one slot, stop, and go on later where it stopped.

One :class:`TuningSession` per model run. It keeps, between slots:

- each task's MetaSchedule search state (a ``TuneContext`` with an evolutionary search, pre-tuned once);
- one cost model shared by all tasks (saved to disk after every slot, reloaded by the next process);
- the durable tuning database (:mod:`dynatune.search.database`), so a later slot, or a later process, starts
  from every record measured so far;
- ``session.json``: each task's untuned latency (measured once), tuning seconds and trials spent, and its
  history of best latency after every slot (what the belief model learns from;
  :mod:`dynatune.search.session_state`).

One-off costs are paid once per process, never per round: TVM's ``tensor_intrin`` import, the builder
and runner worker pools (kept alive, see :mod:`dynatune.search.builder`), and the cost model.
"""

from __future__ import annotations

import logging
import math
import os
import time
from dataclasses import asdict, dataclass, field
from typing import Annotated

from pydantic import Field

from dynatune.files import WorkDir, remove_leftovers
from dynatune.machine.target import gpu_default_schedule, target_device
from dynatune.model.extract import Task
from dynatune.search.batch_callbacks import Batch, default_batch_callbacks, short_error
from dynatune.search.costmodel import cost_model_names
from dynatune.search.database import JsonlWriter, TuningDatabase, mean_secs
from dynatune.search.index_args import bounds_by_args, index_bounds
from dynatune.search.layout_rewrite import REJECTED, finish_candidates
from dynatune.search.measure import ColdProtocol, MeasureConfig, make_runner, merged_results, t95
from dynatune.search.population import CarriedPopulation
from dynatune.search.retirement import SEARCH_EXHAUSTED, RetirementPolicy
from dynatune.search.sampled import sampled_candidates
from dynatune.search.section import MAX_SEED, OneOf, Section
from dynatune.search.session_state import TaskState, read_session_state, write_session_state
from dynatune.search.space import UNROLL_STEPS

log = logging.getLogger(__name__)
RELEARN_RECORDS = 512  # per task: the best records a cost model started afresh learns (feature extraction)


ANALYTIC_HEAD = 2  # register blocks heading a task's first batch (each: producers at the root, then inlined)


class SearchConfig(Section):
    """Evolutionary-search settings sized for small budgets on few cores (the config's ``search:``)."""

    trials_per_iter: int = Field(16, ge=1)
    # a lean search: on 2 cores a population of 128 evolved twice took 60 % of the tuning time, and 64 evolved
    # once reached 1.4x lower latencies in the same seconds (BENCHMARKS.md, session 8)
    population_size: int = Field(64, ge=8)
    init_measured_ratio: float = Field(0.2, ge=0, le=1)
    init_min_unmeasured: int = Field(16, ge=0)
    genetic_num_iters: int = Field(1, ge=0)
    genetic_mutate_prob: float = Field(0.85, ge=0, le=1)
    eps_greedy: float = Field(0.05, ge=0, le=1)
    max_trials_per_task: int = Field(10_000, ge=1)
    cost_model: OneOf(cost_model_names) = "xgb"  # xgb | ensemble (AdaTune) | random
    contextual_exploration: bool = False  # ensemble only: rank by mean + kappa*std, kappa from sigma/best
    seed: int = Field(0, ge=0, le=MAX_SEED)
    # the most a build may take; once 8 candidates have built, a candidate may take 10x the median
    # build, at least 4 s (dynatune.search.builder.BuildTimeLimit)
    build_timeout_s: float = Field(15.0, gt=0)
    # a task's first batch starts with register-blocked kernels derived from the target
    # (dynatune.search.analytic): conv2d, dense, matmul and batch matmul on CPU targets
    analytic_first: bool = True
    # the rest of a task's first batch, after its head (analytic candidates, the library's): random samples
    # of its design space (dynatune.search.sampled), not the evolutionary search's picks
    sampled_first_batch: bool = True
    # the batches after a task's first carry their initial population over: the database's best replayed
    # once, the random samples kept, init_min_unmeasured of them drawn anew per batch
    # (dynatune.search.population). Off by default: 8-16 % more candidates in 240 s with models as fast, but
    # a 5 % slower model after 900 s (BENCHMARKS.md, session 26)
    carry_population: bool = False
    # how far the search may unroll the loops of a task that tiles a block (dynatune.search.space):
    # MetaSchedule's CPU rules also offer 512 steps, whose kernels took twice as long to build
    unroll_steps: list[Annotated[int, Field(ge=0)]] = Field(
        default_factory=lambda: list(UNROLL_STEPS), min_length=1
    )
    # the weights' layout rewrite runs on the candidates built, not on every schedule the search ranks
    # (dynatune.search.layout_rewrite): a task's search 0.57-0.88x the ms per candidate, its kernels as good
    # after as many candidates (BENCHMARKS.md, session 29)
    defer_layout_rewrite: bool = True


@dataclass
class RoundResult:
    """What one slot of tuning one task did."""

    task: int
    task_name: str
    trials: int = 0
    build_errors: int = 0
    run_errors: int = 0
    best_before_s: float = math.inf
    best_after_s: float = math.inf
    wall_s: float = 0.0
    search_s: float = 0.0
    build_s: float = 0.0
    measure_s: float = 0.0
    exhausted: bool = False
    repeats: int = 0  # measurement repeats actually run
    repeats_saved: int = 0  # repeats the adaptive evaluator did not need, vs. its maximum
    stops: dict = field(default_factory=dict)  # why measurements stopped: settled/raced/max_repeats/fixed
    errors: list[str] = field(default_factory=list)
    note: str = ""  # why the task was retired (set when ``exhausted``)

    def as_dict(self) -> dict:
        d = asdict(self)
        d["errors"] = self.errors[:5]
        return d


class TuningSession:
    def __init__(
        self,
        tasks: list[Task],
        target,
        work_dir: str,
        *,
        search: SearchConfig | None = None,
        measure: MeasureConfig | None = None,
        num_workers: int | None = None,
        builder=None,
        runner=None,
        cost_model=None,
        batch_callbacks=None,
        retirement: RetirementPolicy | None = None,
    ):
        """``builder``, ``runner``, ``cost_model``: the collaborators (as MetaSchedule's task scheduler takes
        them); by default a :class:`~dynatune.search.builder.PersistentBuilder`, a
        :class:`~dynatune.search.measure.Runner` for ``measure`` and the ``search.cost_model`` (reloaded from
        the work dir). ``batch_callbacks``: what runs after each batch
        (:mod:`dynatune.search.batch_callbacks`); ``retirement``: when a task stops."""
        from dynatune.machine.target import usable_cores
        from dynatune.search.builder import PersistentBuilder  # imports TVM: not needed to read a config

        self.tasks = tasks
        self.target = target
        self.work_dir = work_dir
        self.search = search or SearchConfig()
        self.measure = measure or MeasureConfig()
        os.makedirs(work_dir, exist_ok=True)
        remove_leftovers(work_dir)
        wd = WorkDir(work_dir)
        self.db = TuningDatabase(wd.db)
        # per measured candidate: repeats used and why the evaluator stopped (one line per batch)
        self.measurement_log = JsonlWriter(wd.measurements)
        self.batch_callbacks = (
            list(batch_callbacks) if batch_callbacks is not None else default_batch_callbacks()
        )
        self.retirement = retirement or RetirementPolicy()
        self.state_path = wd.session
        self.cost_model_path = wd.cost_model
        self.states: dict[str, TaskState] = {t.key: TaskState() for t in tasks}
        self._load_state()
        self.builder = builder or PersistentBuilder(
            num_workers or usable_cores(),
            timeout_sec=self.search.build_timeout_s,
            artifact_dir=wd.build_dir(os.getpid()),
            batched=not self.measure.rpc,  # a device farm uploads one library per candidate
        )
        self.runner = runner or make_runner(self.measure, target)
        self._relearn: set[str] = set()  # keys of the tasks whose records a fresh cost model has to learn
        self.cost_model = cost_model or self._make_cost_model()
        self._contexts: dict[int, object] = {}
        self._spaces: dict[int, list] = {}  # task index -> its design spaces
        self._deferred: dict[int, list] = {}  # task index -> postprocessors run on its built candidates only
        self._populations: dict[int, CarriedPopulation] = {}  # task index -> its search's carried population
        # task index -> candidates measured at the head of its next batch, before the search's own: a function
        # of the task's TuneContext (its postprocessors) and the batch size, called once (the library's
        # transfer)
        self.first_candidates: dict[int, object] = {}
        self._index_bounds: dict[str, dict[int, int]] = {}  # task key -> {param position: high}
        self.analytic_counts: dict[str, int] = {}  # task key -> analytic candidates in its first batch

    # -- persistence -----------------------------------------------------------------------------
    def _load_state(self) -> None:
        for key, st in read_session_state(self.state_path).items():
            if key in self.states:
                self.states[key] = st

    def save_state(self) -> None:
        write_session_state(self.state_path, self.states)
        if self.cost_model is not None and hasattr(self.cost_model, "save") and self._cost_model_trained():
            tmp = self.cost_model_path + ".tmp"
            self.cost_model.save(tmp)
            os.replace(tmp, self.cost_model_path)

    def _cost_model_trained(self) -> bool:
        return getattr(self.cost_model, "data_size", 0) > 0

    def _make_cost_model(self):
        from dynatune.search.costmodel import load_cost_model, make_cost_model

        kind, seed, ce = self.search.cost_model, self.search.seed, self.search.contextual_exploration
        cm = make_cost_model(kind, seed, contextual_exploration=ce)
        if os.path.exists(self.cost_model_path) and hasattr(cm, "load"):
            try:
                load_cost_model(cm, self.cost_model_path)
            except Exception as exc:  # a pickle, an older format, a damaged file: never run, never kept
                reason = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
                log.warning("%s; the cost model starts afresh and relearns the tuning records", reason)
                cm = make_cost_model(kind, seed, contextual_exploration=ce)
                self._relearn = {t.key for t in self.tasks}
        return cm

    def _relearn_records(self, ctx, i: int) -> None:
        """Teach a cost model started afresh a task's best recorded candidates (the records are JSON: an
        old work dir's cost model is rebuilt from them)."""
        from tvm.s_tir.meta_schedule.runner import RunnerResult

        task = self.tasks[i]
        self._relearn.discard(task.key)
        records = self.db.memory.get_top_k(self.db.workload(task.key, task.mod), RELEARN_RECORDS)
        pairs = []
        for r in records:
            if candidate := self._as_searched(ctx, r, self._deferred.get(i)):
                pairs.append((candidate, RunnerResult(r.run_secs, None)))
        if pairs:
            self.cost_model.update(ctx, [c for c, _ in pairs], [res for _, res in pairs])

    def _as_searched(self, ctx, record, deferred):
        """A record's candidate as the task's search ranks it: without the postprocessors ``deferred`` to
        the candidates built, if any (:mod:`dynatune.search.layout_rewrite`); ``None`` where its trace
        does not apply (a structurally equal workload may name its blocks otherwise)."""
        from dynatune.search.reapply import measure_candidate, reapply

        if deferred:
            sch = reapply(ctx.mod, record.trace, ctx.space_generator.postprocs)
            return measure_candidate(sch) if sch is not None else None
        try:
            return record.as_measure_candidate()
        except Exception:
            return None

    # -- warm start ------------------------------------------------------------------------------
    def import_records(self, other: TuningDatabase, keys) -> int:
        """Copy another run's records of tasks ``keys`` into this session's database; returns how many."""
        return self.db.import_records(other, keys, mods={t.key: t.mod for t in self.tasks})

    def adopt_progress(self, key: str, earlier: dict) -> None:
        """Carry over an earlier run's progress on task ``key`` (its ``session.json`` entry): history,
        seconds, trials, its untuned latency if this run has not measured it, and a search space it
        exhausted there (its records came along: nothing new is left here either; a task retired for its
        failures is tried again). A task already tuned here keeps its own."""
        st = self.states[key]
        if st.history:
            return
        st.history = [list(h) for h in earlier.get("history", [])]
        st.seconds, st.trials = earlier.get("seconds", 0.0), earlier.get("trials", 0)
        if st.default_s is None:
            st.default_s = earlier.get("default_s")
        if earlier.get("exhausted") and earlier.get("note") == SEARCH_EXHAUSTED:
            st.exhausted, st.note = True, SEARCH_EXHAUSTED

    # -- queries ---------------------------------------------------------------------------------
    def state(self, i: int) -> TaskState:
        return self.states[self.tasks[i].key]

    def best_latency(self, i: int) -> float:
        """Best known latency of task i in seconds: tuned or default, whichever is lower."""
        t = self.tasks[i]
        d = self.states[t.key].default_s
        return min(self.db.best_latency(t.key), d if d is not None else math.inf)

    def estimated_latency(self) -> float:
        """The objective: sum over tasks of weight x best latency (seconds).

        A task with no latency at all (its default schedule failed, or is not measured yet, and it has no
        record) is left out, never counted as infinite: :meth:`excluded_tasks` names those.
        """
        return sum(t.weight * b for t in self.tasks if math.isfinite(b := self.best_latency(t.index)))

    def excluded_tasks(self) -> list[str]:
        """Names of the tasks :meth:`estimated_latency` leaves out (no finite latency known)."""
        return [t.name for t in self.tasks if not math.isfinite(self.best_latency(t.index))]

    def untuned_estimated_latency(self) -> float:
        """Sum over tasks of weight x default latency, leaving out tasks whose default failed."""
        return sum(
            t.weight * d
            for t in self.tasks
            if (d := self.states[t.key].default_s) is not None and math.isfinite(d)
        )

    # -- default (untuned) latencies -------------------------------------------------------------
    def measure_defaults(self) -> dict[int, float]:
        """Measure each task's default schedule once; later calls (and processes) reuse the values."""
        from tvm.s_tir import Schedule
        from tvm.s_tir.meta_schedule.arg_info import ArgInfo
        from tvm.s_tir.meta_schedule.search_strategy import MeasureCandidate

        todo = [t for t in self.tasks if self.states[t.key].default_s is None]
        if todo:
            cands = [
                MeasureCandidate(
                    Schedule(default_schedule(t.mod, self.target)), ArgInfo.from_prim_func(t.mod["main"])
                )
                for t in todo
            ]
            results, _, _ = self._build_and_run(cands, tasks=todo)
            for t, res in zip(todo, results):
                secs = mean_secs(res.run_secs) if res.run_secs is not None else math.inf
                st = self.states[t.key]
                st.default_s = secs
                if not math.isfinite(secs):
                    st.note = "default schedule failed: " + short_error(res.error_msg)
            self.save_state()
        return {t.index: self.states[t.key].default_s for t in self.tasks}

    # -- tuning ----------------------------------------------------------------------------------
    def _context(self, i: int):
        if i in self._contexts:
            return self._contexts[i]
        from tvm.s_tir import meta_schedule as ms

        from dynatune.search.intrinsics import import_tensor_intrinsics
        from dynatune.search.schedule_rules import quiet_missing_rules
        from dynatune.search.space import search_space

        import_tensor_intrinsics()  # before TuneContext imports it, slowly
        t = self.tasks[i]
        quiet_missing_rules(t.mod, self.target)  # e.g. a max pool's: no "Unknown schedule rule" on stderr
        s = self.search
        generator, self._deferred[i] = search_space(
            t.mod, self.target, s.unroll_steps, s.defer_layout_rewrite
        )
        strategy = ms.search_strategy.EvolutionarySearch(
            population_size=s.population_size,
            init_measured_ratio=s.init_measured_ratio,
            init_min_unmeasured=s.init_min_unmeasured,
            genetic_num_iters=s.genetic_num_iters,
            genetic_mutate_prob=s.genetic_mutate_prob,
            eps_greedy=s.eps_greedy,
        )
        ctx = ms.TuneContext(
            mod=t.mod,
            target=self.target,
            space_generator=generator,
            search_strategy=strategy,
            task_name=t.name,
            rand_state=self._task_seed(i),
            num_threads=max(1, self.builder.max_workers),
        )
        self.db.workload(t.key, t.mod)
        spaces = self._spaces[i] = ctx.generate_design_space()
        ctx.pre_tuning(
            max_trials=s.max_trials_per_task,
            num_trials_per_iter=s.trials_per_iter,
            design_spaces=spaces,
            database=self.db.memory,
            cost_model=self.cost_model,
        )
        if t.key in self._relearn:
            self._relearn_records(ctx, i)
        self._contexts[i] = ctx
        if s.analytic_first and self.state(i).trials == 0:
            self._queue_analytic(i, spaces)
        return ctx

    def _queue_analytic(self, i: int, spaces) -> None:
        """Put the task's analytic candidates (:mod:`dynatune.search.analytic`) at the head of its first
        batch, before any other head (the library's transfer)."""
        from dynatune.machine.target import planned_cores
        from dynatune.machine.vector import vector_unit
        from dynatune.search.analytic import analytic_candidates

        unit = vector_unit(self.target)
        if unit is None:
            return
        task, cores = self.tasks[i], planned_cores(self.target)
        then = self.first_candidates.get(i)

        def head(ctx, size: int) -> list:
            postprocs = ctx.space_generator.postprocs
            found = analytic_candidates(task.mod, spaces, postprocs, unit, cores, limit=ANALYTIC_HEAD)
            self.analytic_counts[task.key] = len(found)
            return found + (list(then(ctx, size)) if then is not None else [])

        self.first_candidates[i] = head

    def _task_seed(self, i: int) -> int:
        return (self.search.seed * 7919 + i) % (2**31 - 1)

    def _first_batch(self, i: int, ctx, size: int) -> list:
        """Task ``i``'s first batch: its head (:attr:`first_candidates`), then random samples of its design
        space (:mod:`dynatune.search.sampled`); the evolutionary search's picks instead with
        ``search.sampled_first_batch`` off, or when no sample fits."""
        head = list(self.first_candidates.pop(i)(ctx, size))[:size]
        rest = []
        if self.search.sampled_first_batch:
            postprocs = ctx.space_generator.postprocs
            rest = sampled_candidates(
                self.tasks[i].mod, self._spaces[i], postprocs, size - len(head), self._task_seed(i), head
            )
        if not rest and len(head) < size:
            rest = list(ctx.generate_measure_candidates() or [])
        return head + rest[: size - len(head)]

    def _next_batch(self, i: int, ctx, batch: int | None) -> list:
        """Task ``i``'s next batch from the evolutionary search (``batch``: at most that many)."""
        s = self.search
        if not s.carry_population:
            cands = list(ctx.generate_measure_candidates() or [])
            return cands[:batch] if batch is not None else cands
        if i not in self._populations:
            t = self.tasks[i]
            self._populations[i] = CarriedPopulation(
                ctx,
                self.db.memory,
                self.db.workload(t.key, t.mod),
                measured_ratio=s.init_measured_ratio,
                fresh=max(1, s.init_min_unmeasured),
                max_trials=s.max_trials_per_task - self.state(i).trials,
            )
        return self._populations[i].candidates(batch or s.trials_per_iter)

    def warm_up(self) -> None:
        """Pay the one-off costs now: worker pools, TVM's tensor-intrinsic registry, and SciPy's t
        distribution (the first batch's stopping statistics would import it inside the budget: 0.4 s)."""
        from dynatune.search.intrinsics import import_tensor_intrinsics

        import_tensor_intrinsics()  # TuneContext would import it on first use, slowly
        t95(2)
        self.builder.warm_up()
        self.runner.warm_up()

    def tune(
        self, i: int, *, seconds: float | None = None, trials: int | None = None, batch: int | None = None
    ) -> RoundResult:
        """Tune task ``i`` for a slot of ``seconds`` (or at least ``trials`` trials, in whole batches).

        A slot always measures at least one batch, and stops before a batch that would overrun it by
        more than half a batch. ``batch`` measures at most that many of each batch's candidates (the
        search's best-ranked first): a short first batch for the coverage pass.
        """
        if seconds is None and trials is None:
            raise ValueError("give seconds or trials")
        t = self.tasks[i]
        st = self.states[t.key]
        res = RoundResult(task=i, task_name=t.name, best_before_s=self.best_latency(i))
        start = time.perf_counter()
        if st.exhausted:
            res.exhausted = True
            res.note = st.note
            res.best_after_s = res.best_before_s
            return res
        t0 = time.perf_counter()
        ctx = self._context(i)  # once per task and process: design space + search state
        res.search_s += time.perf_counter() - t0
        batch_s = 0.0
        slot_start = time.perf_counter()  # the slot is for tuning; the one-off set-up above is not in it
        while True:
            elapsed = time.perf_counter() - slot_start
            if trials is not None and res.trials >= trials:
                break
            if (
                seconds is not None
                and trials is None
                and res.trials > 0
                and (elapsed >= seconds or elapsed + 0.5 * batch_s > seconds)
            ):
                break
            b0 = time.perf_counter()
            t0 = time.perf_counter()
            if i in self.first_candidates:
                cands = self._first_batch(i, ctx, batch or self.search.trials_per_iter)
            else:
                cands = self._next_batch(i, ctx, batch)
            res.search_s += time.perf_counter() - t0
            if not cands:
                res.note, res.exhausted = self.retirement.search_exhausted(st), True
                break
            t0 = time.perf_counter()
            built = finish_candidates(cands, self._deferred.get(i, ()), self.builder.max_workers)
            res.search_s += time.perf_counter() - t0
            incumbent = self.best_latency(i)
            results, build_s, measure_s = self._build_and_run(
                built, incumbent_s=incumbent, tasks=[t] * len(cands)
            )
            res.build_s += build_s
            res.measure_s += measure_s
            t0 = time.perf_counter()
            ctx.notify_runner_results(cands, results)
            measured = Batch(t, st, ctx, cands, results, incumbent, res, built=built)
            for callback in self.batch_callbacks:
                callback.apply(self, measured)
            res.search_s += time.perf_counter() - t0
            batch_s = time.perf_counter() - b0
            if res.exhausted:
                break
        res.wall_s = time.perf_counter() - start
        res.best_after_s = self.best_latency(i)
        st.seconds += res.wall_s
        st.trials += res.trials
        st.errors += res.build_errors + res.run_errors
        st.history.append([round(st.seconds, 4), st.trials, _finite_or_none(res.best_after_s)])
        self.save_state()
        return res

    def _build_and_run(
        self,
        cands,
        incumbent_s: float | None = None,
        tasks: list[Task] | None = None,
        cold: ColdProtocol | None = None,
    ):
        """Build (in parallel) and measure candidates; one RunnerResult per candidate, in order. A ``None``
        candidate (one the layout rewrite rejected) fails as a build.

        ``tasks`` (the task of each candidate) lets the runner fill index arguments with valid indices.
        ``cold``: each candidate is timed cold instead (:class:`dynatune.search.measure.ColdProtocol`).
        """
        from tvm.s_tir.meta_schedule.builder import BuilderInput, BuilderResult
        from tvm.s_tir.meta_schedule.runner import RunnerInput, RunnerResult

        from dynatune.search.builder import remove_artifacts

        t0 = time.perf_counter()
        ready = [k for k, c in enumerate(cands) if c is not None]
        built = [BuilderResult(None, REJECTED)] * len(cands)
        for k, b in zip(
            ready, self.builder.build([BuilderInput(cands[k].sch.mod, self.target) for k in ready])
        ):
            built[k] = b
        build_s = time.perf_counter() - t0
        t0 = time.perf_counter()
        dev = target_device(self.target)
        idx = [k for k, b in enumerate(built) if b.error_msg is None]
        self.runner.set_incumbent(incumbent_s)
        if cold:
            self.runner.time_cold(cold.repeats)
        self.runner.set_index_bounds(
            bounds_by_args(
                (c.args_info, self.index_bounds(t)) for c, t in zip(cands, tasks or []) if c is not None
            )
        )
        inputs = {k: RunnerInput(built[k].artifact_path, dev, cands[k].args_info) for k in idx}
        results = [RunnerResult(None, b.error_msg) for b in built]
        passes: dict[int, list] = {k: [] for k in idx}
        for p in range(cold.passes if cold else 1):  # cold: the order reversed every other pass
            order = idx if p % 2 == 0 else idx[::-1]
            for k, fut in zip(order, self.runner.run([inputs[k] for k in order])):
                passes[k].append(fut.result())
        for k in idx:
            results[k] = merged_results(passes[k])
        remove_artifacts(b.artifact_path for b in built)
        measure_s = time.perf_counter() - t0
        return results, build_s, measure_s

    def time_candidates(self, cands, tasks: list[Task], cold: ColdProtocol | None = None) -> list:
        """Build and time ``cands`` (one task each, ``tasks``) in one batch as tuning does, none raced out
        (or cold: :meth:`_build_and_run`): their RunnerResults, in order. They are not recorded."""
        return self._build_and_run(cands, tasks=tasks, cold=cold)[0]

    def measure_best(self, indices) -> dict[int, float]:
        """Each task's best schedule (as the compile applies it) measured again, all in one batch: ``{task
        index: mean seconds}`` (inf: it failed to build or run), for the tasks of ``indices`` that have one.
        Not recorded: a record from elsewhere (the schedule library, a warm start) confirmed here."""
        from dynatune.search.reapply import measure_candidate

        cands, tasks = [], []
        for i in indices:
            t = self.tasks[i]
            self.db.workload(t.key, t.mod)
            sch = self.db.memory.query_schedule(t.mod, self.target, "main")
            if sch is not None:
                cands.append(measure_candidate(sch))
                tasks.append(t)
        results = self.time_candidates(cands, tasks) if cands else []
        return {
            t.index: mean_secs(r.run_secs) if r.error_msg is None and r.run_secs else math.inf
            for t, r in zip(tasks, results)
        }

    def index_bounds(self, task: Task) -> dict[int, int]:
        """``{param position: high}`` of the task's index arguments
        (:func:`dynatune.search.index_args.index_bounds`)."""
        if task.key not in self._index_bounds:
            self._index_bounds[task.key] = index_bounds(task.mod["main"])
        return self._index_bounds[task.key]

    def compile_database(self):
        """A database holding, per task, its best record if (and only if) it beats the default schedule."""
        from tvm.s_tir import meta_schedule as ms

        out = ms.database.MemoryDatabase(module_equality="structural")
        for t in self.tasks:
            d = self.states[t.key].default_s
            if self.db.best_latency(t.key) < (d if d is not None else math.inf):
                wl = self.db.workload(t.key, t.mod)
                top = self.db.memory.get_top_k(wl, 1)
                if top:
                    out.commit_workload(t.mod)
                    out.commit_tuning_record(top[0])
        return out

    def close_workers(self) -> None:
        """Stop the builder and runner worker pools (idle pools must not share the cores with a final
        timing); the records and the state stay usable."""
        self.builder.close()
        self.runner.close()

    def close(self) -> None:
        self.measurement_log.close()
        for ctx in self._contexts.values():
            try:
                ctx.post_tuning()
            except Exception:
                pass
        self._contexts.clear()
        self.save_state()
        self.builder.close()
        self.runner.close()
        self.db.close()


def default_schedule(mod, target):
    """The untuned schedule: the PrimFunc as lowered (CPU), or the DLight rules the compiler uses (GPU)."""
    if target.kind.name in ("cuda", "rocm", "vulkan", "metal", "opencl"):
        with target:
            return gpu_default_schedule()(mod)
    return mod


def _finite_or_none(x: float):
    return x if math.isfinite(x) else None
