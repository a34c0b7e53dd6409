"""``nnwatch attach RUN``: the live dashboard on a running trainer.

RUN is a run name (or the start of one), a pid, or a run directory, as ``nnwatch ls`` shows them.
``--connect SOCKET`` follows a run through a forwarded command socket instead (``ssh -L``).
Quitting the monitor never stops training, and a pause it asked for lifts when it goes.
"""

from __future__ import annotations

import argparse
import sys

COMMAND = "attach"
HELP = "open the live dashboard on a running trainer (by name, pid or run directory)"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    from nnwatch.tui.launch import add_monitor_arguments

    parser.add_argument("run", metavar="RUN", nargs="?", help="run name, pid or run directory")
    parser.add_argument("--connect", metavar="SOCKET", help="follow the run through this socket")
    add_monitor_arguments(parser)


def open_live(spec: str | None, connect: str | None) -> tuple[object, list[str]]:
    """The source for RUN (or the socket), and the uuid of the run's GPU where the registry knows it."""
    from nnwatch.sources.live import ConnectedSource, LiveSource
    from nnwatch.tui.launch import gpu_uuids_for

    if connect:
        return ConnectedSource(connect), []
    from nnwatch.channel.registry import find_runs

    assert spec is not None
    source = LiveSource.find(spec)
    runs = [r for r in find_runs(spec) if str(r.run_dir) == str(source.run_dir)]
    uuids = gpu_uuids_for(source.meta.device, list(runs[0].cuda_devices)) if runs else []
    return source, uuids


def run(args: argparse.Namespace) -> int:
    from nnwatch.sources.base import SourceError
    from nnwatch.tui.launch import run_monitor

    if not args.run and not args.connect:
        print(
            "nnwatch attach: name a run (see `nnwatch ls`) or give --connect SOCKET",
            file=sys.stderr,
        )
        return 2
    try:
        source, uuids = open_live(args.run, args.connect)
    except SourceError as exc:
        print(f"nnwatch attach: {exc}", file=sys.stderr)
        return 1
    return run_monitor(source, args, gpu_uuids=uuids or None)  # type: ignore[arg-type]
