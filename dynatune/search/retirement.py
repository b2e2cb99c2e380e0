"""When a task stops being tuned: one policy, asked by the session (after each batch) and by the tuner
(which tasks the scheduler may choose).

A task is retired when
- its search space is exhausted (a batch came back empty);
- the last ``failed_batches`` batches' worth of candidates in a row failed to build or run (across slots
  and processes: the streak is part of the task's saved state);
- or nothing about it can be measured: no latency at all, neither its default schedule nor a tuned one.
A task's note says why; it is kept in ``session.json``, so a resumed run keeps the task retired.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

SEARCH_EXHAUSTED = "search space exhausted"  # the note of a task whose design space has nothing new left


@dataclass
class RetirementPolicy:
    failed_batches: int = 3

    def search_exhausted(self, state) -> str:
        return self._retire(state, SEARCH_EXHAUSTED)

    def after_batch(self, state, trials_per_iter: int, last_error: str) -> str | None:
        """The note if the failure streak retires the task now, else None."""
        if state.fail_streak >= self.failed_batches * trials_per_iter:
            return self._retire(
                state,
                f"retired: the last {state.fail_streak} candidates failed to build or run ({last_error})",
            )
        return None

    def is_retired(self, state, best_s: float) -> bool:
        return state.exhausted or not math.isfinite(best_s)

    @staticmethod
    def _retire(state, note: str) -> str:
        state.exhausted = True
        state.note = note
        return note
