"""A MetaSchedule builder whose worker pool lives as long as the session, and that builds in batches.

The stock ``LocalBuilder`` makes a new process pool for every ``build()`` call, and each fresh worker
imports ``tvm.s_tir.tensor_intrin`` (about 20 s here, the plain way) before its first build: ~3.4 s per
trial instead of ~1.5 s. This builder keeps its workers, skips that import (a scheduled module carries no
reference to the intrinsic registry), and links candidates into a shared library in the worker, so the
runner only has to ``dlopen`` it. A candidate is compiled without its entry function's argument checks
(:func:`candidate_pass_context`) and linked by the linker alone (:mod:`dynatune.search.linker`). Workers
are recycled after ``max_uses`` builds to bound TVM's known leak, and a worker that dies or hangs is
replaced by the pool on the next call.

Batches: a batch is cut into two shares per worker, and a worker compiles a share as ONE module,
candidate ``k`` its function ``dynatune_candidate_k``, with one lowering session, one LLVM module and one
link (a module's fixed cost, about 45 ms of a candidate's 240 ms of CPU, is paid once per share; two
shares per worker keep both busy to the end of the batch). A candidate's artifact is then
``<library>::<function>`` (:func:`split_artifact`). A share that fails or times out is built again one
candidate at a time, so a candidate that fails to build fails alone, with its own error.

Time limits (:class:`BuildTimeLimit`): a pathological candidate (LLVM's back end took 18 and 35 s on two
of them, where the task's other candidates built in 0.05-1.7 s) used to cost twice ``timeout_sec``: once
in its share, once alone. Once the builder has timed a few candidates, a job's limit follows what builds
take on this machine now: a multiple of the median candidate's build for the slowest candidate of the
job (with a floor) and twice the median for each other, never above ``timeout_sec``.
"""

from __future__ import annotations

import os
import shutil
import statistics
import tempfile
import time
from collections import deque

from tvm.ir.utils import derived_object
from tvm.s_tir.meta_schedule.builder import BuilderResult, PyBuilder
from tvm.support.popen_pool import PopenPoolExecutor, StatusKind

from dynatune.search import spare_workers
from dynatune.search.linker import link_shared

_FUNCTION_PREFIX = "dynatune_candidate_"
_SEPARATOR = "::"


class BuildTimeLimit:
    """How long a build job of ``n`` candidates may take before its candidates count as pathological.

    ``cap`` (``search.build_timeout_s``) until ``min_seen`` candidates have been built. Then, with ``m`` the
    median of the last ``window`` candidates' build seconds: one candidate may take ``factor`` x ``m``, at
    least ``floor``, and each other candidate of the job twice ``m``; never more than ``cap``. The legit
    builds of 956 candidates of the README job's model took at most 1.7 s (21x the median), the
    pathological ones 18-37 s (BENCHMARKS.md, session 19). Under load the median grows, and the limit with
    it.
    """

    def __init__(
        self, cap: float, factor: float = 10.0, floor: float = 4.0, min_seen: int = 8, window: int = 64
    ):
        self.cap, self.factor, self.floor, self.min_seen = cap, factor, floor, min_seen
        self.seconds: deque = deque(maxlen=window)  # per candidate, of the jobs that built

    def record(self, seconds: float, candidates: int) -> None:
        """A job of ``candidates`` built in ``seconds``."""
        self.seconds.extend([seconds / candidates] * candidates)

    def limit(self, candidates: int) -> float:
        if len(self.seconds) < self.min_seen:
            return self.cap
        median = statistics.median(self.seconds)
        return min(self.cap, max(self.floor, self.factor * median) + (candidates - 1) * 2 * median)


def without_layout_rewrite(mod):
    """A scheduled module with its weight layout-rewrite blocks removed: tuning times the kernel alone, on
    weights taken as already laid out."""
    from tvm.s_tir.transform import RemoveWeightLayoutRewriteBlock

    return RemoveWeightLayoutRewriteBlock(skip_tensor_rewrite=True)(mod)


def candidate_pass_context():
    """The pass context a candidate is compiled in: the current one, without the argument checks of the
    entry function (``tirx.disable_assert``). The runner calls a candidate with the arguments its
    ``args_info`` describes, so the checks never fail there; they were two thirds of a candidate's object
    code and a quarter of its build's CPU, and the kernels' machine code is the same without them
    (BENCHMARKS.md, session 33). The compiled model keeps them."""
    import tvm

    current = tvm.transform.PassContext.current()
    return tvm.transform.PassContext(
        opt_level=current.opt_level,
        required_pass=current.required_pass,
        disabled_pass=current.disabled_pass,
        instruments=current.instruments,
        config={**current.config, "tirx.disable_assert": True},
    )


