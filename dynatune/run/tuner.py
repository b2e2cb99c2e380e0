"""The tuning run: rounds of (choose task -> tune one slot -> update beliefs) until the budget is spent.

Everything a run needs to continue after a crash lives in the work directory and is written atomically:

- ``db/``: every measured record (see :mod:`dynatune.search.database`), ``session.json``, ``cost_model``;
- ``rounds.jsonl``: one fsync'ed line per finished round (the round's result, its belief row and the
  scheduler's state after it);
- ``run.json``: round counter, tuning seconds spent, scheduler state, tracking run id.

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
"""

from __future__ import annotations

import math
import time
from dataclasses import asdict, dataclass, field

from dynatune.files import WorkDir, atomic_write_json
from dynatune.run.workdir_state import check_same_run, read_rounds, read_run_state
from dynatune.schedulers import Belief, RoundContext, TaskView, make_scheduler
from dynatune.search.database import JsonlWriter
from dynatune.search.session import RoundResult, TuningSession

__all__ = ["RoundRecord", "Tuner", "check_same_run", "task_bounds"]


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
    ):
        """``roofline``: this machine's (:mod:`dynatune.machine.roofline`), for each task's latency bound
        (None: unknown). ``anchors``: ONNX Runtime's time for a task's operator (s), where it is known."""
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
        if self.rounds and "scheduler_state" in self.rounds[-1]:
            # the state written with the last round: run.json may be one round behind after a kill
            self.run_state["scheduler_state"] = self.rounds[-1]["scheduler_state"]
        if self.run_state.get("scheduler_state"):
            self.scheduler.load_state_dict(self.run_state["scheduler_state"])
        self._writer = JsonlWriter(self.rounds_path)
        self.bounds = task_bounds(self.tasks, roofline)
        self.anchors = anchors or {}

    # -- state -----------------------------------------------------------------------------------
    def _load_run_state(self) -> dict:
        state = read_run_state(self.run_path)
        # rounds.jsonl is the source of truth for progress: a kill between its fsync and run.json's
        # rewrite must not make the round run twice. The next round follows the last one recorded (after
        # `dynatune repair` dropped a damaged line, fewer than that): a round number, the MLflow step, is
        # never used twice.
        state["rounds_done"] = self.rounds[-1]["round"] + 1 if self.rounds else 0
        state["elapsed_s"] = self.rounds[-1]["elapsed_s"] if self.rounds else 0.0
        return state

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
        self.save_run_state()
        return self.session.estimated_latency()

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
        return self.remaining_s() <= 0.05 * self.slot_s or self._all_retired

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
        """Names of the tasks that never got a batch (a budget too small to cover them all)."""
        return [t.name for t in self.tasks if not self.session.state(t.index).history]

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
        )
        self._writer.append(rec.line())
        self.rounds.append(rec.line())
        self.save_run_state()
        return rec

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


def task_bounds(tasks, roofline) -> dict[int, float]:
    """Each task's roofline bound (s) on this machine: its FLOPs and compulsory bytes (0: no roofline)."""
    from dynatune.machine.roofline import compulsory_bytes

    if roofline is None:
        return {t.index: 0.0 for t in tasks}
    return {t.index: roofline.bound_s(t.flops, compulsory_bytes(t.mod)) for t in tasks}
