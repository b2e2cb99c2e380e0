"""The tuning run: rounds of (choose task -> tune one slot -> update beliefs) until the budget is spent.

Everything a run needs to continue after a crash lives in the work directory and is written atomically:

- ``db/``: every measured record (see :mod:`dynatune.search.database`), ``session.json``, ``cost_model``;
- ``rounds.jsonl``: one fsync'ed line per finished round (the round's result, its belief row and the
  scheduler's state after it);
- ``run.json``: round counter, tuning seconds spent, scheduler state, tracking run id, and the round in flight
  (``in_flight``: its task's progress before it). A round counts once its line is in ``rounds.jsonl``: one
  killed before that is rolled back when the run resumes (its task's history point, seconds and trials are
  dropped, its tuning records kept) and runs again; one that fails in-process is undone the same way.

A re-run of the same config continues from the next round: finished rounds are not repeated, and the
budget counts tuning time across all processes of the run.

Coverage pass: before slots compete, every task that was never tuned gets ONE short first batch
(``warmup_trials`` candidates, at most ``trials_per_iter``), heaviest untuned weighted latency first, for
at most ``warmup_share`` of the budget. A task's first batch brings it 10-60x below its naive default, so
a short run must not leave tasks there. These rounds are recorded like any other (``phase: "warmup"``); the
scheduler is not asked and its state does not change, and it decides every round after the pass.

When the pass's share runs out before every task got its batch, a task the scheduler then picks that was
never tuned gets that same first batch, not a whole slot: a whole slot on a tiny task (a pooling, a
concatenation) costs as much as one on the heaviest convolution, and its first batch already brings
most of what it can. The scheduler decides again, with that batch's result. With the pass off
(``warmup_share`` 0) the scheduler alone decides, in whole slots.

Stopping: the budget is a cap. With a stopping rule (:mod:`dynatune.run.stopping`) every round ends with a
check, stored with the round (``stop_check``); when the rule says stop, the check (with the budget, the task
set and the rule's settings it was made for) is kept as ``run.json``'s ``stop`` and the run is done. A resumed
run honours it only for the same of all three: with a larger budget, other tasks or settings, or stopping off,
the stop moves to ``earlier_stops`` and tuning goes on (the rule counts afresh, so it looks again after at
least one round).

Confirmation: a new work dir whose tasks start from records measured elsewhere (the schedule library, a warm
start) measures each such task's best schedule again, in one batch, before the first round (``run.json``'s
``confirmed``: recorded and measured seconds per task).
"""

from __future__ import annotations

import hashlib
import logging
import math
import statistics
import time
from dataclasses import asdict, dataclass, field

from dynatune.files import WorkDir, atomic_write_json
from dynatune.run.callbacks import TuningEnded
from dynatune.run.workdir_state import check_same_run, read_rounds, read_run_state
from dynatune.schedulers import Belief, RoundContext, TaskView, make_scheduler
from dynatune.search.database import JsonlWriter
from dynatune.search.session import RoundResult, TuningSession

log = logging.getLogger(__name__)

__all__ = ["RoundRecord", "Tuner", "check_same_run", "task_bounds", "task_set"]


@dataclass
class RoundRecord:
    round: int
    task: int
    task_name: str
    result: dict
    belief: dict  # the chosen task's belief row
    estimated_latency_s: float
    elapsed_s: float  # tuning seconds of the whole run after this round
    decision_s: float
    wall_s: float
    beliefs: list = field(default_factory=list)  # the full table (not stored in rounds.jsonl)
    scheduler_state: dict = field(default_factory=dict)  # after this round (stored with it: one atomic line)
    phase: str = "scheduler"  # "warmup": the coverage pass chose the task, not the scheduler
    residual_s: float | None = None  # what the estimate misses, as last measured (None: not yet measured)
    stop_check: dict | None = None  # the stopping rule's check after this round (None: stopping off)

    @property
    def estimated_model_latency_s(self) -> float | None:
        """The estimate counting the last measured residual (:mod:`dynatune.compiler.residual`)."""
        return None if self.residual_s is None else self.estimated_latency_s + self.residual_s

    def line(self) -> dict:
        d = asdict(self)
        d.pop("beliefs")
        return d


