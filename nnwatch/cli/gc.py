"""``nnwatch gc``: remove the registry entries and sockets that crashed runs left behind.

Only entries whose process is gone from this host (no such pid, or a pid now owned by a younger
process) are removed; run directories, with their logs and snapshots, are never touched.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

COMMAND = "gc"
HELP = "remove registry entries of runs whose process is gone (logs are kept)"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--dry-run", action="store_true", help="only say what would be removed")
    parser.add_argument("--json", action="store_true", help="print the removed runs as JSON")
    parser.add_argument(
        "--root", type=Path, default=None, help="run directory root (default: $NNWATCH_RUN_DIR)"
    )


def run(args: argparse.Namespace) -> int:
    from nnwatch.channel.registry import gc

    removed = gc(args.root, dry_run=args.dry_run)
    if args.json:
        json.dump([r.to_dict() for r in removed], sys.stdout, indent=1)
        sys.stdout.write("\n")
        return 0
    verb = "would remove" if args.dry_run else "removed"
    if not removed:
        print("nothing to remove: no registered run has lost its process")
        return 0
    for r in removed:
        print(f"{verb} {Path(r.run_dir).name} (pid {r.pid}, rank {r.rank}): process is gone")
    return 0
