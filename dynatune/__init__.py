"""dynatune: tune a deep-learning model for the machine it runs on, in as little time as possible."""

__version__ = "0.1.0"

from dynatune.errors import DynatuneError  # noqa: E402
from dynatune.machine.target import use_every_core  # noqa: E402

use_every_core()  # before TVM's thread pool starts: TVM alone would use half the cores of an x86 machine

__all__ = ["DynatuneError", "__version__"]
