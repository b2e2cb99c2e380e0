"""A tuning session without TVM whose tasks converge in two slots: what the tuner's and the stopping rule's
tests run on."""

import math
from types import SimpleNamespace as NS

from dynatune.search.session import RoundResult
from dynatune.search.session_state import TaskState

SLOT = 2.0


class ConvergingSession:
    """A session without TVM whose every task converges in two slots to 97 % of its roofline bound: each slot
    (or first batch) takes its ``seconds`` and brings the task to the next point of its curve."""

    def __init__(self, work_dir, defaults=(8e-3, 2e-3, 1e-3), bounds=(1e-3, 2.5e-4, 1.2e-4)):
        self.work_dir = str(work_dir)
        self.tasks = [
            NS(index=i, name=f"fused_conv2d{i}_add", key=f"key{i}", weight=1, flops=b * 1e12, mod=None)
            for i, b in enumerate(bounds)
        ]
        self.bounds = list(bounds)
        self.states = {t.key: TaskState(default_s=d) for t, d in zip(self.tasks, defaults)}
        self.search = NS(trials_per_iter=8)
        self.retirement = NS(is_retired=lambda st, best: st.exhausted)
        self.db = NS(best_latency=lambda key: math.inf)  # nothing seeded: nothing to confirm
        self.tuned = []

    def warm_up(self):
        pass

    def measure_defaults(self):
        return {t.index: self.state(t.index).default_s for t in self.tasks}

    def measure_best(self, indices):
        return {}

    def state(self, i):
        return self.states[self.tasks[i].key]

    def best_latency(self, i):
        st = self.state(i)
        return min([st.default_s] + [h[2] for h in st.history])

    def estimated_latency(self):
        return sum(t.weight * self.best_latency(t.index) for t in self.tasks)

    def tune(self, i, *, seconds=None, trials=None, batch=None):
        st, before = self.state(i), self.best_latency(i)
        roof = self.bounds[i] / 0.97
        best = max(roof, before / 4)
        wall = seconds if seconds is not None else 1.0
        st.seconds += wall
        st.trials += 8
        st.history.append([st.seconds, st.trials, best])
        self.tuned.append(i)
        return RoundResult(
            i, self.tasks[i].name, trials=8, best_before_s=before, best_after_s=best, wall_s=wall
        )

    def close(self):
        pass
