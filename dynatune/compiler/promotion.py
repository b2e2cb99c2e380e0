"""Whether a newly tuned model should replace the one users deploy (the champion): only on measured speed.

:func:`decide` promotes the new model when its outputs matched ONNX Runtime's and, timed side by side with
the champion in a fresh process on quiet cores (:func:`dynatune.compiler.fresh_timing.time_against_baseline`,
each loaded as its user loads it), it is not slower: not every round found it slower (a ratio new / champion
above 1 in each), its fastest block is at most ``FASTEST_BLOCK_MARGIN`` slower than the champion's (the
statistic a run reports, :func:`dynatune.compiler.timing.best_ratio`), and the median of the rounds' ratios
is at most 1 plus half their min-max spread (what the timing cannot tell apart from 1). On a busy machine
the spread grows, and a model far slower passed on the spread alone: 53x slower, rounds 2.7-112; 105x
slower, rounds 0.93-212 (one round in which the champion's block was held up). With no champion, a new
model whose outputs matched is promoted. It is not promoted when its outputs did not match, when the timing
stayed under load (load flatters the side whose thread pool suffers less: no promotion is decided on it),
when the champion cannot run on this CPU (it was built for features this one lacks: it cannot be timed
here), or when it is slower; :attr:`Promotion.reason` says which, with the figures.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

from dynatune.machine.load import QuietPolicy


@dataclass
class Promotion:
    promoted: bool
    reason: str  # one sentence, with the figures
    ratio_vs_champion: float | None = None  # median of the rounds' new / champion ratios
    ratio_vs_champion_min: float | None = None
    ratio_vs_champion_max: float | None = None
    ratio_vs_champion_fastest: float | None = None  # the fastest blocks' ratio
    new_ms: float | None = None
    champion_ms: float | None = None
    under_load: bool = False
    load_cores: float | None = None

    def as_dict(self) -> dict:
        return asdict(self)


# How much slower a new model's fastest block may be than the champion's and still count as the same speed:
# the fastest-block ratio of one artifact against ONNX Runtime read 1.12-1.31 over 8 fresh processes in a
# row on the project's shared guest, six of them within 1.25 +- 0.03 (BENCHMARKS.md: "How a ratio is read").
FASTEST_BLOCK_MARGIN = 0.10


def tolerance(sbs) -> float:
    """The largest ratio new / champion that the timing ``sbs`` cannot tell from 1: half its spread."""
    return 1.0 + (sbs.ratio_max - sbs.ratio_min) / 2


def is_slower(sbs) -> bool:
    """Whether the timing ``sbs`` (new against champion) tells the new model slower: in every round, at its
    fastest by more than :data:`FASTEST_BLOCK_MARGIN`, or at the median by more than the rounds' spread
    allows."""
    return sbs.ratio_min > 1.0 or sbs.ratio > 1.0 + FASTEST_BLOCK_MARGIN or sbs.ratio_median > tolerance(sbs)


def decide(
    new: str,
    champion: str | None,
    *,
    numerics_ok: bool,
    quiet: QuietPolicy = QuietPolicy(),
    rounds: int = 7,
    block_ms: float = 200.0,
) -> Promotion:
    """Whether the compiled model ``new`` should take the champion's place (``champion``: its library, its
    metadata beside it; None when there is none)."""
    from dynatune.compiler.fresh_timing import time_against_baseline
    from dynatune.runtime import cpu_features, missing_features, read_metadata

    if not numerics_ok:
        return Promotion(False, "its outputs do not match ONNX Runtime's")
    if champion is None:
        return Promotion(True, "there was no champion")
    missing = missing_features(read_metadata(champion), cpu_features())
    if missing:
        return Promotion(
            False,
            f"the champion was built for a CPU with {', '.join(missing)}, which this one lacks: "
            "it cannot be timed here",
        )
    sbs = time_against_baseline(new, champion, rounds=rounds, block_ms=block_ms, quiet=quiet)
    figures = dict(
        ratio_vs_champion=sbs.ratio_median,
        ratio_vs_champion_min=sbs.ratio_min,
        ratio_vs_champion_max=sbs.ratio_max,
        ratio_vs_champion_fastest=sbs.ratio,
        new_ms=sbs.tvm_median_ms,
        champion_ms=sbs.ort_median_ms,
        under_load=sbs.under_load,
        load_cores=sbs.load_cores,
    )
    timed = (
        f"{sbs.tvm_median_ms:.3f} ms against the champion's {sbs.ort_median_ms:.3f} ms "
        f"(ratio {sbs.ratio_median:.3f}, rounds {sbs.ratio_min:.3f}-{sbs.ratio_max:.3f}, "
        f"fastest blocks {sbs.ratio:.3f})"
    )
    if sbs.under_load:
        return Promotion(
            False,
            f"the side-by-side timing stayed under load ({sbs.load_cores or 0:.2f} cores busy)",
            **figures,
        )
    if is_slower(sbs):
        return Promotion(False, f"it is slower than the champion: {timed}", **figures)
    return Promotion(True, f"it is not slower than the champion: {timed}", **figures)
