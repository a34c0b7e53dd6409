"""``nnwatch attach RUN``: the live dashboard on a running trainer.

RUN is a run name (or the start of one), a pid, or a run directory, as ``nnwatch ls`` shows them.
The ranks of a ``torch.distributed`` job share one name, so a job's name attaches to the job:
rank 0's dashboard (the lowest rank on this machine) with the ranks pane, where ``[``/``]``
switch rank; ``NAME:RANK`` opens that rank first. When a name matches several jobs (an old
crashed one and its restart), the one with live ranks is taken.
``HOST:RUN`` follows a run on another machine: it runs your own ``ssh`` (so ~/.ssh/config,
ProxyJump and agents apply), finds RUN with ``nnwatch ls --json`` there, forwards its socket to a
private local path and reconnects by itself when the link drops (``HOST:`` takes the only live
run there). ``--connect SOCKET`` follows a run through a socket you forwarded yourself.
Quitting the monitor never stops training, and a pause it asked for lifts when it goes.
"""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from nnwatch.store.jobs import Job
    from nnwatch.store.registry import RunInfo

COMMAND = "attach"
HELP = (
    "open the live dashboard on a running trainer or job (by name, NAME:RANK, pid or directory; "
    "HOST:RUN over ssh)"
)
_NAME_RANK = re.compile(r"(?P<name>.+):(?P<rank>\d+)")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    from nnwatch.tui.launch import add_monitor_arguments

    parser.add_argument(
        "run",
        metavar="RUN",
        nargs="?",
        help="run or job name, NAME:RANK, pid or run directory; HOST:RUN for a run over ssh",
    )
    from nnwatch.cli._options import add_connect_argument, add_root_argument

    add_connect_argument(parser, "follow the run")
    add_root_argument(parser)
    add_ssh_arguments(parser, "for HOST:RUN, ")
    add_monitor_arguments(parser)
    from nnwatch.cli._job_attach import add_job_arguments

    add_job_arguments(parser)  # --job JOB --hosts HOSTS: every rank of a multi-node job


def resolve(spec: str, root: Path | None = None) -> tuple[RunInfo | None, Job | None]:
    """The registered run to open for what a user typed, and the distributed job it is a rank of.

    A name shared by the ranks of one job gives that job's lowest rank here (rank 0) and the job;
    ``NAME:RANK`` gives that rank. ``(None, None)`` for a run directory that is not registered
    (it is opened from its files). Raises ``SourceError`` with plain words otherwise.
    """
    from nnwatch.sources.base import SourceError
    from nnwatch.store.jobs import group_jobs
    from nnwatch.store.registry import find_runs

    spec = spec.strip()
    runs, rank = find_runs(spec, root), None
    split = _NAME_RANK.fullmatch(spec)
    if not runs and split is not None:
        runs, rank = find_runs(split["name"], root), int(split["rank"])
        spec = split["name"]
    if not runs:
        if rank is None and Path(spec).expanduser().is_dir():
            return None, None
        raise SourceError(f"no registered run matches {spec!r}; " + _ended_hint(spec, rank, root))
    jobs = group_jobs(runs)
    if rank is not None:
        jobs = [j for j in jobs if j.run_for(rank) is not None]
        if not jobs:
            here = ", ".join(str(r.rank) for r in runs)
            raise SourceError(
                f"{spec!r} has no rank {rank} on this machine (ranks here: {here}); "
                "`nnwatch ls` lists them"
            )
    if len(jobs) > 1:
        live = [j for j in jobs if any(r.live for r in j.runs)]
        if len(live) != 1:
            names = "; ".join(_describe(j) for j in (live or jobs))
            raise SourceError(
                f"{spec!r} matches {len(live or jobs)} runs or jobs: {names}; name one of them "
                "by its run directory or pid (`nnwatch ls` lists them)"
            )
        jobs = live
    job = jobs[0]
    info = job.run_for(rank) if rank is not None else job.runs[0]
    assert info is not None
    return info, job if job.distributed else None


def _ended_hint(spec: str, rank: int | None, root: Path | None) -> str:
    """What to do when nothing live matches: a run or job of that name that ended is opened
    with ``nnwatch open`` (its history), not attached to."""
    from nnwatch.store.registry import recorded_runs

    try:
        ended = [
            r for r in recorded_runs(root, problems=[])
            if spec in (r.name, Path(r.run_dir).name) or Path(r.run_dir).name.startswith(spec)
        ]  # fmt: skip
    except OSError:
        ended = []
    if not ended:
        return "`nnwatch ls` lists them"
    newest = max(ended, key=lambda r: r.started)
    what = f"job {newest.name}" if newest.world_size > 1 else f"run {Path(newest.run_dir).name}"
    target = f"{spec}:{rank}" if rank is not None else spec
    return (
        f"the {what} is no longer running ({newest.status}); `nnwatch open {target}` shows "
        "its history"
    )


