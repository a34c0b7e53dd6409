"""``nnwatch attach --job JOB --hosts HOSTS``: one terminal for every rank of a multi-node job.

Kept apart from ``attach.py`` (which it is called from) so that the two ways of attaching grow
independently. The job view is the ranks pane on its own screen, fed by
:class:`~nnwatch.sources.job_fanout.JobFanout`; Enter on a rank opens that rank's full dashboard
through the same ssh connection to its host, and quitting that dashboard comes back here.
"""

from __future__ import annotations

import argparse
import sys


def add_job_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--job", metavar="JOB",
                        help="follow every rank of this job (name or torchrun run id) on --hosts")  # fmt: skip
    parser.add_argument("--hosts", metavar="HOSTS",
                        help="with --job: a,b,c, a hostfile (or @FILE), or 'slurm' (the job's node list)")  # fmt: skip


def run_job(args: argparse.Namespace) -> int:
    from nnwatch.sources.base import SourceError
    from nnwatch.sources.job_fanout import JobFanout, parse_hosts

    if not args.hosts:
        print("nnwatch attach --job: name the hosts with --hosts (a,b,c, a hostfile or 'slurm')",
              file=sys.stderr)  # fmt: skip
        return 2
    try:
        hosts = parse_hosts(args.hosts)
    except SourceError as exc:
        print(f"nnwatch attach: {exc}", file=sys.stderr)
        return 1
    from nnwatch.cli._config import ssh_options_for as ssh_options

    # each host: the flags over the config file's table for it
    fanout = JobFanout(args.job, hosts, options_for=lambda host: ssh_options(args, host))
    try:
        from nnwatch.tui.job_app import JobApp

        while True:
            rank = JobApp(fanout, theme=getattr(args, "theme", None)).run()
            if rank is None:
                return 0
            code = _open_rank(fanout, int(rank), args)
            if code:
                return code
    finally:
        fanout.close()


def _open_rank(fanout: object, rank: int, args: argparse.Namespace) -> int:
    """Rank ``rank``'s full dashboard over its host's ssh connection; 0 to go back to the job."""
    from nnwatch.sources.base import SourceError
    from nnwatch.sources.remote import RemoteSource
    from nnwatch.tui.launch import run_monitor

    host, run_dir = fanout.where.get(rank, ("", ""))  # type: ignore[attr-defined]
    link = fanout.link_for(host)  # type: ignore[attr-defined]
    if link is None or not run_dir:
        return 0
    from nnwatch.cli._config import ssh_options_for as ssh_options

    opts = ssh_options(args, host)
    ssh_args = [*opts["ssh_args"], "-S", str(link.control), "-o", "ControlMaster=no"]
    try:
        source = RemoteSource(host, run_dir, ssh=opts["ssh"], ssh_args=ssh_args,
                              remote_nnwatch=opts["remote_nnwatch"], remote_root=opts["remote_root"])  # fmt: skip
    except SourceError as exc:
        print(f"nnwatch attach: rank {rank}: {exc}", file=sys.stderr)
        return 0
    run_monitor(source, args, job_views=fanout.poll)  # type: ignore[attr-defined]
    return 0
