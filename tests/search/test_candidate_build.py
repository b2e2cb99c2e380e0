"""A candidate's build: compiled without its entry function's argument checks, linked by the linker alone,
its kernel the same as with the checks (real TVM, real linker)."""

import re
import shutil
import subprocess

import numpy as np
import pytest

from dynatune.search import linker
from dynatune.search.builder import candidate_pass_context, compile_scheduled, without_layout_rewrite


def _matmul(transcendental: bool = False):
    """A scheduled 64x64 matmul (outer loop parallel, inner vectorized: a compute function and a parallel
    lambda), optionally with an ``exp`` epilogue (a call into the C math library)."""
    import tvm
    from tvm import te
    from tvm.s_tir import Schedule

    a, b = te.placeholder((64, 64), name="A"), te.placeholder((64, 64), name="B")
    k = te.reduce_axis((0, 64), name="k")
    c = te.compute((64, 64), lambda i, j: te.sum(a[i, k] * b[k, j], axis=k), name="C")
    if transcendental:
        c = te.compute((64, 64), lambda i, j: te.exp(c[i, j]), name="E")
    sch = Schedule(tvm.IRModule({"main": te.create_prim_func([a, b, c])}))
    i, j, _ = sch.get_loops(sch.get_sblock("C"))
    sch.parallel(i)
    if not transcendental:
        sch.reorder(i, _, j)
        sch.vectorize(j)
    return sch.mod


def _functions(ll: str) -> dict[str, str]:
    """The LLVM IR's function bodies by name, without debug records, metadata and attribute-group numbers."""
    out = {}
    for m in re.finditer(r"^define [^@]*@([\w.]+)\(.*?^}", ll, re.S | re.M):
        body = re.sub(r"^\s*#dbg_\w+\(.*$\n?", "", m.group(0), flags=re.M)
        out[m.group(1)] = re.sub(r", !dbg !\d+|!\d+|#\d+", "", body)
    return out


def _run(lib, name, inputs):
    import tvm

    arrays = [tvm.runtime.tensor(x) for x in inputs] + [tvm.runtime.tensor(np.zeros((64, 64), "float32"))]
    lib[name](*arrays)
    return arrays[-1].numpy()


def test_a_candidate_has_no_argument_checks_and_the_same_kernels_as_the_checked_build(cpu_target):
    import tvm

    mod = _matmul()
    checked = tvm.build(without_layout_rewrite(mod), target=cpu_target).inspect_source("ll")
    candidate = compile_scheduled(mod, cpu_target).inspect_source("ll")
    assert "TVMFFIErrorSetRaisedFromCStrParts" in checked
    assert "TVMFFIErrorSetRaisedFromCStrParts" not in candidate
    assert len(candidate) < 0.7 * len(checked)
    old, new = _functions(checked), _functions(candidate)
    kernels = [n for n in old if not n.startswith(("__tvm_ffi_", "__tvm_set_raised"))]
    assert any(n.endswith("_compute_") for n in kernels) and any("lambda" in n for n in kernels), kernels
    for name in kernels:
        assert new[name] == old[name], name


def test_the_candidate_context_keeps_the_callers_settings():
    import tvm

    with tvm.transform.PassContext(opt_level=1, config={"tirx.disable_vectorize": True}):
        with candidate_pass_context() as ctx:
            assert ctx.opt_level == 1
            assert bool(ctx.config["tirx.disable_vectorize"]) and bool(ctx.config["tirx.disable_assert"])
    assert "tirx.disable_assert" not in tvm.transform.PassContext.current().config


@pytest.mark.skipif(linker._linker() is None, reason="no ld and gcc on this machine")
def test_the_linker_alone_links_a_library_that_names_the_math_library_and_computes(cpu_target, tmp_path):
    import tvm

    rng = np.random.default_rng(0)
    inputs = [rng.uniform(-0.1, 0.1, (64, 64)).astype("float32") for _ in range(2)]
    rt = compile_scheduled(_matmul(transcendental=True), cpu_target)
    path = str(tmp_path / "candidate.so")
    rt.export_library(path, fcompile=linker.link_shared)
    if shutil.which("readelf"):
        dynamic = subprocess.run(["readelf", "-d", path], capture_output=True, text=True).stdout
        assert "libm.so" in dynamic and "Shared library" in dynamic
    got = _run(tvm.runtime.load_module(path), "main", inputs)
    np.testing.assert_allclose(got, np.exp(inputs[0] @ inputs[1]), rtol=1e-5)


def test_a_library_the_linker_fails_to_link_is_linked_as_tvm_links_it(cpu_target, tmp_path, monkeypatch):
    import tvm

    monkeypatch.setattr(linker, "_linker", lambda: ("/bin/false", "unused"))
    rt = compile_scheduled(_matmul(), cpu_target)
    path = str(tmp_path / "candidate.so")
    rt.export_library(path, fcompile=linker.link_shared)
    inputs = [np.eye(64, dtype="float32"), np.arange(64 * 64, dtype="float32").reshape(64, 64)]
    np.testing.assert_array_equal(_run(tvm.runtime.load_module(path), "main", inputs), inputs[1])
