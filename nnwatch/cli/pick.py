"""``nnwatch`` (no arguments) or ``nnwatch pick``: choose a run from a list, then watch it.

Live runs open the live dashboard (as ``nnwatch attach``), finished or crashed ones the recorded
dashboard with its step cursor (as ``nnwatch open``).
"""

from __future__ import annotations

import argparse
import os
import sys
from typing import Any

COMMAND = "pick"
HELP = "choose a live or recent run from a list and open the dashboard on it (the default)"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    from nnwatch.tui.launch import add_monitor_arguments

    add_monitor_arguments(parser)


def source_for(info: Any) -> tuple[Any, list[str]]:
    """The source for a picked run: live through its files and socket, else its recorded log."""
    from nnwatch.tui.picker import source_for as open_listed

    return open_listed(info)


def run(args: argparse.Namespace) -> int:
    from nnwatch.sources.base import SourceError
    from nnwatch.tui.launch import run_monitor
    from nnwatch.tui.picker import RunPickerApp

    if not sys.stdout.isatty() and not os.environ.get("NNWATCH_FORCE_TUI"):
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
