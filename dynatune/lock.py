"""One run per work directory: an exclusive ``flock`` on ``<work_dir>/.lock``.

The lock file names its holder (pid, host, command, start time) so a second run can say who holds it.
The kernel drops the lock when the holder dies, even by ``kill -9``: no stale locks to clean up.
"""

from __future__ import annotations

import datetime
import fcntl
import json
import os
import socket
import sys

from .errors import DynatuneError


class WorkDirLock:
    def __init__(self, work_dir: str):
        self.path = os.path.join(work_dir, ".lock")
        self.fd = None

    def acquire(self) -> "WorkDirLock":
        try:
            os.makedirs(os.path.dirname(self.path), exist_ok=True)
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        except OSError as exc:
            raise DynatuneError(f"work directory {os.path.dirname(self.path)} is not writable ({exc.strerror})",
                                "choose another --work-dir") from None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = _read_holder(fd)
            os.close(fd)
            raise DynatuneError(
                f"work directory {os.path.dirname(self.path)} is in use by {holder}",
                "wait for that run to finish, or use another --work-dir") from None
        info = {"pid": os.getpid(), "host": socket.gethostname(), "cmd": " ".join(sys.argv)[:200],
                "since": datetime.datetime.now().isoformat(timespec="seconds")}
        os.ftruncate(fd, 0)
        os.write(fd, json.dumps(info).encode())
        os.fsync(fd)
        self.fd = fd
        return self

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
    try:
        os.lseek(fd, 0, os.SEEK_SET)
        info = json.loads(os.read(fd, 4096) or b"{}")
        return f"pid {info.get('pid')} on {info.get('host')} since {info.get('since')} ({info.get('cmd')})"
    except (OSError, ValueError):
        return "another run"
