"""How much better than the gradient rule can ANY task scheduler be on the recorded traces, and how much of
that does DynaTune capture?

A clairvoyant scheduler that reads the future off the traces: each round it gives the slot to the task
whose next 1..LOOK slots (replayed exactly as the replay does) drop the weighted latency fastest per
second; when no task gains within LOOK slots it shares slots by weighted latency per visit. It is an upper
reference, not a bound in the strict sense (greedy lookahead is not optimal), but no scheduler that only
sees the past can expect to beat it by much.

It runs inside ``dynatune bench replay``'s benchmark, on the same draws of traces (one recorded trace per
task per replay seed) and the same TTQ definition. Per budget and rtol it reports the share of the
clairvoyant's advantage over gradient that DynaTune captures, per draw
``(TTQ_gradient - TTQ_dynatune) / (TTQ_gradient - TTQ_clairvoyant)`` (draws where the clairvoyant saves
under 1 % of gradient's time are left out), as median and interquartile range, and the share of the median
ratios ``(median r_dynatune - 1) / (median r_clairvoyant - 1)``.

    python -m bench.replay_oracle [--draws 20] [--rtol 0 0.02]   # writes bench/results/replay_oracle.json
"""

import math
from bisect import bisect_right

from bench.harness import parser, results_path, write_json
from dynatune.bench.replay import running_bests, slot_end, ttq_ratio
from dynatune.bench.replay_bench import run_replay_benchmark, spread
from dynatune.schedulers.base import Scheduler

LOOK = 5
BUDGETS = (0.25, 0.5, 1.0)


class Clairvoyant(Scheduler):
    name = "clairvoyant"

    def __init__(self, doc, slot_s: float, look: int = LOOK):
        super().__init__()
        self.slot, self.look = slot_s, look
        self.times = [[float(p[0]) for p in r["trace"]] for r in doc["tasks"]]
        self.bests = [running_bests(r) for r in doc["tasks"]]

    def choose(self, ctx):
        best, alive = None, []
        for i, t in enumerate(ctx.tasks):
            if t.exhausted or not math.isfinite(t.best_s):
                continue
            alive.append(t)
            end = t.seconds
            for _ in range(self.look):
                end = slot_end(self.times[i], end, self.slot)
                j = bisect_right(self.times[i], end + 1e-9) - 1
                rate = t.weight * max(t.best_s - self.bests[i][j], 0.0) / (end - t.seconds)
                if rate > 0 and (best is None or rate > best[0]):
                    best = (rate, i)
        if best is not None:
            return best[1]
        if not alive:
            return None
        return max(alive, key=lambda t: (t.weight * t.best_s / max(t.visits, 1), -t.index)).index


def captured_share(row: dict, rtol: str):
    """Share of the clairvoyant's time saved over gradient that DynaTune saves too, on one draw and budget."""
    t = row["ttq_s"][rtol]
    saved = t["gradient"] - t["clairvoyant"]
    return None if saved <= 0.01 * t["gradient"] else (t["gradient"] - t["dynatune"]) / saved


def main(argv=None):
    ap = parser(__doc__)
    ap.add_argument("--models", nargs="*", help="trace files or recorded model names (default: all recorded)")
    ap.add_argument("--draws", type=int, default=20)
    ap.add_argument("--rtol", type=float, nargs="+", default=[0.0, 0.02])
    ap.add_argument("--out", default=results_path("replay_oracle.json"))
    args = ap.parse_args(argv)
    res = run_replay_benchmark(
        models=args.models or None,
        budgets=BUDGETS,
        schedulers=("dynatune", "gradient", "round_robin"),
        rtols=args.rtol,
        draws=args.draws,
        factories={"clairvoyant": lambda doc, slot: Clairvoyant(doc, slot)},
    )
    shares = {}
    for r in map(str, args.rtol):
        shares[r] = {}
        for j, frac in enumerate(BUDGETS):
            rows = [d[j] for m in res["models"] for d in m["draws"]]
            ratio = {
                name: spread(
                    ttq_ratio(
                        row["ttq_s"][r]["gradient"], row["ttq_s"][r][name], res["horizon"] * row["budget_s"]
                    )
                    for row in rows
                )
                for name in ("dynatune", "clairvoyant")
            }
            c, d = ratio["clairvoyant"]["median"], ratio["dynatune"]["median"]
            shares[r][str(frac)] = {
                "captured_share": spread(captured_share(row, r) for row in rows),
                "share_of_median_ratios": (d - 1) / (c - 1) if c and c > 1.01 else None,
                "vs_gradient": ratio,
            }
            print(
                f"rtol {r} budget {frac}: clairvoyant {c:.2f}x, DynaTune {d:.2f}x sooner than gradient; "
                f"captured share {_fmt(shares[r][str(frac)]['captured_share'])}",
                flush=True,
            )
    out = {
        "look": LOOK,
        "draws": args.draws,
        "traces_per_task": res["traces_per_task"],
        "models": [m["model"] for m in res["models"]],
        "shares": shares,
    }
    write_json(args.out, out)
    return out


def _fmt(s):
    return "n/a" if s["median"] is None else f"{s['median']:.2f} [{s['q1']:.2f}, {s['q3']:.2f}] (n={s['n']})"


if __name__ == "__main__":
    main()
