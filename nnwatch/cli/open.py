"""``nnwatch open RUN_DIR``: the dashboard on a finished or crashed run, read from its log.

Left/Right (Shift: 10x) move a step cursor through the history, Home jumps to the first step,
End back to the last; the layers pane shows the per-layer stats sampled at the cursor.
``--compare OTHER`` overlays another run (a name or directory; followed live if it is live) on
the loss and grad charts, as ``o`` does in the monitor.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

COMMAND = "open"
HELP = "open a finished or crashed run from its log, with a step cursor to scrub through history"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    from nnwatch.cli._options import RUN, add_root_argument
    from nnwatch.tui.launch import add_monitor_arguments

    parser.add_argument(
        "run_dir", metavar=RUN, help="a run directory, or a run name from `nnwatch ls --all`"
    )
    add_root_argument(parser)
    add_monitor_arguments(parser)


def resolve_run_dir(spec: str) -> Path | None:
    """A directory as given, else the run directory of a run named ``spec`` in ``ls --all``."""
    path = Path(spec).expanduser()
    if path.is_dir():
        return path
    from nnwatch.store.paths import default_root
    from nnwatch.store.registry import list_runs, recorded_runs

    root = default_root()
    runs = list_runs(root) + recorded_runs(root) + recorded_runs(root / "runs")
    for r in runs:
        if spec in (r.name, Path(r.run_dir).name):
            return Path(r.run_dir)
    for r in runs:
        if Path(r.run_dir).name.startswith(spec):
            return Path(r.run_dir)
    return None


def run(args: argparse.Namespace) -> int:
    from nnwatch.sources.base import SourceError
    from nnwatch.sources.recorded import RecordedSource
    from nnwatch.tui.launch import run_monitor

    run_dir = resolve_run_dir(args.run_dir)
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
    return run_monitor(source, args)
