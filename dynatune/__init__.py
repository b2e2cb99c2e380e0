"""dynatune: tune a deep-learning model for the machine it runs on, in as little time as possible."""

__version__ = "0.1.0"

from dynatune.errors import DynatuneError  # noqa: E402

__all__ = ["DynatuneError", "__version__"]
