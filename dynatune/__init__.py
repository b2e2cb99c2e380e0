"""dynatune: tune a deep-learning model for the machine it runs on, in as little time as possible."""

__version__ = "0.1.0"

from dynatune.errors import DynatuneError  # noqa: E402
from dynatune.machine.target import set_tvm_thread_pool  # noqa: E402

set_tvm_thread_pool()  # before TVM's pool starts: every core, and a spin that leaves ONNX Runtime alone

__all__ = ["DynatuneError", "__version__"]
