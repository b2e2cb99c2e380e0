"""Winograd per task where it is faster (issue #27 item 7): the final compile's choice, by measurement.

With ``compile.winograd`` a run tunes each eligible 3x3 convolution as a Winograd task
(:mod:`dynatune.model.winograd`). Winograd is not faster everywhere: on an Intel CPU with two AVX-512 FMA
units SqueezeNet's 32->128 convolution at 27x27 ran 0.85x the direct kernel's time after 240 s of tuning,
but its 16->64 one at 55x55 1.22x (BENCHMARKS.md, session 27). So before the final compile
(:func:`choose_winograd`), each Winograd task's best kernel is timed beside the direct convolution that
computes the same thing with the same epilogue (its analytic first candidates,
:mod:`dynatune.search.analytic`), on the session's builder and runner, cold where the compile's cold
choice is on (single runs, the caches flushed before each, as the model runs them: a Winograd kernel's
transformed weights are 4x the direct one's, and SqueezeNet's 13x13 one ran 1.2x its warm time cold). The
compiled model keeps Winograd only for the convolutions where it won; the others are lowered direct
(:attr:`Lowering.winograd_direct`), each with its fastest analytic kernel, whose measurement joins the
compile's database.

A task is paired with its direct twin by position: the model lowered with Winograd and lowered without it
call their fused functions in the same order (:func:`paired_calls`), the one at a Winograd call's place
computing the same convolution directly.
"""

from __future__ import annotations

import difflib
import math
import os
from dataclasses import asdict, dataclass, field, replace

from dynatune.files import atomic_write_json
from dynatune.model.extract import Lowering, extract_tasks, fuse
from dynatune.model.winograd import task_signature
from dynatune.search.measure import ColdProtocol

REPORT = "winograd.json"  # in the run's report dir
# Winograd is kept where its kernel takes at most this share of the direct twin's time, both alone. The
# twin is timed with its analytic first candidates, which a run with Winograd never tunes further: tuned for
# 900 s, the direct squeezenet1_1 3x3 kernels ran 0.85-0.98x their analytic ones; and in the model a
# Winograd kernel's transformed weights (4x the direct ones) come from memory: 1.04-1.24x its time alone
# (BENCHMARKS.md, sessions 17 and 27; timed cold, the duel sees that part). A near tie goes to the direct
# convolution, whose numerics are exact.
MARGIN = 0.85


@dataclass
class Duel:
    """One Winograd task against its direct twin, both timed now (seconds; ``inf``: no kernel)."""

    winograd_task: str
    direct_task: str
    signature: str
    weight: int
    winograd_s: float
    direct_s: float

    @property
    def winograd_wins(self) -> bool:
        """Whether Winograd took at most :data:`MARGIN` x the direct kernel's time, or neither ran (then the
        tuned task stays)."""
        return _wins(self.winograd_s, self.direct_s)


@dataclass
class WinogradChoice:
    lowering: Lowering  # what the model is compiled with
    database: object = field(repr=False)  # the compile's database, the direct kernels' records added
    duels: list[Duel] = field(default_factory=list)
    tasks: list = field(default_factory=list, repr=False)  # the compiled model's tasks (its lowering's)
    best_s: dict = field(default_factory=dict, repr=False)  # task key -> best seconds, for those tasks
    timed_cold: bool = False  # the duels' kernels timed cold, as the model runs them

    def estimated_latency(self) -> float:
        """Σ weight x best seconds over the compiled model's tasks."""
        best = self.best_s
        return sum(t.weight * best[t.key] for t in self.tasks if math.isfinite(best.get(t.key, math.inf)))

    def summary(self) -> str:
        kept = [d for d in self.duels if d.signature not in self.lowering.winograd_direct]
        parts = [
            f"{d.signature} {'Winograd' if d in kept else 'direct'} "
            f"({_ratio(d.winograd_s, d.direct_s)} the direct kernel's time)"
            for d in self.duels
        ]
        how = " (timed cold)" if self.timed_cold else ""
        return f"Winograd kept for {len(kept)} of {len(self.duels)} convolutions{how}: " + "; ".join(parts)

    def as_dict(self) -> dict:
        return {
            "winograd_direct": list(self.lowering.winograd_direct),
            "timed_cold": self.timed_cold,
            "duels": [
                {k: _finite(v) for k, v in asdict(d).items()} | {"winograd_wins": d.winograd_wins}
                for d in self.duels
            ],
        }

    def write(self, report_dir: str) -> str:
        os.makedirs(report_dir, exist_ok=True)
        atomic_write_json(path := os.path.join(report_dir, REPORT), self.as_dict())
        return path


