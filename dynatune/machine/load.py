"""How busy the machine is besides one process: the load probe around every timing against ONNX Runtime.

On a shared machine, a timing against ONNX Runtime is only as good as the cores it had. ONNX Runtime's
thread pool suffers far more from a busy core than TVM's (on 2 cores, one Python busy loop made it 3.1x
slower and TVM 10 % slower: the ratio read 1.31x instead of 3.64x), so load flatters dynatune.

:class:`LoadProbe` measures, over a window, the CPU time spent on this process's cores (its affinity
mask, from ``/proc/stat`` through psutil) by anything but this process (all of its threads: the timing's
own pools are not load), and the time the hypervisor stole from those cores. Everything else counts:
other users' processes, and dynatune's own worker pools and servers, which must be idle during a timing.

:class:`QuietPolicy` says when that is too much (:meth:`QuietPolicy.busy`): when the other work needs more
than the cores the timing leaves free, by more than ``tolerance_cores``. :func:`quiet_or_wait` probes
before a timing and waits a bounded number of times for the machine to calm down; the caller times, looks
at the load during the timing, and retries or records the result as taken under load.
"""

from __future__ import annotations

import os
import time
from dataclasses import asdict, dataclass

BUSY_FIELDS = ("user", "nice", "system", "irq", "softirq")  # /proc/stat columns of a CPU doing work


@dataclass(frozen=True)
class Load:
    """The load over one window, in cores (CPU seconds per second) on this process's cores."""

    other_cores: float  # CPU spent by anything but this process
    steal_cores: float  # time the hypervisor gave to other guests
    cores: int  # the cores this process may run on
    seconds: float  # the window

    @property
    def busy_cores(self) -> float:
        """What the other work took from this process's cores."""
        return self.other_cores + self.steal_cores

    def as_dict(self) -> dict:
        return asdict(self) | {"busy_cores": self.busy_cores}

    @classmethod
    def from_dict(cls, d: dict | None) -> Load | None:
        """The inverse of :meth:`as_dict` (None stays None)."""
        return None if d is None else cls(d["other_cores"], d["steal_cores"], d["cores"], d["seconds"])

    def describe(self) -> str:
        return f"{self.busy_cores:.2f} of {self.cores} cores busy besides the timing" + (
            f" ({self.steal_cores:.2f} stolen by the hypervisor)" if self.steal_cores >= 0.01 else ""
        )


def _cores() -> list[int]:
    try:
        return sorted(os.sched_getaffinity(0))
    except AttributeError:  # pragma: no cover - non-Linux
        return list(range(os.cpu_count() or 1))


def _snapshot(cores: list[int]) -> tuple[float, float, float, float]:
    """(monotonic s, busy CPU s and steal s on ``cores``, this process's CPU s)."""
    import psutil

    per_cpu = psutil.cpu_times(percpu=True)
    mine = [per_cpu[c] for c in cores if c < len(per_cpu)]
    busy = sum(getattr(t, f, 0.0) for t in mine for f in BUSY_FIELDS)
    steal = sum(getattr(t, "steal", 0.0) for t in mine)
    own = psutil.Process().cpu_times()
    return time.monotonic(), busy, steal, own.user + own.system


class LoadProbe:
    """Started when made; :meth:`stop` returns the :class:`Load` since then."""

    def __init__(self):
        self.cores = _cores()
        self._start = _snapshot(self.cores)

    def stop(self) -> Load:
        t1, busy1, steal1, own1 = _snapshot(self.cores)
        t0, busy0, steal0, own0 = self._start
        wall = max(t1 - t0, 1e-6)
        return Load(
            other_cores=max(0.0, (busy1 - busy0) - (own1 - own0)) / wall,
            steal_cores=max(0.0, steal1 - steal0) / wall,
            cores=len(self.cores),
            seconds=wall,
        )


def probe(seconds: float) -> Load:
    """The load over the next ``seconds`` (this process sleeps meanwhile)."""
    p = LoadProbe()
    time.sleep(seconds)
    return p.stop()


@dataclass(frozen=True)
class QuietPolicy:
    """When a timing against ONNX Runtime counts as taken on a quiet machine, and how long to wait for one.

    The machine is busy for a timing on ``threads`` threads when the other work takes more than the cores
    the timing leaves free plus ``tolerance_cores`` (on 2 cores and 2 threads: more than a quarter of a
    core). A timing is tried at most ``attempts`` times, ``wait_s`` apart; before each, the load is probed
    for ``probe_s``.
    """

    tolerance_cores: float = 0.25
    probe_s: float = 1.0
    wait_s: float = 10.0
    attempts: int = 3
    # ONNX Runtime's fastest block this much slower than its reference (the same model alone, earlier on the
    # same machine) is a slow spell; 0: no such check (see :meth:`slow`)
    slow_onnxruntime: float = 1.15
    # the profile's model (in the tuning process) this much slower than the final timing's fastest block of
    # the same model (fresh processes, just before it) is a slow spell too; 0: no such check
    slow_profile: float = 1.15

    def busy(self, load: Load | None, threads: int) -> bool:
        if load is None:
            return False
        return load.busy_cores > max(0, load.cores - threads) + self.tolerance_cores

    def slow(self, onnxruntime_ms: float, reference_ms: float | None) -> bool:
        """ONNX Runtime's fastest block (``onnxruntime_ms``) was taken in a slow spell of a shared machine:
        over ``slow_onnxruntime`` times its ``reference_ms``. Now and then these guests run a process with
        both sides slow and ONNX Runtime more (on the Zen 5 guest for minutes, on the Zen 4 one process in
        two or three), and the load probe reads nothing (0.02-0.03 cores): squeezenet1_1's end-of-run
        timing read 0.826 with ONNX Runtime at 2.11 ms, against 0.914 at its usual 1.68 in the 20 processes
        after it; mnasnet0_5's 1.22-1.32 ms against 0.70-0.73 in seven processes of twelve. The ratio such
        a timing reports flatters dynatune."""
        return _over(onnxruntime_ms, reference_ms, self.slow_onnxruntime)

    def profile_slow(self, model_ms: float, fastest_ms: float | None) -> bool:
        """The profile's model time (``model_ms``) was taken in a slow spell: over ``slow_profile`` times the
        final timing's fastest block of the same model (``fastest_ms``). In the Zen 4 guest's slow spells the
        model slows more than its kernels alone, cold: profiles read 1.26x and 1.49x the final timing's
        fastest block, and 1.22x and 1.16x their estimate, where quiet ones read 0.99-1.04x and 0.88-1.06x."""
        return _over(model_ms, fastest_ms, self.slow_profile)


def _over(measured_ms: float, reference_ms: float | None, factor: float) -> bool:
    """``measured_ms`` over ``factor`` times ``reference_ms``; False when either of them is 0 or None."""
    if not (factor and reference_ms):
        return False
    return measured_ms > factor * reference_ms


def quiet_or_wait(threads: int, policy: QuietPolicy) -> Load:
    """Probe the machine; while it is busy, wait ``policy.wait_s`` and probe again, ``policy.attempts``
    probes at most. Returns the last probe's load (busy still, when the waits ran out)."""
    load = probe(policy.probe_s)
    for _ in range(policy.attempts - 1):
        if not policy.busy(load, threads):
            break
        time.sleep(policy.wait_s)
        load = probe(policy.probe_s)
    return load
