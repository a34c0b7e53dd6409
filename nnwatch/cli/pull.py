"""``nnwatch pull HOST:RUN [STEP]``: copy a snapshot, or with ``--run`` a whole run, from another
machine to this one, through the user's own ``ssh`` and checked file by file.

The far host runs ``nnwatch pack`` (one ssh login: RUN is found there as ``nnwatch ls --all``
names it) and sends a tar framed by a header and a manifest of sha256s; every size and hash is
checked here before anything appears at the destination (``nnwatch.store.bundle``). STEP is the
snapshot of that step (``--nearest``: the closest one); without it, the newest snapshot. Files
land in ``./nnwatch-pulled/HOST/RUN`` (``--into DIR`` instead): a snapshot at
``RUN/snapshots/step-N`` (``nnwatch show`` and ``nnwatch replay`` take it), a run as a run
directory (``nnwatch open`` takes it). A live run is copied as its files stand while it writes.

Exit status: 0 pulled; 1 the host could not be reached or nnwatch there failed; 3 no such run
there; 4 no such snapshot; 5 the stream arrived damaged or cut short; 6 the files cannot be
written here (a full disk, permissions, the destination exists). Nothing is left at the
destination unless the status is 0.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

COMMAND = "pull"
HELP = "copy a snapshot (or a whole run) from another host over ssh, checked by sha256"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    from nnwatch.cli.attach import add_ssh_arguments
    from nnwatch.cli.pack import add_choice_arguments

    parser.add_argument(
        "run", metavar="HOST:RUN",
        help="the host and the run there (name or its start, pid or run directory; HOST: for the "
        "only run)",
    )  # fmt: skip
    add_choice_arguments(parser)
    parser.add_argument(
        "--into", metavar="DIR", type=Path, default=None,
        help="the local run directory to fill (default: ./nnwatch-pulled/HOST/RUN)",
    )  # fmt: skip
    parser.add_argument(
        "--force", action="store_true", help="replace what an earlier pull left at the destination"
    )
    add_ssh_arguments(parser)


def run(args: argparse.Namespace) -> int:
    from nnwatch.sources.pull import PullError, PullRequest, describe, pull, split_host_run

    remote = split_host_run(args.run)
    if remote is None:
        print(
            f"nnwatch pull: {args.run!r} names no host: write HOST:RUN (HOST: for the only run "
            "there)",
            file=sys.stderr,
        )
        return 2
    host, run_spec = remote
    from nnwatch.cli.attach import ssh_options

    opts = ssh_options(args, host)  # the flags over the config file's table for the host
    req = PullRequest(
        host=host, run=run_spec, step=args.step, nearest=args.nearest, whole=args.whole,
        into=args.into, force=args.force, ssh=opts["ssh"], ssh_args=tuple(opts["ssh_args"]),
        remote_nnwatch=opts["remote_nnwatch"], root=opts["remote_root"],
    )  # fmt: skip
    try:
        got = pull(req)
    except PullError as exc:
        print(f"nnwatch pull: {exc}", file=sys.stderr)
        return exc.code
    print("\n".join(describe(got, host)))
    return 0
