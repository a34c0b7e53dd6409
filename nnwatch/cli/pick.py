"""``nnwatch`` (no arguments) or ``nnwatch pick``: choose a run from a list, then watch it.

Live runs open the live dashboard (as ``nnwatch attach``), finished or crashed ones the recorded
dashboard with its step cursor (as ``nnwatch open``). ``nnwatch HOST`` (or ``pick --host HOST``)
lists the runs on another machine through the user's own ssh; a live one opens as
``nnwatch attach HOST:RUN`` would, and without a terminal the list is printed as text.
"""

from __future__ import annotations

import argparse
import os
import sys
from typing import Any

COMMAND = "pick"
HELP = "choose a live or recent run from a list and open the dashboard on it (the default)"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    from nnwatch.cli.attach import add_ssh_arguments
    from nnwatch.tui.launch import add_monitor_arguments

    parser.add_argument(
        "--host", metavar="HOST", help="list the runs on HOST over ssh (`nnwatch HOST` for short)"
    )
    add_ssh_arguments(parser, "with --host, ")
    from nnwatch.cli._options import add_root_argument

    add_root_argument(parser)
    add_monitor_arguments(parser)


def source_for(info: Any) -> tuple[Any, list[str]]:
    """The source for a picked run: live through its files and socket, else its recorded log."""
    from nnwatch.tui.picker import source_for as open_listed

    return open_listed(info)


def _terminal() -> bool:
    return sys.stdout.isatty() or bool(os.environ.get("NNWATCH_FORCE_TUI"))


def run(args: argparse.Namespace) -> int:
    from nnwatch.sources.base import SourceError
    from nnwatch.tui.launch import run_monitor

    if args.host:
        return _run_remote(args)
    from nnwatch.tui.picker import RunPickerApp

    if not _terminal():
        print(
            "nnwatch: the run picker needs a terminal; `nnwatch ls --all` lists the runs as text",
            file=sys.stderr,
        )
        return 1
    info = RunPickerApp().run()
    if info is None:
        return 0
    try:
        source, uuids = source_for(info)
    except SourceError as exc:
        print(f"nnwatch: {exc}", file=sys.stderr)
        return 1
    return run_monitor(source, args, gpu_uuids=uuids or None)


def _run_remote(args: argparse.Namespace) -> int:
    """The runs on ``args.host``: a picker in a terminal, else the list as text."""
    from nnwatch.cli.attach import ssh_options
    from nnwatch.sources.base import SourceError
    from nnwatch.sources.remote import RemoteRun, RemoteSource, remote_runs

    host, opts = args.host, ssh_options(args, args.host)

    def lister() -> list[RemoteRun]:
        rows = remote_runs(host, finished=True, **opts)
        return [RemoteRun.from_row(r, host) for r in rows]

    if not _terminal():
        try:
            runs = lister()
        except SourceError as exc:
            print(f"nnwatch: {exc}", file=sys.stderr)
            return 1
        for line in remote_table(runs, host):
            print(line)
        return 0
    from nnwatch.tui.launch import run_monitor
    from nnwatch.tui.picker import RunPickerApp

    picked = RunPickerApp(
        lister=lister, refresh_s=5.0, title=f"nnwatch · runs on {host} (Enter opens one)"
    ).run()
    if picked is None:
        return 0
    if not picked.live:
        return _open_a_copy(picked, host, opts, args)
    try:
        source = RemoteSource(host, picked.run_dir, **opts)
    except SourceError as exc:
        print(f"nnwatch: {exc}", file=sys.stderr)
        return 1
    return run_monitor(source, args)


def remote_table(runs: list[Any], host: str) -> list[str]:
    """The runs on a host as lines of text, live ones first, and how to open one."""
    if not runs:
        return [f"no runs on {host} (`nnwatch ls --all` there lists none)"]
    runs = sorted(runs, key=lambda r: (not r.live, r.age))
    lines = [f"{'name':24} {'state':9} {'step':>10} {'rank':>5} {'pid':>8}  directory"]
    for r in runs:
        step = "-" if r.step is None else str(r.step)
        lines.append(
            f"{r.name:24} {r.state:9} {step:>10} {r.rank:>5} {r.pid:>8}  {host}:{r.run_dir}"
        )
    live = [r for r in runs if r.live]
    if live:
        lines.append(f"follow one: nnwatch attach {host}:{live[0].name}")
    return lines


def _open_a_copy(picked: Any, host: str, opts: dict[str, Any], args: argparse.Namespace) -> int:
    """A finished run on ``host``: copied here whole (checked), then opened like a local one."""
    from nnwatch.sources.base import SourceError
    from nnwatch.sources.pull import PullError, PullRequest, describe, pull
    from nnwatch.sources.recorded import RecordedSource
    from nnwatch.tui.launch import run_monitor

    print(f"nnwatch: {picked.name} on {host} has {picked.state}; copying its files here…")
    try:
        got = pull(PullRequest(
            host, run=picked.run_dir, whole=True, ssh=opts["ssh"], ssh_args=tuple(opts["ssh_args"]),
            remote_nnwatch=opts["remote_nnwatch"], root=opts["remote_root"],
        ))  # fmt: skip
    except PullError as exc:
        print(
            f"nnwatch: {exc}; its files stay in {host}:{picked.run_dir}",
            file=sys.stderr,
        )
        return 1
    print("\n".join(describe(got, host)))
    try:
        source = RecordedSource(got.path)
    except SourceError as exc:
        print(f"nnwatch: the copy in {got.path} cannot be opened: {exc}", file=sys.stderr)
        return 1
    return run_monitor(source, args)

