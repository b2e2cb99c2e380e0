"""The register blocks a target's vector unit allows: how many accumulators a micro-kernel keeps, and how
well they feed its FMAs.

A register-blocked kernel (MLAS, oneDNN, :mod:`dynatune.search.analytic`) keeps ``rows x vectors``
accumulators in the vector registers: each reduction step loads ``vectors`` weight vectors, broadcasts one
input per row, and issues ``rows x vectors`` FMAs. Which blocks exist follows from the output's extents
(the tiles are exact divisors) and from the registers the target has. The same model decides how far a
convolution's output channels are padded (:mod:`dynatune.model.channel_padding`): SqueezeNet's 1000
channels on a 13 x 13 output, padded to 1008, are 63 AVX-512 vectors, which only a one-vector block covers.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

# MetaSchedule's CPU rules vectorize the innermost loops up to this many lanes (ParallelVectorizeUnroll):
# a register block whose rows x columns is at most this would be fused into one long vector
MAX_VECTORIZE = 64
LATENCY_ACCUMULATORS = 8  # independent FMAs in flight to hide an FMA's latency (4 cycles x 2 pipes)


@dataclass(frozen=True)
class RegisterBlock:
    columns: int  # the vector axis' tile (S3 of the innermost spatial loop)
    rows: tuple[int, ...]  # the tiles of the other spatial loops, outermost first
    score: float

    @property
    def row_count(self) -> int:
        return math.prod(self.rows)


def divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


def register_blocks(spatial: list[int], unit) -> list[RegisterBlock]:
    """Every register block that fits ``unit``'s registers, best first.

    ``spatial`` are the output's extents, its innermost (vector) axis last. A block's score is the share of
    its vector lanes that compute (a column count that is not a multiple of the lanes wastes some) times how
    well it hides the FMA latency (at least :data:`LATENCY_ACCUMULATORS` accumulators) times how few loads
    feed each FMA.
    """
    columns_extent, row_extents = spatial[-1], spatial[:-1]
    inner = [len(row_extents) - 1 - k for k in range(min(2, len(row_extents)))]  # the two innermost rows
    out = []
    for columns in (d for d in divisors(columns_extent) if d <= MAX_VECTORIZE and _whole_vectors(d, unit)):
        vectors = -(-columns // unit.lanes)
        max_rows = unit.accumulators // vectors
        if max_rows < 1:
            continue
        for rows in _row_tiles(row_extents, inner, max_rows):
            n_rows = math.prod(rows)
            innermost = next((r for r in reversed(rows) if r > 1), 1)
            if n_rows > 1 and innermost * columns <= MAX_VECTORIZE:
                continue  # rows and columns would be vectorized as one vector: no broadcasts
            accumulators = n_rows * vectors
            lanes_used = columns / (vectors * unit.lanes)
            latency = min(1.0, accumulators / LATENCY_ACCUMULATORS)
            loads = min(1.0, accumulators / (vectors + n_rows))
            out.append(RegisterBlock(columns, rows, lanes_used * latency * loads))
    # best first; of equal ones, rows from the innermost loop (contiguous inputs); one block per shape
    out.sort(
        key=lambda b: (-round(b.score, 6), -b.row_count * b.columns, -b.columns, [-r for r in b.rows[::-1]])
    )
    best: dict[tuple[int, int], RegisterBlock] = {}
    for b in out:
        best.setdefault((b.columns, b.row_count), b)
    return list(best.values())


def block_score(spatial: list[int], unit) -> float:
    """The score of the best register block for an output of these extents (0 when none fits)."""
    blocks = register_blocks(spatial, unit)
    return blocks[0].score if blocks else 0.0


def _whole_vectors(columns: int, unit) -> bool:
    """A power of two of whole vectors, or a power-of-two part of one (a narrower register): LLVM splits
    any other width into pieces and shuffles (48 columns, 3 AVX-512 vectors, spilled 1161 times in a
    mnasnet convolution's loop: 10 GFLOP/s)."""
    vectors, power_of_two = columns / unit.lanes, columns & (columns - 1) == 0
    return power_of_two and (vectors >= 1 or unit.lanes % columns == 0)


def _row_tiles(extents: list[int], inner: list[int], max_rows: int):
    """Row tiles: divisors of the (up to two) innermost row loops whose product is at most ``max_rows``."""
    if not inner:
        yield ()
        return
    last = inner[0]
    second = inner[1] if len(inner) > 1 else None
    for a in (d for d in divisors(extents[last]) if d <= max_rows):
        for b in (d for d in divisors(extents[second]) if d * a <= max_rows) if second is not None else [1]:
            rows = [1] * len(extents)
            rows[last] = a
            if second is not None:
                rows[second] = b
            yield tuple(rows)
