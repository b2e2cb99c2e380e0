"""Clean up after a run that dies without cleaning up (``kill -9``, the OOM killer).

A killed process cannot stop its helpers, and some of them outlive it: Prefect's ephemeral API server
(a uvicorn subprocess that only an ``atexit`` hook stops) runs on forever, and a busy TVM builder or
runner worker finishes its job (or its hang) first. The reaper is a tiny separate process (Python and
psutil only) that watches the run through a pipe: once a second it notes the run's descendants, and when
the pipe reports end-of-file (the run has exited, whatever the way) it terminates those still alive.
A clean exit has stopped them already, so then it has nothing to do.
"""

from __future__ import annotations

import os
import select
import subprocess
import sys

_write_end: int | None = None  # kept open for the life of the run; the kernel closes it when we die


def start_reaper() -> None:
    """Watch this process; once per process (later calls do nothing)."""
    global _write_end
    if _write_end is not None:
        return
    r, w = os.pipe()  # both ends close-on-exec: children other than the reaper never hold the write end
    try:
        subprocess.Popen(
            [sys.executable, os.path.abspath(__file__), str(os.getpid()), str(r)],
            pass_fds=(r,),
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,
        )  # not in the run's process group: Ctrl-C does not reach it
    except OSError:
        os.close(w)
        return
    finally:
        os.close(r)
    _write_end = w


def _watch(ppid: int, fd: int, period_s: float = 1.0) -> None:
    import psutil

    try:
        parent = psutil.Process(ppid)
    except psutil.NoSuchProcess:
        return
    known: dict[int, psutil.Process] = {}
    while True:
        ready, _, _ = select.select([fd], [], [], period_s)
        if ready and not os.read(fd, 64):
            break  # the run has exited
        try:
            kids = parent.children(recursive=True)
        except psutil.NoSuchProcess:
            break
        known = {p.pid: p for p in known.values() if p.is_running()}  # is_running also catches pid reuse
        known.update((p.pid, p) for p in kids)
    left = [p for p in known.values() if p.is_running() and p.pid != os.getpid()]
    for p in left:
        try:
            p.terminate()
        except psutil.Error:
            pass
    _, alive = psutil.wait_procs(left, timeout=3)
    for p in alive:
        try:
            p.kill()
        except psutil.Error:
            pass


if __name__ == "__main__":
    _watch(int(sys.argv[1]), int(sys.argv[2]))
