"""Sweep of DynaTune scheduler parameters on the recorded replay traces (top 12 by TTQ vs gradient).

python bench/replay_sweep.py
"""

import itertools
import json
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
from dynatune.bench.replay_bench import run_replay_benchmark

budgets = (0.1, 0.25, 0.5, 1.0)
res = []
for warm, c, cv, neg in itertools.product([0, 1], [0.5, 1.0, 2.0], [0.002, 0.02, 0.1], [1e-3, 1e-4, 0.0]):
    p = {"warmup": warm, "c": c, "c_visit": cv, "negligible": neg}
    r = run_replay_benchmark(
        budgets=budgets,
        schedulers=("dynatune", "gradient", "round_robin"),
        params={"dynatune": p},
        rtols=(0.02,),
        draws=5,
    )
    pb = r["summary"]["0.02"]
    g = [pb[str(b)]["ttq_vs_gradient"]["median"] for b in budgets]
    rr = [pb[str(b)]["ttq_vs_round_robin"]["median"] for b in budgets]
    res.append((sum(g[1:]), p, g, rr))
res.sort(key=lambda x: -x[0])
for s, p, g, rr in res[:12]:
    print(json.dumps(p), [round(x, 2) for x in g], [round(x, 2) for x in rr])