def compile_scheduled(mod, target):
    """A scheduled task module compiled as tuning measures it (:func:`without_layout_rewrite`, in
    :func:`candidate_pass_context`)."""
    import tvm

    with candidate_pass_context():
        return tvm.build(without_layout_rewrite(mod), target=target)


def batch_module(mods):
    """Scheduled modules as ONE module, module ``k``'s ``main`` its function ``dynatune_candidate_k``; and
    the functions' names."""
    import tvm

    names = [f"{_FUNCTION_PREFIX}{k}" for k in range(len(mods))]
    funcs = {tvm.ir.GlobalVar(n): m["main"].with_attr("global_symbol", n) for n, m in zip(names, mods)}
    return tvm.IRModule(funcs), names


def _export(rt_mod, out_dir: str) -> str:
    path = os.path.join(tempfile.mkdtemp(dir=out_dir), "candidate.so")
    rt_mod.export_library(path, fcompile=link_shared)
    return path


def build_and_export(mod, target, out_dir: str) -> str:
    """Worker side: compile one scheduled module and link it into ``out_dir``."""
    return _export(compile_scheduled(mod, target), out_dir)


def build_batch(mods, target, out_dir: str) -> list[str]:
    """Worker side: compile scheduled modules as one library (:func:`batch_module`); one artifact per
    module (:func:`split_artifact`)."""
    mod, names = batch_module(mods)
    path = _export(compile_scheduled(mod, target), out_dir)
    return [f"{path}{_SEPARATOR}{n}" for n in names]


def timed(fn, *args):
    """Worker side: ``fn(*args)`` and the seconds it took."""
    t0 = time.perf_counter()
    out = fn(*args)
    return out, time.perf_counter() - t0


def split_artifact(artifact: str) -> tuple[str, str | None]:
    """``(library path, function name)`` of an artifact; the name is None for a library of one candidate
    (its entry function)."""
    path, sep, name = artifact.rpartition(_SEPARATOR)
    if sep and name.startswith(_FUNCTION_PREFIX) and name[len(_FUNCTION_PREFIX) :].isdigit():
        return path, name
    return artifact, None


