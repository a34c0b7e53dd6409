"""``nnwatch gc``: remove what crashed runs left behind: registry entries, sockets, and rings.

Only runs whose process is gone from this host (no such pid, or a pid now owned by a younger
process) are touched. A crashed run's ring file (16 MiB, in RAM on /dev/shm) is folded into its
log first (the steps only the ring held are appended to the log) and then removed; logs and
snapshots are never removed. An entry that cannot be read is named and left alone.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

COMMAND = "gc"
HELP = "clean up runs whose process is gone: registry entries, sockets, rings (logs are kept)"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--dry-run", action="store_true", help="only say what would be removed")
    parser.add_argument("--json", action="store_true", help="print the removed runs as JSON")
    from nnwatch.cli._options import add_root_argument

    add_root_argument(parser)


def run(args: argparse.Namespace) -> int:
    from nnwatch.store.paths import RunDirError
    from nnwatch.store.registry_gc import fold_dead_rings, gc

    problems: list[str] = []
    try:
        removed = gc(args.root, dry_run=args.dry_run, problems=problems)
        folded = fold_dead_rings(args.root, dry_run=args.dry_run, problems=problems)
    except (RunDirError, OSError) as exc:
        print(f"nnwatch gc: cannot read the run directory: {exc}", file=sys.stderr)
        return 1
    for line in dict.fromkeys(problems):
        print(f"nnwatch gc: {line}", file=sys.stderr)
    if args.json:
        rows = [r.to_dict() for r in removed]
        json.dump(
            {"removed": rows, "rings": [{"run_dir": d, "steps_recovered": n, "result": what}
                                        for d, n, what in folded]},
            sys.stdout, indent=1,
        )  # fmt: skip
        sys.stdout.write("\n")
        return 0
    verb = "would remove" if args.dry_run else "removed"
    if not removed and not folded:
        print("nothing to remove: no registered run has lost its process")
        return 0
    for r in removed:
        print(f"{verb} {Path(r.run_dir).name} (pid {r.pid}, rank {r.rank}): process is gone")
    for run_dir, _n, what in folded:
        print(f"{Path(run_dir).name}: {what}")
    return 0