def choose_winograd(
    model, session, lowering: Lowering, database, keep=None, cold: ColdProtocol | None = None
) -> WinogradChoice:
    """Which of ``session``'s Winograd tasks the compiled model keeps, and the lowering and database to
    compile it with (``database``: the session's compile database, added to). ``keep(duels)`` decides for
    one convolution signature from its duels (one per task computing it); by default Winograd stays where
    its kernels take at most :data:`MARGIN` x the direct ones' time, weighted by their calls. A task whose
    twin is not found keeps Winograd. ``cold``: both kernels timed cold, as the model runs them (the median
    of single runs, the caches flushed before each: :mod:`.cold_choice`), not looped warm."""
    keep = keep or _winograd_takes_less_time
    target = session.target
    winograd = {t.name: t for t in session.tasks if task_signature(t.mod["main"]) is not None}
    if not winograd:
        return WinogradChoice(lowering, database)
    signatures = {name: task_signature(t.mod["main"]) for name, t in winograd.items()}
    all_direct = replace(lowering, winograd_direct=tuple(sorted(set(signatures.values()))))
    bound = model.bound_module()
    fused = {x: fuse(bound, target, x) for x in (lowering, all_direct)}  # each lowered once
    direct = {t.name: t for t in extract_tasks(model, target, all_direct, fused[all_direct])}
    twins = {
        w: d
        for w, d in paired_calls(fused[lowering], fused[all_direct]).items()
        if w in winograd and d in direct
    }
    duels, kernels = [], {}
    for name, twin in twins.items():
        duel, kernels[twin] = _duel(session, winograd[name], direct[twin], signatures[name], cold)
        duels.append(duel)
    by_signature: dict[str, list[Duel]] = {}
    for d in duels:
        by_signature.setdefault(d.signature, []).append(d)
    chosen = {s for s, ds in by_signature.items() if not keep(ds)}
    while True:  # a direct twin the compiled model would not call as tuned keeps its Winograd task
        final = replace(lowering, winograd_direct=tuple(sorted(chosen)))
        tasks = extract_tasks(model, target, final, fused.get(final))
        keys = {t.key for t in tasks}
        astray = {
            d.signature for d in duels if d.signature in chosen and direct[d.direct_task].key not in keys
        }
        if not astray:
            break
        chosen -= astray
    best = {t.key: session.db.best_latency(t.key) for t in tasks}
    for d in duels:
        twin, kernel = direct[d.direct_task], kernels[d.direct_task]
        if d.signature in chosen and kernel is not None:
            _commit(database, twin, kernel, target)
            best[twin.key] = d.direct_s
    return WinogradChoice(final, database, duels, tasks, best, timed_cold=cold is not None)


def chosen_lowering(lowering: Lowering, report_dir: str) -> Lowering:
    """``lowering`` with the convolutions a finished run's choice kept direct (its report's
    ``winograd.json``), as its model was compiled; ``lowering`` itself where the run made no choice."""
    from dynatune.search.state_files import read_json_file

    path = os.path.join(report_dir, REPORT)
    if not (lowering.winograd and os.path.exists(path)):
        return lowering
    return replace(lowering, winograd_direct=tuple(read_json_file(path, dict)["winograd_direct"]))


