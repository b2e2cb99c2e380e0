"""A candidate's library linked by the linker alone, not through the C++ compiler's driver.

TVM's ``export_library`` links with ``g++ -shared``: 33-35 ms a library here, most of it the driver
finding and reading the C++ start-up files and libraries that a candidate does not use. A candidate's
object needs only ``memset`` and the C math library (an epilogue's ``expf``, say), and the TVM symbols the
runtime hands it when it loads the library. ``ld -shared OBJ -lm libgcc.a`` links the same object in 7-9
ms (BENCHMARKS.md, session 33): the library names ``libm.so.6`` (and through it the C library) as
what it needs, and GCC's helper archive gives whatever routine the code generator left to it.

Where there is no ``ld`` or no ``gcc`` (another platform), or the linker fails, the library is linked as
TVM links it.
"""

from __future__ import annotations

import functools
import shutil
import subprocess
import sys


@functools.lru_cache(maxsize=1)
def _linker() -> tuple[str, str] | None:
    """``(ld, libgcc.a)`` on Linux where both are found, else None."""
    ld, gcc = shutil.which("ld"), shutil.which("gcc")
    if not sys.platform.startswith("linux") or not ld or not gcc:
        return None
    try:
        libgcc = subprocess.run(
            [gcc, "-print-libgcc-file-name"], capture_output=True, text=True, check=True
        ).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return None
    return (ld, libgcc) if libgcc else None


def link_shared(output: str, objects: list[str], **kwargs) -> None:
    """``export_library``'s ``fcompile``: ``objects`` linked into the shared library ``output``."""
    found = _linker()
    if found is not None and not kwargs:
        ld, libgcc = found
        done = subprocess.run([ld, "-shared", "-o", output, *objects, "-lm", libgcc], capture_output=True)
        if done.returncode == 0:
            return
    from tvm.support import cc

    cc.create_shared(output, objects, **kwargs)
