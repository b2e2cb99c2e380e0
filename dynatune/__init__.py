"""dynatune: tune a deep-learning model for the machine it runs on, in as little time as possible."""

__version__ = "0.1.0"

import importlib.util  # noqa: E402
import os  # noqa: E402
import sys  # noqa: E402


class _SourceTreeFinder:
    """``dynatune.flows`` and ``dynatune.tasks`` from a checkout's ``flows/`` and ``tasks/``, beside this
    package's folder.

    An install puts them there (pyproject.toml's package-dir); a process that imports dynatune from a
    checkout (``PYTHONPATH=<checkout>``: the measurement workers, a benchmark of another worktree) finds
    them beside it, so the flows and tasks are always the same checkout's as the library."""

    def __init__(self, root: str):
        self.dirs = {f"dynatune.{name}": os.path.join(root, name) for name in ("flows", "tasks")}

    def find_spec(self, name, path=None, target=None):
        where = self.dirs.get(name)
        if where is None:
            return None
        init = os.path.join(where, "__init__.py")
        return importlib.util.spec_from_file_location(name, init, submodule_search_locations=[where])


def _find_flows_and_tasks_beside() -> None:
    """In a checkout (not in an install: there ``dynatune/flows`` is a folder of this package), and only
    beside this checkout's own flows and tasks."""
    here = os.path.dirname(os.path.abspath(__file__))
    root = os.path.dirname(here)
    checkout = os.path.isfile(os.path.join(root, "flows", "tune_model.py")) and os.path.isfile(
        os.path.join(root, "tasks", "tracking.py")
    )
    installed = os.path.isdir(os.path.join(here, "flows"))
    if checkout and not installed and not any(isinstance(f, _SourceTreeFinder) for f in sys.meta_path):
        sys.meta_path.insert(0, _SourceTreeFinder(root))


_find_flows_and_tasks_beside()

from dynatune.errors import DynatuneError  # noqa: E402
from dynatune.machine.target import set_tvm_thread_pool  # noqa: E402

set_tvm_thread_pool()  # before TVM's pool starts: every core, and a spin that leaves ONNX Runtime alone

__all__ = ["DynatuneError", "__version__"]