def _describe(job: Job) -> str:
    pids = ", ".join(f"rank {r.rank} pid {r.pid}" for r in job.runs)
    if not job.distributed:
        r = job.runs[0]
        return f"{Path(r.run_dir).name} (pid {r.pid}, {r.state})"
    return f"job {job.label} ({pids})"


def add_ssh_arguments(parser: argparse.ArgumentParser, when: str = "") -> None:
    """How nnwatch reaches another host: the user's ssh, its arguments, nnwatch's name there."""
    parser.add_argument(
        "--remote-nnwatch", default=None, metavar="CMD",
        help=f"{when}the command that runs nnwatch on HOST (default: the Python that runs the "
        "runs there, named in their registry entries; else nnwatch on its PATH)",
    )  # fmt: skip
    parser.add_argument(
        "--ssh", default=None, metavar="PROGRAM", help=f"{when}the ssh program to run (default: ssh)"
    )
    parser.add_argument(
        "--ssh-arg", action="append", default=[], metavar="ARG", dest="ssh_args",
        help=f"{when}an extra argument for ssh (repeat it: --ssh-arg=-p --ssh-arg=2222)",
    )  # fmt: skip


def ssh_flags(args: argparse.Namespace) -> dict[str, Any]:
    """What the command line says about reaching other hosts (None where it says nothing)."""
    return {"ssh": args.ssh, "ssh_args": list(args.ssh_args), "remote_nnwatch": args.remote_nnwatch}


def ssh_options(args: argparse.Namespace, host: str) -> dict[str, Any]:
    """The keyword arguments of ``RemoteSource``, ``remote_runs`` and ``PullRequest`` for
    ``host``: the flags over the config file's table for it (``nnwatch.cli._config``)."""
    from nnwatch.cli._config import ssh_options as configured

    return configured(host, **ssh_flags(args))


def remote_spec(spec: str) -> tuple[str, str] | None:
    """``HOST:RUN`` (or ``HOST:`` for the only live run there) as (host, run); None otherwise.
    Only asked once ``spec`` matched no local run, so ``NAME:RANK`` of a local job wins."""
    host, sep, run_spec = spec.partition(":")
    if not sep or not host or "/" in host:
        return None
    return host, run_spec


def open_live(
    spec: str | None, connect: str | None, remote_options: dict[str, Any] | None = None
) -> tuple[object, list[str], Job | None]:
    """The source for RUN (or the socket, or ``HOST:RUN`` through ssh), the uuids of the run's
    GPUs where the registry knows them, and the distributed job RUN belongs to (None for a single
    process, a socket or a remote run)."""
    from nnwatch.sources.base import SourceError
    from nnwatch.sources.live import LiveSource
    from nnwatch.tui.launch import gpu_uuids_for

    if connect:  # a forwarded socket: the far monitor's bounded stream (overview first)
        from nnwatch.sources.summarised import SummarisedSource

        return SummarisedSource(connect), [], None
    assert spec is not None
    try:
        info, job = resolve(spec)
    except SourceError:
        remote = remote_spec(spec)
        if remote is None:
            raise
        from nnwatch.sources.remote import RemoteSource

        host, run_spec = remote
        from nnwatch.cli._config import ssh_options as configured

        opts = configured(host, **(remote_options or {}))  # the flags over the config file's
        return RemoteSource(host, run_spec, **opts), [], None
    if info is None:
        return LiveSource(spec), [], None
    source = LiveSource.from_info(info)
    uuids = gpu_uuids_for(source.meta.device, list(info.cuda_devices))
    return source, uuids, job


def run(args: argparse.Namespace) -> int:
    from nnwatch.sources.base import SourceError
    from nnwatch.tui.launch import run_monitor

    if getattr(args, "job", None):
        from nnwatch.cli._job_attach import run_job

        return run_job(args)
    if not args.run and not args.connect:
        print(
            "nnwatch attach: name a run (see `nnwatch ls`) or give --connect SOCKET",
            file=sys.stderr,
        )
        return 2
    try:
        source, uuids, job = open_live(args.run, args.connect, ssh_flags(args))
    except SourceError as exc:
        print(f"nnwatch attach: {exc}", file=sys.stderr)
        return 1
    return run_monitor(source, args, gpu_uuids=uuids or None, job=job)  # type: ignore[arg-type]
