"""``nnwatch open RUN_DIR``: the dashboard on a finished or crashed run, read from its log.

Left/Right (Shift: 10x) move a step cursor through the history, Home jumps to the first step,
End back to the last; the layers pane shows the per-layer stats sampled at the cursor.
``--compare OTHER`` overlays another run (a name or directory; followed live if it is live) on
the loss and grad charts, as ``o`` does in the monitor.
"""

from __future__ import annotations

import argparse
import os
import re
import sys
from pathlib import Path
from typing import Any

_NAME_RANK = re.compile(r"(?P<name>.+):(?P<rank>\d+)")

COMMAND = "open"
HELP = "open a finished or crashed run from its log, with a step cursor to scrub through history"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    from nnwatch.cli._options import RUN, add_root_argument
    from nnwatch.tui.launch import add_monitor_arguments

    parser.add_argument(
        "run_dir", metavar=RUN,
        help="a run directory, a run name or a job's run id from `nnwatch ls --all` (NAME:RANK: one rank)",
    )
    add_root_argument(parser)
    parser.add_argument(
        "--hosts", metavar="HOSTS",
        help="for a job: every node's ranks in the ranks pane, over ssh (a,b,c, a hostfile or "
        "'slurm'), so its story takes every node into account",
    )  # fmt: skip
    from nnwatch.cli.attach import add_ssh_arguments

    add_ssh_arguments(parser, "with --hosts, ")
    add_monitor_arguments(parser)


def resolve_run_dir(spec: str) -> Path | None:
    """A directory as given, else the run directory of a run named ``spec`` in ``ls --all``."""
    return resolve_run(spec)[0]


def resolve_run(spec: str) -> tuple[Path | None, Any]:
    """The run directory ``spec`` names (a directory, a run name or its start, ``NAME:RANK``)
    and the distributed job it is a rank of (None outside one). A job's name opens its lowest
    rank on this host (rank 0 where it is here), whether the job still runs or ended."""
    path = Path(spec).expanduser()
    if path.is_dir():
        return path, _job_of(path)
    from nnwatch.store.jobs import group_jobs
    from nnwatch.store.paths import default_root
    from nnwatch.store.registry import list_runs, recorded_runs

    root = default_root()
    runs = list_runs(root) + recorded_runs(root) + recorded_runs(root / "runs")
    rank: int | None = None
    split = _NAME_RANK.fullmatch(spec)
    if split is not None and not any(spec in (r.name, Path(r.run_dir).name) for r in runs):
        spec, rank = split["name"], int(split["rank"])
    found = [r for r in runs if spec in (r.name, Path(r.run_dir).name)] or [
        r for r in runs if Path(r.run_dir).name.startswith(spec)
    ] or _by_job_id(spec, runs)
    if rank is not None:
        found = [r for r in found if r.rank == rank]
    if not found:
        return None, None
    jobs = [j for j in group_jobs(found) if j.distributed]
    if jobs:
        job = max(jobs, key=lambda j: max(r.started for r in j.runs))  # the newest of that name
        info = job.run_for(rank) if rank is not None else min(job.runs, key=lambda r: r.rank)
        if info is not None:
            return Path(info.run_dir), _job_of(Path(info.run_dir))
    newest = max(found, key=lambda r: r.started)
    return Path(newest.run_dir), _job_of(Path(newest.run_dir))


def _by_job_id(spec: str, runs: list[Any]) -> list[Any]:
    """The runs of the jobs whose torchrun run id (or master address) ``spec`` names: what
    ``nnwatch ls`` prints in a job's line, and what ``attach --job`` takes."""
    from nnwatch.cli.ranks import matches
    from nnwatch.store.jobs import group_jobs

    jobs = group_jobs([r for r in runs if r.world_size > 1])
    return [r for job in jobs if job.distributed and matches(job, spec) for r in job.runs]


def _job_of(run_dir: Path) -> Any:
    """The distributed job of the run in ``run_dir``, with every rank of it found on this host
    (registered or ended), or None."""
    from nnwatch.store.jobs import group_jobs
    from nnwatch.store.paths import default_root
    from nnwatch.store.registry import inspect_dir, list_runs, recorded_runs

    try:
        me = inspect_dir(run_dir)
        if me is None or me.world_size < 2:
            return None
        root = default_root()
        here = os.path.realpath(run_dir)
        runs = [r for r in list_runs(root) + recorded_runs(root) if os.path.realpath(r.run_dir) != here]
        siblings = [inspect_dir(d.parent) for d in sorted(run_dir.parent.glob("*/meta.json"))[:512]]
        runs += [r for r in siblings if r is not None and os.path.realpath(r.run_dir) != here]
        seen: set[str] = set()
        unique = []
        for r in [me, *runs]:
            key = os.path.realpath(r.run_dir)
            if key not in seen:
                seen.add(key)
                unique.append(r)
        for job in group_jobs(unique):
            if any(os.path.realpath(r.run_dir) == here for r in job.runs):
                return job if job.distributed else None
    except OSError:
        return None
    return None


def run(args: argparse.Namespace) -> int:
    from nnwatch.sources.base import SourceError
    from nnwatch.sources.recorded import RecordedSource
    from nnwatch.tui.launch import run_monitor

    run_dir, job = resolve_run(args.run_dir)
    if run_dir is None:
        print(
            f"nnwatch open: {args.run_dir} is not a directory nor a run name; "
            "`nnwatch ls --all` lists the runs on disk",
            file=sys.stderr,
        )
        return 1
    try:
        source = RecordedSource(run_dir)
    except SourceError as exc:
        print(f"nnwatch open: {exc}", file=sys.stderr)
        return 1
    if not getattr(args, "hosts", None):
        return run_monitor(source, args, job=job)
    from nnwatch.cli._config import ssh_options_for
    from nnwatch.sources.job_fanout import JobFanout, parse_hosts

    try:
        hosts = parse_hosts(args.hosts)
    except SourceError as exc:
        source.close()
        print(f"nnwatch open: {exc}", file=sys.stderr)
        return 1
    spec = _NAME_RANK.fullmatch(args.run_dir)
    name = spec["name"] if spec is not None and job is not None else args.run_dir
    fanout = JobFanout(name, hosts, options_for=lambda host: ssh_options_for(args, host))
    try:
        return run_monitor(source, args, job=job, job_views=fanout.poll)
    finally:
        fanout.close()
