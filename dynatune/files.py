"""File utilities shared by the work directory's writers: atomic JSON, and clean-up after a kill."""

from __future__ import annotations

import json
import os


def cache_root(*parts: str) -> str:
    """dynatune's cache on this machine (the schedule library, roofline figures): ``$DYNATUNE_CACHE_DIR``,
    else ``~/.cache/dynatune``; ``parts`` name a path below it."""
    root = os.environ.get("DYNATUNE_CACHE_DIR") or os.path.join(os.path.expanduser("~"), ".cache", "dynatune")
    return os.path.join(root, *parts)


def atomic_write_json(path: str, obj) -> None:
    """Write JSON so that a kill leaves either the old or the new file, never half of one."""
    tmp = f"{path}.tmp{os.getpid()}"
    with open(tmp, "w") as f:
        json.dump(obj, f, default=lambda x: x.item() if hasattr(x, "item") else str(x))
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def remove_leftovers(work_dir: str) -> None:
    """Delete what a killed process left half-done: ``NAME.tmp<pid>`` files of :func:`atomic_write_json`
    and ``tmp-build-<pid>`` candidate directories, of processes that are no longer running."""
    import re
    import shutil

    for d in (work_dir, os.path.join(work_dir, "report")):
        try:
            names = os.listdir(d)
        except OSError:
            continue
        for name in names:
            m = re.fullmatch(r".+\.tmp(\d+)|tmp-build-(\d+)", name)
            if not m or _pid_alive(int(m.group(1) or m.group(2))):
                continue
            path = os.path.join(d, name)
            if os.path.isdir(path):
                shutil.rmtree(path, ignore_errors=True)
            else:
                try:
                    os.remove(path)
                except OSError:
                    pass


def _pid_alive(pid: int) -> bool:
    if pid == os.getpid():
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:  # exists, not ours
        return True
    return True