class Tuner:
    def __init__(
        self,
        session: TuningSession,
        scheduler_name: str,
        *,
        budget_s: float,
        slot_s: float,
        seed: int = 0,
        scheduler_params: dict | None = None,
        warmup_share: float = 0.0,
        warmup_trials: int = 8,
        roofline=None,
        anchors: dict[int, float] | None = None,
        stopping=None,
        warm_sources: list[str] | None = None,
    ):
        """``roofline``: this machine's (:mod:`dynatune.machine.roofline`), for each task's latency bound
        (None: unknown). ``anchors``: ONNX Runtime's time for a task's operator (s), where it is known.
        ``stopping``: a :class:`~dynatune.run.stopping.StoppingRule` (None: the run spends its budget).
        ``warm_sources``: the work dirs this run was warm-started from (:meth:`carry_stop`)."""
        self.session = session
        self.tasks = session.tasks
        self.budget_s = budget_s
        self.slot_s = slot_s
        self.warmup_share = warmup_share
        self.warmup_trials = warmup_trials
        self.scheduler = make_scheduler(scheduler_name, seed=seed, **(scheduler_params or {}))
        self.scheduler_name = scheduler_name
        wd = WorkDir(session.work_dir)
        self.run_path = wd.run_state
        self.rounds_path = wd.rounds
        self.rounds: list[dict] = read_rounds(self.rounds_path)
        self.run_state = self._load_run_state()
        flight = self.run_state.pop("in_flight", None)
        if flight and flight["round"] >= self.rounds_done:
            self._roll_back_task(flight)  # killed mid-round: the round runs again, from the same state
        if self.rounds and "scheduler_state" in self.rounds[-1]:
            # the state written with the last round: run.json may be one round behind after a kill
            self.run_state["scheduler_state"] = self.rounds[-1]["scheduler_state"]
        if self.run_state.get("scheduler_state"):
            self.scheduler.load_state_dict(self.run_state["scheduler_state"])
        self._writer = JsonlWriter(self.rounds_path)
        self.bounds = task_bounds(self.tasks, roofline)
        self.anchors = anchors or {}
        self.task_set = task_set(self.tasks)
        self.stopping = stopping
        self.warm_sources = list(warm_sources or [])
        if stopping is not None:
            stopping.attach(self.scheduler)
            stopping.load_state_dict((self.rounds[-1].get("stop_check") or {}) if self.rounds else {})
        self._look_at_recorded_stop()

    # -- state -----------------------------------------------------------------------------------
    def _load_run_state(self) -> dict:
        state = read_run_state(self.run_path)
        # rounds.jsonl is the source of truth for progress: a kill between its fsync and run.json's
        # rewrite must not make the round run twice. The next round follows the last one recorded (after
        # `dynatune repair` dropped a damaged line, fewer than that): a round number, the MLflow step, is
        # never used twice.
        state.update(self._recorded_progress())
        return state

    def _recorded_progress(self) -> dict:
        """The round counter and tuning seconds as ``rounds.jsonl`` records them: after its last round."""
        if not self.rounds:
            return {"rounds_done": 0, "elapsed_s": 0.0}
        return {"rounds_done": self.rounds[-1]["round"] + 1, "elapsed_s": self.rounds[-1]["elapsed_s"]}

    def _look_at_recorded_stop(self) -> None:
        """Honour a recorded stop for the same budget and tasks; otherwise move it to ``earlier_stops``, say
        why (``run_state["reopened_stop"]``), and let the rule count afresh."""
        state = self.run_state
        state.pop("reopened_stop", None)  # this process's own, if any
        earlier = state.setdefault("earlier_stops", [])
        stop = state.get("stop")
        last = self.rounds[-1].get("stop_check") if self.rounds else None
        if (
            stop is None
            and last
            and last.get("stop")
            and all(e.get("round") != last.get("round") for e in earlier)
        ):
            stop = last  # stopped, and killed before run.json was written
        state["stop"] = None
        if stop is None:
            return
        if self.stopping is None:
            why = "stopping is off"
        elif self.budget_s > stop.get("budget_s", math.inf) + 1e-9:
            why = f"the budget rose from {stop['budget_s']:.0f} s to {self.budget_s:.0f} s"
        elif stop.get("tasks") != self.task_set:
            why = "the model's tasks changed"
        elif stop.get("settings") != self.stopping.settings():
            why = "the stopping settings changed"
        else:
            state["stop"] = stop
            return
        earlier.append({**stop, "reopened": why})
        state["reopened_stop"] = {
            "elapsed_s": stop.get("elapsed_s"),
            "reason": stop.get("reason"),
            "why": why,
        }
        if self.stopping is not None:
            self.stopping.reset()

    @property
    def stopped(self) -> bool:
        """The stopping rule ended tuning (now, or in an earlier process for this budget and these tasks)."""
        return self.run_state.get("stop") is not None

    def last_check(self, whole_slot: bool = False) -> dict | None:
        """The stopping rule's last check (None: it never looked); ``whole_slot``: the last one with at least
        a slot of the budget left (at the very end the rest is nothing, and so is what it could buy). A run
        that carried a stop looked first before its first round (:meth:`carry_stop`)."""
        checks = [r["stop_check"] for r in reversed(self.rounds) if r.get("stop_check")]
        checks += [self.run_state["carried_check"]] if self.run_state.get("carried_check") else []
        if whole_slot:
            checks = [c for c in checks if c.get("slots_left", 0) >= 1] or checks
        return next(iter(checks), None)

    def ending(self) -> TuningEnded:
        """Whether tuning ended before the budget, and why: one sentence for the console, the summary, the
        report and MLflow."""
        stop, at = (
            self.run_state.get("stop"),
            f"stopped at {self.elapsed_s:.0f} s of the {self.budget_s:.0f} s budget",
        )
        if stop is not None:
            reason = f"{at}: {stop['reason']}"
        elif self._all_retired and self.remaining_s() > 0.05 * self.slot_s:
            reason = (
                f"{at}: every task is retired (exhausted, at a bound it cannot pass, or too small to matter)"
            )
        else:
            spent, last = f"tuned for the whole budget ({self.budget_s:.0f} s)", self.last_check(True)
            if self.stopping is None:
                reason = f"{spent}: stopping is off"
            else:
                reason = f"{spent}; at the last check with a slot left, {last['reason']}" if last else spent
            return TuningEnded(False, reason, self.elapsed_s, self.budget_s, 0.0, self.rounds_done - 1)
        saved = max(self.budget_s - self.elapsed_s, 0.0)
        return TuningEnded(True, reason, self.elapsed_s, self.budget_s, saved, self.rounds_done - 1)

    def save_run_state(self, **extra) -> None:
        self.run_state.update(extra)
        self.run_state["scheduler_state"] = self.scheduler.state_dict()
        self.run_state["scheduler"] = self.scheduler_name
        atomic_write_json(self.run_path, self.run_state)

    @property
    def rounds_done(self) -> int:
        return self.run_state["rounds_done"]

    @property
    def elapsed_s(self) -> float:
        return self.run_state["elapsed_s"]

    # -- the loop --------------------------------------------------------------------------------
    def prepare(self) -> float:
        """Round 0: measure every task's default latency (once per work dir). Returns the estimate (s)."""
        self.session.warm_up()
        self.session.measure_defaults()
        self.confirm_seeded()
        self.carry_stop()
        self.save_run_state()
        return self.session.estimated_latency()

    def confirm_seeded(self) -> dict:
        """Once per work dir, before its first round: every task that starts from a record measured elsewhere
        (the library, a warm start) has that best schedule measured again here (``run_state["confirmed"]``:
        task name -> [recorded s, measured s])."""
        if "confirmed" in self.run_state or self.rounds_done:
            return self.run_state.get("confirmed") or {}
        session = self.session
        seeded = [t.index for t in self.tasks if math.isfinite(session.db.best_latency(t.key))]
        recorded = {i: session.db.best_latency(self.tasks[i].key) for i in seeded}
        try:
            measured = session.measure_best(seeded) if seeded else {}
        except Exception as exc:  # noqa: BLE001 - a check of records, not tuning: the run goes on without it
            log.warning(
                "the best schedules of %d seeded tasks could not be measured again: %s", len(seeded), exc
            )
            measured = {}
        self.run_state["confirmed"] = {self.tasks[i].name: [recorded[i], s] for i, s in measured.items()}
        return self.run_state["confirmed"]

    def carry_stop(self) -> dict | None:
        """Once per work dir, after :meth:`confirm_seeded`: a fresh run warm-started from a run whose stopping
        rule stopped it (``run.json``'s ``stop``: not reopened by a later resume) carries that stop's count of
        checks (:meth:`~dynatune.run.stopping.StoppingRule.carry`) when it has the same tasks and stopping
        settings and every best schedule it started from was measured again here (a task never tuned there
        has none: its evidence is its untuned latency, measured here too). The rule then looks once, before
        the first round (``run_state["carried_check"]``), at the tasks as the confirmation left them and over
        the rest of the budget the source had left when it stopped: below the share, the run stops there,
        without a slot; above it, the count starts again (``run_state["carried_stop"]``: the source, its
        count, the slots it weighed and its reason; None when nothing was carried)."""
        if self.stopping is None or self.rounds or "carried_check" in self.run_state:
            return self.run_state.get("carried_stop")
        if "carried_stop" not in self.run_state:
            self.run_state["carried_stop"] = self._stop_to_carry()
        carried = self.run_state["carried_stop"]
        if carried:
            self.stopping.carry(carried["streak"], carried.get("slots"))
            self.run_state["carried_check"] = self._check_stop(-1)
        return carried

    def _stop_to_carry(self) -> dict | None:
        confirmed = self.confirmation()
        if confirmed is None or confirmed["failed"]:
            return None  # nothing measured again here, or a best that no longer runs: not confirmed
        for src in reversed(self.warm_sources):  # the newest source last (a retune adds its previous run)
            stop = read_run_state(WorkDir(src).run_state).get("stop") or {}
            same = stop.get("tasks") == self.task_set and stop.get("settings") == self.stopping.settings()
            if same:
                return {
                    "source": src,
                    "streak": stop.get("streak", 0),
                    "slots": stop.get("slots_weighed", stop.get("slots_left")),
                    "reason": stop.get("reason", ""),
                }
        return None

    def confirmation(self) -> dict | None:
        """What :meth:`confirm_seeded` found, for the summary: how many tasks, and their measured / recorded
        best (median, and the worst one); None when no task started from elsewhere."""
        confirmed = self.run_state.get("confirmed") or {}
        if not confirmed:
            return None
        ratios = {name: m / r for name, (r, m) in confirmed.items() if r > 0 and math.isfinite(m)}
        worst = max(ratios, key=ratios.get) if ratios else None
        return {
            "tasks": len(confirmed),
            "failed": sorted(set(confirmed) - set(ratios)),  # its best did not build or run here
            "median_ratio": statistics.median(ratios.values()) if ratios else None,
            "worst_ratio": ratios.get(worst),
            "worst_task": worst,
        }

    def context(self) -> RoundContext:
        views = []
        for t in self.tasks:
            st = self.session.state(t.index)
            best = self.session.best_latency(t.index)
            # a task whose default schedule failed starts, for the scheduler, at its first working schedule
            default = st.default_s if st.default_s is not None and math.isfinite(st.default_s) else best
            hist = [(h[0], h[1], h[2] if h[2] is not None else default) for h in st.history]
            views.append(
                TaskView(
                    t.index,
                    t.name,
                    t.key,
                    t.weight,
                    t.flops,
                    default if math.isfinite(default) else 0.0,
                    hist,
                    self.session.retirement.is_retired(st, best),
                    self.bounds[t.index],
                    self.anchors.get(t.index, 0.0),
                )
            )
        return RoundContext(views, self.rounds_done, self.slot_s, self.elapsed_s, self.budget_s)

    def remaining_s(self) -> float:
        return max(0.0, self.budget_s - self.elapsed_s)

    def done(self) -> bool:
        return self.remaining_s() <= 0.05 * self.slot_s or self._all_retired or self.stopped

    _all_retired = False

    def warmup_choice(self) -> int | None:
        """The coverage pass's next task (a never-tuned one, heaviest first), or None when the pass is over:
        every task covered, or ``warmup_share`` of the budget spent."""
        if self.warmup_share <= 0 or self.elapsed_s >= self.warmup_share * self.budget_s:
            return None
        todo = [
            t
            for t in self.tasks
            if not self.session.state(t.index).history and not self.session.state(t.index).exhausted
        ]
        if not todo:
            return None

        def weighted_default(t):
            d = self.session.state(t.index).default_s
            return t.weight * d if d is not None and math.isfinite(d) else -1.0  # failed defaults last

        return max(todo, key=lambda t: (weighted_default(t), t.weight * t.flops, -t.index)).index

    def _first_batch_only(self, task: int) -> bool:
        """The scheduler picked a task the coverage pass did not reach: it gets its first batch, not a
        slot."""
        return self.warmup_share > 0 and not self.session.state(task).history

    def residual_s(self) -> float | None:
        """What the estimate misses, from the last periodic measurement (:mod:`dynatune.compiler.periodic`)
        that measured it; None before the first."""
        from dynatune.compiler.periodic import latest_residual_ms

        ms = latest_residual_ms(self.run_state.get("measurements", []))
        return None if ms is None else ms / 1e3

    def never_tuned(self) -> list[str]:
        """Names of the tasks that run their untuned schedules: no batch before tuning ended (a budget too
        small to cover them all, or a stop with the tasks still waiting all together under its share) and no
        schedule from an earlier run (the schedule library's, a warm start's)."""
        return [
            t.name
            for t in self.tasks
            if not self.session.state(t.index).history and math.isinf(self.session.db.best_latency(t.key))
        ]

    def step(self) -> RoundRecord | None:
        """One round: the coverage pass's next task, else the scheduler's choice. None when every task
        is retired."""
        start = time.perf_counter()
        round_no = self.rounds_done
        ctx = self.context()
        t0 = time.perf_counter()
        choice, phase = self.warmup_choice(), "warmup"
        if choice is None:
            phase = "scheduler"
            choice = self.scheduler.choose(ctx)
        table = self.scheduler.beliefs(ctx)
        decision_s = time.perf_counter() - t0
        if choice is None:
            self._all_retired = True
            return None
        flight = self._begin_round(round_no, choice)
        try:
            return self._tune_and_record(ctx, table, round_no, choice, phase, start, decision_s)
        except BaseException:
            self._undo_round(flight)
            raise

    def _begin_round(self, round_no: int, choice: int) -> dict:
        """Keep, in ``run.json``, what round ``round_no`` is about to change: the chosen task's progress and
        the scheduler's and stopping rule's state. A round counts once its line is in ``rounds.jsonl``."""
        st = self.session.state(choice)
        flight = {
            "round": round_no,
            "task": self.tasks[choice].key,
            "history_len": len(st.history),
            "seconds": st.seconds,
            "trials": st.trials,
            "errors": st.errors,
        }
        self.save_run_state(in_flight=flight)
        return {
            **flight,
            "scheduler_state": self.scheduler.state_dict(),
            "stopping_state": self.stopping.state_dict() if self.stopping is not None else {},
        }

    def _undo_round(self, flight: dict) -> None:
        """A round that failed before it was recorded leaves no trace but its tuning records: the task's
        progress, the round counter, the tuning time and the scheduler's and rule's state as before it."""
        self.run_state.pop("in_flight", None)
        if self.rounds and self.rounds[-1]["round"] == flight["round"]:
            return  # recorded: only run.json's rewrite failed, and the next one catches up
        self.run_state.update(self._recorded_progress(), stop=None)
        self.scheduler.load_state_dict(flight["scheduler_state"])
        if self.stopping is not None:
            self.stopping.load_state_dict(flight["stopping_state"])
        self._roll_back_task(flight)
        self.save_run_state()

    def _roll_back_task(self, flight: dict) -> None:
        """The task's state as it was before a round that was not recorded (a kill between ``session.json``'s
        write and the round's line would otherwise leave the belief model a history point of no round)."""
        st = self.session.states.get(flight["task"])
        if st is None or len(st.history) <= flight["history_len"]:
            return
        del st.history[flight["history_len"] :]
        st.seconds, st.trials, st.errors = flight["seconds"], flight["trials"], flight["errors"]
        self.session.save_state()

    def _tune_and_record(self, ctx, table, round_no, choice, phase, start, decision_s) -> RoundRecord:
        if phase == "warmup" or self._first_batch_only(choice):
            n = min(self.warmup_trials, self.session.search.trials_per_iter)
            res: RoundResult = self.session.tune(choice, trials=n, batch=n)
        else:
            res = self.session.tune(choice, seconds=min(self.slot_s, self.remaining_s()))
        if phase == "scheduler":
            self.scheduler.after_round(ctx, choice)
        row = next((b for b in table if b.task == choice), None)
        self.run_state["elapsed_s"] = self.elapsed_s + res.wall_s
        self.run_state["rounds_done"] = self.rounds_done + 1
        check = self._check_stop(round_no)
        rec = RoundRecord(
            round=round_no,
            task=choice,
            task_name=self.tasks[choice].name,
            result=res.as_dict(),
            belief=asdict(row) if row else {},
            estimated_latency_s=self.session.estimated_latency(),
            elapsed_s=self.elapsed_s,
            decision_s=decision_s,
            wall_s=time.perf_counter() - start,
            beliefs=[asdict(b) for b in table],
            scheduler_state=self.scheduler.state_dict(),
            phase=phase,
            residual_s=self.residual_s(),
            stop_check=check,
        )
        self._writer.append(rec.line())
        self.rounds.append(rec.line())
        self.run_state.pop("in_flight", None)
        self.save_run_state()
        return rec

    def _check_stop(self, round_no: int) -> dict | None:
        """The stopping rule's look after round ``round_no`` (the round's state already counted); a stop is
        kept with the budget and the tasks it was decided for."""
        if self.stopping is None:
            return None
        check = self.stopping.check(self.context()).as_dict()
        if check["stop"]:
            at = dict(round=round_no, elapsed_s=self.elapsed_s, budget_s=self.budget_s, tasks=self.task_set)
            check.update(at, settings=self.stopping.settings())
            self.run_state["stop"] = check
        return check

    def run_rounds(self, on_round=None) -> list[tuple[float, float]]:
        """Rounds until the budget is spent (or every task is retired), after :meth:`prepare`.

        Returns ``[(tuning seconds, estimated latency s)]`` after each round; ``on_round(record)`` is
        called for each. The Prefect flow drives :meth:`step` itself (one task run per round).
        """
        curve = []
        while not self.done():
            rec = self.step()
            if rec is None:
                break
            if on_round is not None:
                on_round(rec)
            curve.append((rec.elapsed_s, rec.estimated_latency_s))
        return curve

    def belief_table(self) -> list[Belief]:
        return self.scheduler.beliefs(self.context())

    def close(self) -> None:
        self._writer.close()
        self.save_run_state()
        self.session.close()


def task_set(tasks) -> str:
    """A short hash of the tasks' keys: a recorded stop holds for this set of tasks only."""
    return hashlib.sha256("\n".join(sorted(t.key for t in tasks)).encode()).hexdigest()[:16]


def task_bounds(tasks, roofline) -> dict[int, float]:
    """Each task's roofline bound (s) on this machine: its FLOPs and compulsory bytes (0: no roofline)."""
    from dynatune.machine.roofline import compulsory_bytes

    if roofline is None:
        return {t.index: 0.0 for t in tasks}
    return {t.index: roofline.bound_s(t.flops, compulsory_bytes(t.mod)) for t in tasks}
