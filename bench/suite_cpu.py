"""Where the test suite's CPU goes: every Python process a pytest run starts, by kind, with its CPU seconds.

    python -m bench.suite_cpu [--out bench/results/suite_cpu.json] -- -q -n 2 --dist loadfile

On 2 cores the suite is CPU-bound (its wall time is about its CPU seconds over the cores, whatever the
number of pytest-xdist workers), so what costs CPU is what to cut. For the run, a ``.pth`` file in this
Python's site-packages (removed after) makes each Python process of the run that keeps its environment
(pytest and its workers, the CLI's runs, TVM's build and measurement workers, Prefect's and MLflow's
servers, the fresh timing processes) append one line when it exits: its command, its CPU seconds (user +
system), its wall seconds and the test it ran for (``PYTEST_CURRENT_TEST``). A process killed by a signal
writes nothing: the gap to the run's total CPU (``RUSAGE_CHILDREN``) says how much that was. Reported: CPU
seconds and processes by kind, the tests whose
processes used the most, pytest's exit code and wall time; written to ``--out``.
"""

from __future__ import annotations

import collections
import datetime
import json
import os
import resource
import subprocess
import sys
import sysconfig
import tempfile
import time

from bench.harness import parser, results_path, write_json

HOOK = """
import atexit, json, os, resource, sys, time
def _hook():
    t0, done = time.time(), []
    def write():
        if done:
            return
        done.append(1)
        r = resource.getrusage(resource.RUSAGE_SELF)
        rec = {"argv": sys.argv[:4], "cpu_s": r.ru_utime + r.ru_stime, "wall_s": time.time() - t0,
               "test": os.environ.get("PYTEST_CURRENT_TEST", "").split(" (")[0]}
        with open(os.environ["DYNATUNE_SUITE_CPU_LOG"], "a") as f:
            f.write(json.dumps(rec) + "\\n")
    atexit.register(write)
    exit_now = os._exit
    def exit_written(code):
        write()
        exit_now(code)
    os._exit = exit_written
if not getattr(sys, "_dynatune_suite_cpu", False):  # site-packages may be read twice (lib64 -> lib)
    sys._dynatune_suite_cpu = True
    _hook()
"""

KINDS = (  # (what the command holds, the kind's name), first match wins
    ("popen_worker", "TVM worker (builds, measures)"),
    ("fresh_timing", "fresh timing process"),
    ("uvicorn", "Prefect's server"),
    ("prefect/__main__.py", "Prefect CLI (server start, database upgrade, deploy)"),
    ("huey", "MLflow server's job consumer"),
    ("mlflow", "MLflow"),
    ("dynatune/cli.py", "dynatune CLI"),
    ("pytest", "pytest"),
)


def kind(argv: list[str]) -> str:
    """A process's kind, from its command line."""
    text = " ".join(argv)
    if argv and argv[0].endswith("dynatune/cli.py"):
        return "dynatune CLI " + (argv[1] if len(argv) > 1 else "")
    for needle, name in KINDS:
        if needle in text:
            return name
    if argv == ["-c"]:
        return "python -c (pytest-xdist workers, scripts)"
    return os.path.basename(argv[0]) if argv else "?"


def summarize(records: list[dict], total_cpu_s: float, top: int = 15) -> dict:
    """CPU seconds and processes by kind, and the tests whose processes used the most CPU."""
    kinds: dict = collections.defaultdict(lambda: {"processes": 0, "cpu_s": 0.0})
    tests: collections.Counter = collections.Counter()
    for r in records:
        k = kinds[kind(r["argv"])]
        k["processes"] += 1
        k["cpu_s"] += r["cpu_s"]
        if r["test"]:
            tests[r["test"]] += r["cpu_s"]
    counted = sum(r["cpu_s"] for r in records)
    return {
        "total_cpu_s": total_cpu_s,
        "counted_cpu_s": counted,
        "processes": len(records),
        "by_kind": dict(sorted(kinds.items(), key=lambda kv: -kv[1]["cpu_s"])),
        "top_tests": [{"test": t, "cpu_s": c} for t, c in tests.most_common(top)],
    }


def main(argv=None) -> dict:
    p = parser(__doc__)
    p.add_argument("--out", default=results_path("suite_cpu.json"))
    p.add_argument("pytest_args", nargs="*", help="pytest's arguments, after --")
    args = p.parse_args(argv)
    # one per run: the suite's own smoke test of this benchmark runs one inside a measured run
    pth = os.path.join(sysconfig.get_paths()["purelib"], f"dynatune_suite_cpu_{os.getpid()}.pth")
    with tempfile.TemporaryDirectory(prefix="suite-cpu-") as d:
        hook, log = os.path.join(d, "hook.py"), os.path.join(d, "processes.jsonl")
        with open(hook, "w") as f:
            f.write(HOOK)
        open(log, "w").close()
        env = dict(os.environ, DYNATUNE_SUITE_CPU_LOG=log, DYNATUNE_SUITE_CPU_HOOK=hook)
        with open(pth, "w") as f:  # a process started without these variables runs nothing of it
            f.write(  # the hook runs once per process, whichever run's file Python reads first
                'import os; os.environ.get("DYNATUNE_SUITE_CPU_HOOK") and '
                'exec(open(os.environ["DYNATUNE_SUITE_CPU_HOOK"]).read(), {})\n'
            )
        try:
            before = resource.getrusage(resource.RUSAGE_CHILDREN)
            t0 = time.time()
            rc = subprocess.run([sys.executable, "-m", "pytest", *args.pytest_args], env=env).returncode
            wall = time.time() - t0
            after = resource.getrusage(resource.RUSAGE_CHILDREN)
        finally:
            os.unlink(pth)
        with open(log) as f:
            records = [json.loads(line) for line in f if line.strip()]
    total = (after.ru_utime + after.ru_stime) - (before.ru_utime + before.ru_stime)
    doc = {
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "pytest_args": args.pytest_args,
        "exit_code": rc,
        "wall_s": wall,
        "cores": os.cpu_count(),
        **summarize(records, total),
    }
    write_json(args.out, doc)
    counted = doc["counted_cpu_s"]
    print(f"pytest exit {rc} in {wall:.0f} s; {total:.0f} CPU s ({counted:.0f} in processes that said)")
    for name, k in doc["by_kind"].items():
        print(f"  {k['cpu_s']:8.1f} CPU s  {k['processes']:4d} processes  {name}")
    for t in doc["top_tests"]:
        print(f"  {t['cpu_s']:8.1f} CPU s  {t['test']}")
    return doc


if __name__ == "__main__":
    main()
