"""``nnwatch ls``: every run of this user, one line each, judged live or not right now.

A run is live only if its pid exists with the start time it registered (pids are reused) and its
heartbeat is fresh; it is hung when no step came for many times its usual step time. ``--json``
prints the same facts for scripts. ``--all`` adds finished and crashed runs that are still on disk.

The ranks of one ``torch.distributed`` job are listed together under a line that names the job
(``nnwatch.distributed.group_jobs``), indented; in ``--json`` every row has a ``"job"`` key (null
for a run outside a distributed job). Single-process runs are listed as they always were.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

COMMAND = "ls"
HELP = "list this user's runs: name, pid, host, rank, step, steps/s, status, age"

COLUMNS = ("NAME", "PID", "HOST", "RANK", "STEP", "STEPS/S", "STATUS", "AGE")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--json", action="store_true", help="print the runs as a JSON list")
    parser.add_argument(
        "--all", action="store_true", help="also list finished and crashed runs still on disk"
    )
    parser.add_argument(
        "--root", type=Path, default=None, help="run directory root (default: $NNWATCH_RUN_DIR)"
    )
    parser.add_argument(
        "--hung-after",
        type=float,
        default=None,
        metavar="SECONDS",
        help="call a run hung after this long without a step (default: 20x its step time, >=10 s)",
    )


def format_age(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    s = int(seconds)
    if s < 120:
        return f"{s}s"
    if s < 7200:
        return f"{s // 60}m"
    if s < 172800:
        return f"{s // 3600}h"
    return f"{s // 86400}d"


def _row(info: Any, indent: str = "") -> tuple[str, ...]:
    rate = "-" if info.steps_per_s is None else f"{info.steps_per_s:.3g}"
    return (
        indent + (Path(info.run_dir).name or info.name),
        str(info.pid),
        info.host,
        f"{info.rank}/{info.world_size}",
        "-" if info.step is None else str(info.step),
        rate,
        info.state,
        format_age(info.age),
    )


def table(rows: list[tuple[str, ...] | str]) -> str:
    """Aligned columns; a plain string in ``rows`` is a job header line, printed as it is."""
    cells = [r for r in rows if not isinstance(r, str)]
    widths = [max(len(c), *(len(r[i]) for r in cells)) for i, c in enumerate(COLUMNS)]
    lines = ["  ".join(c.ljust(w) for c, w in zip(COLUMNS, widths, strict=True)).rstrip()]
    for r in rows:
        if isinstance(r, str):
            lines.append(r)
        else:
            lines.append("  ".join(v.ljust(w) for v, w in zip(r, widths, strict=True)).rstrip())
    return "\n".join(lines)


def job_dict(job: Any) -> dict[str, Any] | None:
    """What ``--json`` says about the job of a run: None outside a distributed job."""
    if not job.distributed:
        return None
    return {
        "key": job.key,
        "label": job.label,
        "source": job.source,
        "world_size": job.world_size,
        "restart": job.restart,
        "ranks": list(job.ranks),
        "missing": list(job.missing),
    }


def grouped_rows(runs: list[Any]) -> list[tuple[str, ...] | str]:
    """Rows in the registry's order, with each distributed job's ranks together under its label
    (at the place of its first rank)."""
    from nnwatch.distributed import group_jobs

    job_of = {r.run_dir: job for job in group_jobs(runs) for r in job.runs}
    rows: list[tuple[str, ...] | str] = []
    shown: set[int] = set()  # by identity: a reused master port can give two jobs one key
    for info in runs:
        job = job_of[info.run_dir]
        if not job.distributed:
            rows.append(_row(info))
        elif id(job) not in shown:
            shown.add(id(job))
            rows.append(f"job {job.label}")
            rows += [_row(r, "  ") for r in job.runs]
    return rows


def run(args: argparse.Namespace) -> int:
    from nnwatch.channel.registry import list_runs, recorded_runs, registry_dir
    from nnwatch.paths import default_root

    root = args.root
    runs = list_runs(root, hung_min=args.hung_after)
    if args.all:
        runs += recorded_runs(root)
    if args.json:
        from nnwatch.distributed import group_jobs

        job_of = {r.run_dir: job for job in group_jobs(runs) for r in job.runs}
        rows = [{**r.to_dict(), "job": job_dict(job_of[r.run_dir])} for r in runs]
        json.dump(rows, sys.stdout, indent=1)
        sys.stdout.write("\n")
        return 0
    if not runs:
        where = registry_dir(root) if root is not None else registry_dir(default_root())
        print(f"no runs found (looked in {where}); runs appear here once they call w.step()")
        return 0
    print(table(grouped_rows(runs)))
    notes = [r for r in runs if r.state in ("hung", "crashed") and r.message]
    for r in notes:
        print(f"  {Path(r.run_dir).name}: {r.message}")
    return 0
