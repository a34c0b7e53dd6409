"""What ``nnwatch``, ``nnwatch attach`` and ``nnwatch open`` share: the monitor's command-line
options and the one function that runs the dashboard on a source and turns failures into plain
words. Textual is imported only inside ``run_monitor``, so building the parser stays cheap."""

from __future__ import annotations

import argparse
import os
import sys
from typing import Any

from nnwatch.sources.base import RunSource, SourceError
from nnwatch.tui.run_sources import gpu_uuids_for, open_run_spec

__all__ = ["add_monitor_arguments", "gpu_uuids_for", "run_monitor"]


def add_monitor_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--fps", type=float, default=None, help="redraws per second (default 3; 2-4 is comfortable)"
    )
    parser.add_argument(
        "--no-nvml", action="store_true", help="do not read GPUs through NVML (host CPU/RAM only)"
    )
    parser.add_argument(
        "--keys",
        default=None,
        metavar="ID=KEY,...",
        help="remap keys by binding id, e.g. snapshot=S,quit=ctrl+q (see ? in the monitor)",
    )
    parser.add_argument(
        "--theme", default=None, help="a Textual theme, e.g. nord, gruvbox, textual-light"
    )
    parser.add_argument(
        "--compare",
        default=None,
        metavar="RUN",
        help="overlay another run on the charts (a run name or directory; a live one is followed "
        "live); in the monitor, o picks one, x drops it, O swaps the two",
    )


def run_monitor(source: RunSource, args: argparse.Namespace, **app_kwargs: Any) -> int:
    """Run the dashboard until the user quits; 0 on ``q``, 1 with a message on a usage error."""
    from nnwatch.tui.app import DEFAULT_FPS, NNWatchApp, load_keymap  # lazy: pulls textual

    if not sys.stdout.isatty() and not os.environ.get("NNWATCH_FORCE_TUI"):
        source.close()
        print(
            "nnwatch: the monitor needs a terminal (stdout is not one); "
            "`nnwatch ls` prints the runs as text and `nnwatch ctl` steers them from scripts",
            file=sys.stderr,
        )
        return 1
    try:
        keymap = load_keymap(getattr(args, "keys", None))
    except ValueError as exc:
        source.close()
        print(f"nnwatch: {exc}", file=sys.stderr)
        return 2
    try:  # textual-image asks the terminal about itself on import: only possible before Textual
        import textual_image.widget  # noqa: F401
    except Exception:  # noqa: BLE001 - optional; the inspector draws half blocks without it
        pass
    fps = getattr(args, "fps", None) or DEFAULT_FPS
    compare = None
    if getattr(args, "compare", None):
        try:
            compare = open_run_spec(args.compare)
        except SourceError as exc:
            source.close()
            print(f"nnwatch: --compare: {exc}", file=sys.stderr)
            return 1
    try:
        app = NNWatchApp(
            source,
            fps=fps,
            hardware="psutil" if getattr(args, "no_nvml", False) else "auto",
            keymap=keymap,
            theme=getattr(args, "theme", None),
            compare=compare,
            **app_kwargs,
        )
    except ValueError as exc:
        source.close()
        if compare is not None:
            compare.close()
        print(f"nnwatch: {exc}", file=sys.stderr)
        return 2
    result = app.run()
    return int(result or 0)
