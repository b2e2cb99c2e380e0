"""TVM's tensor-intrinsic registry is imported with a light ``inspect.stack`` that gives TVMScript's
parser what the real one gives it, and the real one is put back; its GPU intrinsics are left out until
something imports them."""

import inspect
import subprocess
import sys

from helpers import ROOT

from dynatune.search.intrinsics import light_outer_frames, light_stack


def _fields(infos):
    return [(i.frame, i.filename, i.lineno, i.function, i.code_context) for i in infos]


def test_light_stack_has_the_frames_and_lines_of_inspect_stack():
    def inner():
        return inspect.stack(), light_stack()

    real, light = inner()
    assert len(real) == len(light)
    # the caller's frame first; the line of each call site (light_stack is called on the same line)
    assert _fields(real) == _fields(light)
    assert light[0].function == "inner" and "light_stack()" in light[0].code_context[0]
    frame = inspect.currentframe()
    assert _fields(inspect.getouterframes(frame)) == _fields(light_outer_frames(frame))
    assert all(i.code_context is None for i in light_stack(context=0))


def test_registry_imports_and_inspect_is_restored():
    code = (
        "import inspect, sys\n"
        "real = inspect.stack, inspect.getouterframes\n"
        "from dynatune.search.intrinsics import import_tensor_intrinsics\n"
        "import_tensor_intrinsics(); import_tensor_intrinsics()\n"
        "from tvm.s_tir._tensor_intrin import TensorIntrin\n"
        "from tvm.s_tir.tensor_intrin import x86\n"
        "assert TensorIntrin.get(x86.VNNI_DOT_16x4_INTRIN) is not None\n"
        "assert (inspect.stack, inspect.getouterframes) == real\n"
        "assert 'tvm.s_tir.tensor_intrin.cuda' not in sys.modules  # the GPU intrinsics are left out ...\n"
        "from tvm.s_tir.tensor_intrin.hexagon import VRMPY_u8u8i32_INTRIN as vrmpy\n"
        "assert TensorIntrin.get(vrmpy) is not None  # ... until imported (CUDA's took 7 s)\n"
        "print('ok')\n"
    )
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0 and out.stdout.strip() == "ok", out.stderr[-2000:]