@derived_object
class PersistentBuilder(PyBuilder):
    def __init__(
        self,
        max_workers: int,
        timeout_sec: float = 60.0,
        max_uses: int = 256,
        artifact_dir: str | None = None,
        build_fn=build_and_export,
        batch_fn=None,
        batched: bool = True,
        shares_per_worker: int = 2,
    ) -> None:
        """``build_fn(mod, target, out_dir) -> artifact path`` builds one candidate in a worker;
        ``batch_fn(mods, target, out_dir) -> artifact paths`` a worker's share of a batch (default:
        :func:`build_batch` when ``build_fn`` is the default, else none: tests pass failing ones).
        ``batched=False`` builds every candidate alone (what an RPC runner uploads). A share gets
        ``timeout_sec`` at most, as one candidate does (:class:`BuildTimeLimit`). ``shares_per_worker``: how
        finely a batch is cut (two: a worker with one share idled while the other finished a heavier one;
        BENCHMARKS.md, session 16)."""
        super().__init__()
        self.build_fn = build_fn
        if batch_fn is None and build_fn is build_and_export:
            batch_fn = build_batch
        self.batch_fn = batch_fn
        self.batched = batched
        self.shares_per_worker = shares_per_worker
        self.max_workers = max_workers
        self.max_uses = max_uses
        self.limits = BuildTimeLimit(timeout_sec)  # its cap is timeout_sec
        self.artifact_dir = artifact_dir or tempfile.mkdtemp(prefix="dynatune-build-")
        os.makedirs(self.artifact_dir, exist_ok=True)
        self._pool = None

    def _get_pool(self, timeout: float) -> PopenPoolExecutor:
        if self._pool is None:
            self._pool_environment = spare_workers.environment()
            self._pool = spare_workers.take(self._spare_kind()) or PopenPoolExecutor(
                max_workers=self.max_workers, timeout=timeout, maximum_process_uses=self.max_uses
            )
        self._pool._timeout = timeout  # the executor sends its `_timeout` along with each job it sends
        return self._pool

    def _map(self, fn, jobs: list, sizes: list[int]) -> tuple[list, float]:
        """``fn`` over ``jobs`` (of ``sizes`` candidates) in the workers, each timed and limited to what
        :attr:`limits` allows the largest; the MapResults (their values without the seconds), and the
        limit."""
        limit = self.limits.limit(max(sizes, default=1))
        outcomes = list(self._get_pool(limit).map_with_error_catching(lambda job: timed(fn, job), jobs))
        for k, (res, size) in enumerate(zip(outcomes, sizes)):
            if res.status == StatusKind.COMPLETE:
                value, seconds = res.value
                self.limits.record(seconds, size)
                outcomes[k] = res._replace(value=value)
        return outcomes, limit

    def build(self, build_inputs):
        inputs = [(bi.mod, bi.target) for bi in build_inputs]
        if not (self.batched and self.batch_fn is not None and len(inputs) > 1):
            return self._build_alone(inputs)
        shares = _shares(len(inputs), self.shares_per_worker * self.max_workers)
        fn, out_dir = self.batch_fn, self.artifact_dir  # the lambda goes to the workers: no `self` in it
        outcomes, _ = self._map(
            lambda share: fn([m for m, _ in share], share[0][1], out_dir),
            [[inputs[k] for k in share] for share in shares],
            [len(share) for share in shares],
        )
        results: list = [None] * len(inputs)
        retry = []
        for share, res in zip(shares, outcomes):
            if res.status == StatusKind.COMPLETE and len(res.value) == len(share):
                for k, path in zip(share, res.value):
                    results[k] = BuilderResult(path, None)
            else:  # find the candidate that failed: build the share's candidates alone
                retry.extend(share)
        for k, res in zip(retry, self._build_alone([inputs[k] for k in retry])):
            results[k] = res
        return results

    def _build_alone(self, inputs) -> list:
        fn, out_dir = self.build_fn, self.artifact_dir
        results = []
        outcomes, limit = self._map(lambda x: fn(x[0], x[1], out_dir), inputs, [1] * len(inputs))
        for res in outcomes:
            if res.status == StatusKind.COMPLETE:
                results.append(BuilderResult(res.value, None))
            elif res.status == StatusKind.TIMEOUT:
                results.append(BuilderResult(None, f"build timed out after {limit:.0f}s"))
            else:
                results.append(BuilderResult(None, f"build failed: {_short(res.value)}"))
        return results

    def warm_up(self) -> None:
        """Start the workers now (TVM import) so the first round does not pay for it."""
        pool = self._get_pool(self.limits.cap)
        futs = [pool.submit(_noop) for _ in range(self.max_workers)]
        for f in futs:
            f.result()

    def _spare_kind(self) -> tuple:
        return ("builder pool", self.max_workers, self.max_uses)

    def close(self) -> None:
        """Stop the workers (or keep them for this process's next session: :mod:`.spare_workers`)."""
        if self._pool is not None:
            if not spare_workers.keep(self._spare_kind(), self._pool, _stop_pool, self._pool_environment):
                _stop_pool(self._pool)
            self._pool = None
        shutil.rmtree(self.artifact_dir, ignore_errors=True)


def _stop_pool(pool: PopenPoolExecutor) -> None:
    pool.shutdown(wait=False)


def _shares(n: int, parts: int) -> list[list[int]]:
    """Candidate indices ``0..n-1`` in at most ``parts`` contiguous shares of near-equal size."""
    parts = max(1, min(n, parts))
    size, extra = divmod(n, parts)
    out, start = [], 0
    for p in range(parts):
        end = start + size + (p < extra)
        out.append(list(range(start, end)))
        start = end
    return out


def remove_artifacts(paths) -> None:
    """Remove the candidates' libraries, each once (a batch's candidates share theirs)."""
    for folder in {os.path.dirname(split_artifact(p)[0]) for p in paths if p}:
        shutil.rmtree(folder, ignore_errors=True)


def _noop() -> int:
    import tvm  # noqa: F401

    return os.getpid()


def _short(exc) -> str:
    lines = [ln for ln in str(exc).strip().splitlines() if ln.strip()]
    return (lines[-1] if lines else type(exc).__name__)[:300]