def _winograd_takes_less_time(duels: list[Duel]) -> bool:
    """:attr:`Duel.winograd_wins` over the duels of one convolution, their times weighted by their calls."""
    return _wins(sum(d.weight * d.winograd_s for d in duels), sum(d.weight * d.direct_s for d in duels))


def _wins(winograd_s: float, direct_s: float) -> bool:
    if math.isinf(direct_s):
        return True
    return winograd_s <= MARGIN * direct_s


def paired_calls(fused, other) -> dict[str, str]:
    """``{function name in fused: function name in other}`` for the fused functions two lowerings of a
    model (:func:`dynatune.model.extract.fuse`) call at the same place, where they differ. The places are
    found by aligning the two sequences of calls by their output shapes: a lowering may call a function the
    other does not (a transpose of the model's input that a direct first convolution reads in place)."""
    ours, theirs = _called_functions(fused), _called_functions(other)
    match = difflib.SequenceMatcher(a=[s for _, s in ours], b=[s for _, s in theirs], autojunk=False)
    pairs = {}
    for block in match.get_matching_blocks():
        for k in range(block.size):
            a, b = ours[block.a + k][0], theirs[block.b + k][0]
            if a != b:
                pairs[a] = b
    return pairs


def _called_functions(mod) -> list[tuple[str, str]]:
    """The TIR functions ``mod``'s ``main`` calls, in order: (name, output shape)."""
    import tvm
    from tvm import relax

    call_tir = tvm.ir.Op.get("relax.call_tir")
    calls = []
    for block in mod["main"].body.blocks:
        for binding in block.bindings:
            value = binding.value
            if isinstance(value, relax.Call) and value.op.same_as(call_tir):
                calls.append((value.args[0].name_hint, str(binding.var.ty)))
    return calls


def _duel(session, winograd, direct, signature: str, cold=None) -> tuple[Duel, object]:
    """The Winograd task's best record and the direct task's analytic candidates, built and timed in one
    batch (``cold``: cold); the duel, and the fastest direct candidate with its result (``None``: none
    ran)."""
    from dynatune.search.analytic import task_analytic_candidates
    from dynatune.search.database import mean_secs
    from dynatune.search.reapply import measure_candidate

    cands, tasks = [], []
    session.db.workload(winograd.key, winograd.mod)  # the workload its records are kept under
    sch = session.db.memory.query_schedule(winograd.mod, session.target, "main")  # as the compile applies it
    if sch is not None:
        cands, tasks = [measure_candidate(sch)], [winograd]
    ours = len(cands)
    analytic, _ = task_analytic_candidates(
        direct.mod, session.target, unroll_steps=session.search.unroll_steps
    )
    cands += analytic
    tasks += [direct] * len(analytic)
    results = session.time_candidates(cands, tasks, cold=cold) if cands else []
    secs = [
        cold.seconds(r) if cold else mean_secs(r.run_secs) if r.error_msg is None and r.run_secs else math.inf
        for r in results
    ]
    winograd_s = secs[0] if ours else math.inf
    direct_secs = secs[ours:]
    k = min(range(len(direct_secs)), key=direct_secs.__getitem__, default=None)
    direct_s = direct_secs[k] if k is not None else math.inf
    kernel = (cands[ours + k], results[ours + k]) if k is not None and math.isfinite(direct_s) else None
    duel = Duel(winograd.name, direct.name, signature, winograd.weight, winograd_s, direct_s)
    return duel, kernel


def _commit(database, task, kernel, target) -> None:
    """The direct kernel's measured record, under its task's workload, in the compile's ``database``."""
    from tvm.s_tir.meta_schedule.database import TuningRecord

    cand, result = kernel
    workload = database.commit_workload(task.mod)
    database.commit_tuning_record(
        TuningRecord(cand.sch.trace, workload, result.run_secs, target, cand.args_info)
    )


def _ratio(a: float, b: float) -> str:
    return f"{a / b:.2f}x" if math.isfinite(a) and math.isfinite(b) and b > 0 else "n/a"


def _finite(x):
    return None if isinstance(x, float) and not math.isfinite(x) else x
