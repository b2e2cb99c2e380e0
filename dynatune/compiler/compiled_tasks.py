"""What the profile (:mod:`dynatune.compiler.profile`) reads of a session when the compiled model is not
built from the session's own choice: its tasks (another lowering's, :mod:`.winograd_choice`) or its
records (:mod:`.cold_choice`)."""

from __future__ import annotations


class CompiledTasks:
    """The compiled model's tasks, the compile's database and their estimate (seconds)."""

    def __init__(self, target, tasks, database, estimate_s: float):
        self.target, self.tasks, self._database, self._estimate_s = target, tasks, database, estimate_s

    def compile_database(self):
        return self._database

    def estimated_latency(self) -> float:
        return self._estimate_s
