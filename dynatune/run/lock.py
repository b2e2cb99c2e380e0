"""One run per work directory: an exclusive ``flock`` on ``<work_dir>/.lock``.

The lock file names its holder (pid, host, command with its credentials masked, start time) so a second run
can say who holds it.
The kernel drops the lock when the holder dies, even by ``kill -9``: no stale locks to clean up.
"""

from __future__ import annotations

import datetime
import fcntl
import json
import os
import socket
import sys
import time

from dynatune.errors import DynatuneError
from dynatune.files import WorkDir
from dynatune.secrets import mask_text


class WorkDirLock:
    def __init__(self, work_dir: str):
        self.path = WorkDir(work_dir).lock
        self.fd = None

    def acquire(self, wait_s: float = 0.0) -> "WorkDirLock":
        """Take the lock, trying for up to ``wait_s`` seconds; raises, naming the holder, if it is taken."""
        try:
            os.makedirs(os.path.dirname(self.path), exist_ok=True)
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        except OSError as exc:
            raise DynatuneError(
                f"work directory {os.path.dirname(self.path)} is not writable ({exc.strerror})",
                "choose another --work-dir",
            ) from None
        deadline = time.monotonic() + wait_s
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() < deadline:  # e.g. another run's pre-flight check holds it for a moment
                    time.sleep(0.05)
                    continue
                holder = _read_holder(fd)
                os.close(fd)
                raise self._in_use(holder) from None
        info = {
            "pid": os.getpid(),
            "host": socket.gethostname(),
            "cmd": mask_text(" ".join(sys.argv))[:200],  # the file outlives the run: no credentials in it
            "since": datetime.datetime.now().isoformat(timespec="seconds"),
        }
        data = json.dumps(info).encode()
        os.pwrite(fd, data, 0)  # overwrite, then cut: a reader never sees an empty file
        os.ftruncate(fd, len(data))
        os.fsync(fd)
        self.fd = fd
        return self

    def check_free(self) -> None:
        """Raise, naming the holder, if a run holds the lock. Takes nothing and writes nothing: a shared lock
        for an instant, so two checks never collide (and a run taking the lock waits them out)."""
        try:
            fd = os.open(self.path, os.O_RDONLY)
        except OSError:
            return  # no lock file: nobody holds it
        try:
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except BlockingIOError:
            raise self._in_use(_read_holder(fd)) from None
        finally:
            os.close(fd)

    def _in_use(self, holder: str) -> DynatuneError:
        return DynatuneError(
            f"work directory {os.path.dirname(self.path)} is in use by {holder}",
            "wait for that run to finish, or use another --work-dir",
        )

    def release(self) -> None:
        if self.fd is not None:
            fcntl.flock(self.fd, fcntl.LOCK_UN)
            os.close(self.fd)
            self.fd = None

    def __enter__(self):
        return self.acquire()

    def __exit__(self, *exc):
        self.release()


def _read_holder(fd) -> str:
    for _ in range(10):  # the holder may be writing its name right now
        try:
            info = json.loads(os.pread(fd, 4096, 0) or b"{}")
        except (OSError, ValueError):
            info = {}
        if info.get("pid"):
            since = f"since {info.get('since')} ({info.get('cmd')})"
            # masked again: a lock written by an older dynatune holds its command line in clear
            return mask_text(f"pid {info.get('pid')} on {info.get('host')} {since}")
        time.sleep(0.02)
    return "another run"
