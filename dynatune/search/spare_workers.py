"""Spare worker processes: what a closed tuning session leaves for the next one this process opens.

Each session starts its builder's worker pool and its runner's worker, and each of those processes pays for
importing TVM (about 3 s of CPU). A process that opens many sessions one after another (the test suite: 170
workers started in one run) can call :func:`enable`: a session's ``close`` then keeps its pool and worker
instead of stopping them, and the next session with the same settings, in the same worker environment
(``TVM_*``, ``OMP_*``, ``PYTHONPATH``), takes them over. One spare per kind is kept; the rest are stopped, and
so are the spares when the process exits. Off by default: a tuning run opens one session.
"""

import atexit
import os
import threading

_lock = threading.Lock()
_spares: dict = {}  # (kind, environment) -> (worker, stop)
_enabled = False


def enable() -> None:
    """Keep closed sessions' workers for the next session of this process (not for its subprocesses)."""
    global _enabled
    _enabled = True


def environment() -> tuple:
    """What a worker process takes from this process's environment when it starts and what changes it: a
    session records it as it makes its workers, and hands it to :func:`keep`."""
    return tuple(
        sorted((k, v) for k, v in os.environ.items() if k.startswith(("TVM_", "OMP_")) or k == "PYTHONPATH")
    )


def take(kind):
    """The spare worker (or pool) of ``kind`` (hashable: what it is and its settings) started in this
    environment, or None."""
    if not _enabled:
        return None
    with _lock:
        spare = _spares.pop((kind, environment()), None)
    return spare[0] if spare else None


def keep(kind, worker, stop, started_in: tuple) -> bool:
    """Keep ``worker`` for the next session that takes ``kind`` in the environment it was ``started_in``
    (:func:`environment` then); ``stop(worker)`` ends it at exit. False (the caller stops it) when spares are
    off or one of its kind is kept already."""
    if not _enabled:
        return False
    key = (kind, started_in)
    with _lock:
        if key in _spares:
            return False
        _spares[key] = (worker, stop)
    return True


@atexit.register
def stop_spares() -> None:
    """Stop every kept worker (at exit)."""
    with _lock:
        spares = list(_spares.values())
        _spares.clear()
    for worker, stop in spares:
        try:
            stop(worker)
        except Exception:  # noqa: BLE001 - at exit: a worker that is gone already
            pass
