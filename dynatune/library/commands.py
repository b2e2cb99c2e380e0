"""``dynatune library``: what the schedule library holds, and carrying it to another machine of the same kind.

    dynatune library show [--url URL] [--json]
    dynatune library export FILE [--fingerprint FP] [--url URL]
    dynatune library import FILE [--url URL]
    dynatune library prune [--keep N] [--fingerprint FP] [--url URL]

``--url`` defaults to ``$DYNATUNE_LIBRARY_URL``, else the embedded library in ``~/.cache/dynatune``;
``--fingerprint`` to this machine's (:func:`dynatune.machine.target.machine_fingerprint` of the llvm target).
"""

from __future__ import annotations

import datetime
import json

from dynatune.library.store import ScheduleLibrary, library_url


def add_parser(sub) -> None:
    lib = sub.add_parser("library", help="the schedule library: show, export, import, prune")
    cmds = lib.add_subparsers(dest="library_cmd", required=True, metavar="{show,export,import,prune}")
    show = cmds.add_parser("show", help="fingerprints, tasks, records and newest runs")
    show.add_argument("--json", action="store_true", help="one JSON object on stdout")
    exp = cmds.add_parser("export", help="write one fingerprint's records to a file")
    exp.add_argument("file")
    exp.add_argument("--fingerprint", help="default: this machine's")
    imp = cmds.add_parser("import", help="add an exported file's records")
    imp.add_argument("file")
    prune = cmds.add_parser("prune", help="delete records that are no longer among any task's best")
    prune.add_argument(
        "--keep", type=int, default=16, help="schedules kept per task (default 16: what a run seeds)"
    )
    prune.add_argument("--fingerprint", help="only this fingerprint's tasks (default: all)")
    for p in (show, exp, imp, prune):
        p.add_argument(
            "--url", help="the library (default: $DYNATUNE_LIBRARY_URL, else ~/.cache/dynatune/library.db)"
        )
        p.set_defaults(func=cmd_library)


def this_machine() -> str:
    from dynatune.machine.target import machine_fingerprint, make_target

    return machine_fingerprint(make_target("llvm"))


def cmd_library(args) -> int:
    lib = ScheduleLibrary(library_url(args.url))
    try:
        if args.library_cmd == "show":
            held = lib.summary()
            if args.json:
                print(json.dumps(held, indent=1))
            else:
                print("\n".join(show_lines(held, this_machine())))
        elif args.library_cmd == "export":
            fp = args.fingerprint or this_machine()
            n = lib.export(fp, args.file)
            print(f"wrote {n} records of {fp} to {args.file}")
        elif args.library_cmd == "import":
            got = lib.import_file(args.file)
            mine = (
                " (this machine's kind)"
                if got["fingerprint"] == this_machine()
                else " (not this machine's kind: used only by runs on a machine of that kind)"
            )
            print(
                f"imported {got['records']} records ({got['skipped']} already here) of {got['tasks']} tasks "
                f"for {got['fingerprint']}{mine}"
            )
        else:
            n = lib.prune(args.keep, args.fingerprint)
            print(f"deleted {n} records (kept each task's {args.keep} best schedules)")
    finally:
        lib.close()
    return 0


def show_lines(held: dict, mine: str) -> list[str]:
    lines = [f"schedule library {held['url']}"]
    if not held["fingerprints"]:
        return lines + ["  empty: runs fill it as they tune"]
    for f in held["fingerprints"]:
        tag = "  <- this machine" if f["fingerprint"] == mine else ""
        kinds = ", ".join(f"{k} {n}" for k, n in sorted(f["kinds"].items(), key=lambda kv: -kv[1]))
        lines += [
            f"{f['fingerprint']}{tag}",
            f"  {f['tasks']} tasks ({kinds}), {f['records']} records, {f['runs']} runs",
        ]
        for r in f["newest_runs"]:
            when = datetime.datetime.fromtimestamp(r["last_write"], datetime.timezone.utc).strftime(
                "%Y-%m-%d %H:%M"
            )
            lines.append(f"  run {r['run_id'][:8]} {r['model']}, last wrote {when} UTC")
    return lines
