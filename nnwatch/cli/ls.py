"""``nnwatch ls``: every run of this user, one line each, judged live or not right now.

A run is live only if its pid exists with the start time it registered (pids are reused) and its
heartbeat is fresh; it is hung when no step came for many times its usual step time. ``--json``
prints the same facts for scripts. ``--all`` adds finished and crashed runs that are still on disk.

The ranks of one ``torch.distributed`` job are listed together under a line that names the job
(``nnwatch.store.jobs.group_jobs``), indented; in ``--json`` every row has a ``"job"`` key (null
for a run outside a distributed job). Single-process runs are listed as they always were.

When a rank of a job stopped, the first one and how it stopped are named under the job, and the
ranks that followed are marked as stopped by the launcher; while a rank is dead or frozen and the
others live, they are said to wait in a collective for it, since when
(``nnwatch.store.job_health``). ``--json`` has this in ``job.stops`` and each row's ``job_role``.

``nnwatch ls HOST [HOST ...]`` lists the runs on other machines over ssh instead, and judges a
job's ranks on all of them together (:mod:`nnwatch.cli._ls_remote`).
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
    parser.add_argument(
        "hosts", nargs="*", metavar="HOST",
        help="list the runs on these hosts instead, over ssh (as you name them to ssh); the "
        "ranks of a job on several hosts are judged together",
    )  # fmt: skip
    parser.add_argument("--json", action="store_true", help="print the runs as a JSON list")
    parser.add_argument(
        "--all", action="store_true", help="also list finished and crashed runs still on disk"
    )
    from nnwatch.cli._options import add_root_argument

    add_root_argument(parser)
    parser.add_argument(
        "--hung-after",
        type=float,
        default=None,
        metavar="SECONDS",
        help="call a run hung after this long without a step (default: 20x its step time, >=10 s)",
    )
    from nnwatch.cli.attach import add_ssh_arguments

    add_ssh_arguments(parser, "with HOST, ")


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


def _row(info: Any, indent: str = "", status: str | None = None) -> tuple[str, ...]:
    rate = "-" if info.steps_per_s is None else f"{info.steps_per_s:.3g}"
    return (
        indent + (Path(info.run_dir).name or info.name),
        str(info.pid),
        info.host,
        f"{info.rank}/{info.world_size}",
        "-" if info.step is None else str(info.step),
        rate,
        status or info.status,
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


def job_dict(job: Any, stops: Any = None) -> dict[str, Any] | None:
    """What ``--json`` says about the job of a run: None outside a distributed job. ``stops``
    (a ``JobStops``) says which rank stopped first and which one the others wait for."""
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
        "stops": stops.to_dict() if stops is not None else None,
    }


def job_mates(runs: list[Any], recorded: Any) -> list[Any]:
    """The ranks of the listed jobs that are no longer registered (a rank that crashed or was
    stopped after another one closed its entry): a job is shown whole or its story is lost.
    ``recorded`` returns the unregistered runs; it is only called when a job lacks ranks."""
    from nnwatch.store.jobs import group_jobs

    if not any(j.distributed and j.missing for j in group_jobs(runs)):
        return []
    listed = {r.run_dir for r in runs}
    extra = [r for r in recorded() if r.world_size > 1 and r.run_dir not in listed]
    mates = []
    for job in group_jobs([*runs, *extra]):
        if any(r.run_dir in listed for r in job.runs):
            mates += [r for r in job.runs if r.run_dir not in listed]
    return mates


def judged_jobs(runs: list[Any]) -> tuple[dict[str, Any], dict[int, Any]]:
    """Each run's job (by run directory), and each distributed job's ``JobStops`` (by ``id``)."""
    from nnwatch.sources.job_monitor import judge_stops
    from nnwatch.store.jobs import group_jobs

    jobs = group_jobs(runs)
    job_of = {r.run_dir: job for job in jobs for r in job.runs}
    stops = {
        id(job): judge_stops(list(job.runs), missing=job.missing) for job in jobs if job.distributed
    }
    return job_of, stops


def grouped_rows(
    runs: list[Any], judged: tuple[dict[str, Any], dict[int, Any]] | None = None
) -> list[tuple[str, ...] | str]:
    """Rows in the registry's order, with each distributed job's ranks together under its label
    (at the place of its first rank), and under them, when a rank stopped or holds the others,
    which one and how. ``judged`` is what :func:`judged_jobs` returned for ``runs``."""
    job_of, stops = judged if judged is not None else judged_jobs(runs)
    rows: list[tuple[str, ...] | str] = []
    shown: set[int] = set()  # by identity: a reused master port can give two jobs one key
    for info in runs:
        job = job_of[info.run_dir]
        if not job.distributed:
            rows.append(_row(info))
        elif id(job) not in shown:
            shown.add(id(job))
            story = stops[id(job)]
            rows.append(f"job {job.label}")
            for r in job.runs:
                role = story.ranks.get(r.rank)
                rows.append(_row(r, "  ", role.status if role is not None else None))
            if story.summary:
                rows.append(f"  ! {story.summary}")
            rows += [f"    rank {k}: {story.ranks[k].words}" for k in sorted(story.ranks)]
    return rows


def _hidden_count(shown: list[Any], root: Any) -> int:
    """How many finished or crashed runs ``--all`` would add to what is shown."""
    from nnwatch.store.registry import recorded_runs

    try:
        extra = recorded_runs(root, problems=[])
    except OSError:
        return 0
    seen = {r.run_dir for r in shown}
    return sum(1 for r in extra if r.run_dir not in seen)


def run(args: argparse.Namespace) -> int:
    from nnwatch.store.paths import default_root
    from nnwatch.store.registry import list_runs, recorded_runs
    from nnwatch.store.registry_entry import registry_dir

    if args.hosts:
        args.hosts = [h.rstrip(":") for h in args.hosts]  # `ls gpu-host:` as `nnwatch gpu-host:`
        return _run_remote(args)
    root = args.root
    problems: list[str] = []
    try:
        runs = list_runs(root, hung_min=args.hung_after, problems=problems)
        if args.all:
            runs += recorded_runs(root, problems=problems)
        else:
            runs += job_mates(runs, lambda: recorded_runs(root, problems=problems))
    except OSError as exc:  # the root itself is unreadable (permissions, not a directory)
        print(f"nnwatch ls: cannot read the run directory: {exc}", file=sys.stderr)
        return 1
    for line in dict.fromkeys(problems):  # one line per bad entry, on stderr: --json stays clean
        print(f"nnwatch ls: {line}", file=sys.stderr)
    if args.json:
        _print_json(runs)
        return 0
    hidden = 0 if args.all else _hidden_count(runs, root)
    if not runs:
        where = registry_dir(root) if root is not None else registry_dir(default_root())
        if hidden:
            print(
                f"no live runs; `nnwatch ls --all` would add {hidden} finished or crashed "
                f"run{'s' if hidden != 1 else ''} still on disk"
            )
            return 0
        print(f"no runs found (looked in {where}); runs appear here once they call w.step()")
        return 0
    judged = judged_jobs(runs)
    print(table(grouped_rows(runs, judged)))
    job_of, stops = judged
    told = {
        r.run_dir for r in runs if r.rank in getattr(stops.get(id(job_of[r.run_dir])), "ranks", {})
    }
    # a rank that the job's story explains is explained under its job
    notes = [
        r for r in runs if r.state in ("hung", "crashed") and r.message and r.run_dir not in told
    ]
    for r in notes:
        print(f"  {Path(r.run_dir).name}: {r.message}")
    if hidden:
        print(f"(--all would add {hidden} finished or crashed run{'s' if hidden != 1 else ''})")
    return 0


def _print_json(runs: list[Any]) -> None:
    """``--json``: every run with its job, its rank's part in the job's story, its findings."""
    from nnwatch.store.findings_count import findings_count

    job_of, stops = judged_jobs(runs)
    rows = []
    for r in runs:
        job = job_of[r.run_dir]
        story = stops.get(id(job))
        role = story.ranks.get(r.rank) if story is not None else None
        rows.append(
            {
                **r.to_dict(),
                "job": job_dict(job, story),
                "job_role": role.to_dict() if role is not None else None,
                "findings": findings_count(r.run_dir),
            }
        )
    json.dump(rows, sys.stdout, indent=1)
    sys.stdout.write("\n")


def _run_remote(args: argparse.Namespace) -> int:
    """``nnwatch ls HOST ...``: the runs there, under the names the user gave the hosts."""
    from nnwatch.cli._ls_remote import remote_listing

    runs, (job_of, stops), failed = remote_listing(args)
    if args.json:
        out = []
        for info in runs:
            job = job_of[info.run_dir]
            story = stops.get(id(job))
            role = story.ranks.get(info.rank) if story is not None else None
            out.append({**info.to_dict(), "run_dir": info.run_dir.split(":", 1)[1],
                        "job": job_dict(job, story),
                        "job_role": role.to_dict() if role is not None else None})  # fmt: skip
        json.dump(out, sys.stdout, indent=1, default=str)
        sys.stdout.write("\n")
    elif runs:
        print(table(grouped_rows(runs, (job_of, stops))))
    elif not failed:
        what = "runs" if args.all else "live runs (`--all` adds finished and crashed ones)"
        print(f"no {what} on {', '.join(args.hosts)}")
    return 1 if failed == len(args.hosts) else 0
