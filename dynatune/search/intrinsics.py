"""TVM's tensor-intrinsic registry (``tvm.s_tir.tensor_intrin``), imported once per process, and fast.

MetaSchedule's ``TuneContext`` imports the registry on first use, so every tuning process pays for it
before its first round. Its ~250 intrinsics are TVMScript functions, and for each one TVMScript's parser
calls ``inspect.stack()``. That builds every frame's source context, and for each frame whose file is no
module's (the import machinery's ``<frozen importlib._bootstrap>`` frames) :func:`inspect.getmodule`
scans all of ``sys.modules``: the cost is frames x modules x intrinsics. It took ~13-20 s at the top of a
bare process and ~85 s inside a Prefect flow run (a deeper stack, and ~1,500 more modules).

The parser reads only each frame and its current line. So while the registry is imported,
``inspect.stack`` and ``inspect.getouterframes`` are replaced by versions that read just that line from
``linecache`` (same fields, same order); they are put back right after.

dynatune tunes for CPUs, and the GPU intrinsics (CUDA's alone are ~6.7 of the ~8 s left) are never looked
up for a CPU target. They are left out: while the registry is imported, its GPU submodules are empty
placeholders, taken away right after, so a later ``import tvm.s_tir.tensor_intrin.cuda`` (a GPU rule)
imports the real one.
"""

from __future__ import annotations

import inspect
import linecache
import sys
import threading
import types

MODULE = "tvm.s_tir.tensor_intrin"
GPU_SUBMODULES = ("cuda", "rocm", "hexagon", "metal")  # intrinsics no x86/ARM/RISC-V CPU target uses
_lock = threading.Lock()


def import_tensor_intrinsics() -> None:
    """Import ``tvm.s_tir.tensor_intrin`` if it is not imported yet (thread-safe, idempotent)."""
    if MODULE in sys.modules:
        return
    with _lock:
        if MODULE in sys.modules:
            return
        saved = inspect.stack, inspect.getouterframes
        inspect.stack, inspect.getouterframes = light_stack, light_outer_frames
        names = [f"{MODULE}.{name}" for name in GPU_SUBMODULES]
        placeholders = {key: types.ModuleType(key) for key in names if key not in sys.modules}
        sys.modules.update(placeholders)
        try:
            import tvm.s_tir.tensor_intrin  # noqa: F401
        finally:
            inspect.stack, inspect.getouterframes = saved
            for key, placeholder in placeholders.items():
                if sys.modules.get(key) is placeholder:
                    del sys.modules[key]
                name = key.rsplit(".", 1)[1]
                if getattr(sys.modules.get(MODULE), name, None) is placeholder:
                    delattr(sys.modules[MODULE], name)


def light_outer_frames(frame, context: int = 1) -> list:
    """:func:`inspect.getouterframes` without the per-frame module lookup: the current line only."""
    infos = []
    while frame is not None:
        code, lineno = frame.f_code, frame.f_lineno
        line = linecache.getline(code.co_filename, lineno, frame.f_globals) if context > 0 else ""
        lines = [line] if line else None
        infos.append(
            inspect.FrameInfo(frame, code.co_filename, lineno, code.co_name, lines, 0 if lines else None)
        )
        frame = frame.f_back
    return infos


def light_stack(context: int = 1) -> list:
    """:func:`inspect.stack` (the caller's frame first) built by :func:`light_outer_frames`."""
    return light_outer_frames(sys._getframe(1), context)
