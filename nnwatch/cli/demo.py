"""``nnwatch demo NAME``: a real training run with a real problem, live in the monitor, in one command.

A new user should see nnwatch catch a pathology within a minute, without writing a training script.
The demos are the standalone scripts in ``demos/`` (installed as ``nnwatch.demos``, so the command
works from a wheel too). This command starts one in a subprocess, in its own process group, waits
for it to register, and opens the monitor on it. Quitting the monitor stops the trainer (the
``stop`` command, then SIGTERM, then SIGKILL) and removes its run directory and registry entry, so
nothing is left behind, unless a snapshot was taken while watching (``s``, or an automatic one):
that run is kept and the command says where. ``--keep`` keeps every run for ``nnwatch open`` and
``nnwatch replay``.
``--headless`` runs without a screen and prints one line per finding, for CI and scripts.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from nnwatch.sources.demo_trainer import (
    POLL,
    Demo,
    DemoError,
    Trainer,
    demos_dir,
    find_demos,
    ordered,
)

COMMAND = "demo"
HELP = "watch a real training run go wrong (and fix it) in one command; --list describes the demos"

MONITOR_DELAY = 0.05  # seconds between steps with the monitor: fast, but a person can follow
HEADLESS_STEPS = 300  # enough for every demo to show its problem (and for healthy to show none)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    from nnwatch.tui.launch import add_monitor_arguments

    parser.add_argument("name", nargs="?", metavar="NAME", help="which demo (see --list)")
    parser.add_argument("--list", action="store_true", help="describe each demo and exit")
    parser.add_argument(
        "--headless",
        action="store_true",
        help="no monitor: print each finding on its own line (kind, step, layer), for CI",
    )
    parser.add_argument(
        "--steps",
        type=int,
        default=None,
        help=f"training steps (default: the demo's own with the monitor, {HEADLESS_STEPS} headless)",
    )
    parser.add_argument(
        "--delay",
        type=float,
        default=None,
        help=f"seconds between steps (default: {MONITOR_DELAY} with the monitor, 0 headless)",
    )
    parser.add_argument("--seed", type=int, default=0, help="random seed of the demo (default 0)")
    parser.add_argument(
        "--keep",
        action="store_true",
        help="keep the run directory afterwards (for `nnwatch open` or `nnwatch replay`)",
    )
    add_monitor_arguments(parser)


@contextmanager
def cleanup_on_signals(cleanup: Callable[[], object], *, monitor: bool) -> Iterator[None]:
    """SIGTERM and SIGHUP (``kill``, a closed terminal): clean up, then exit at once.

    Raising SystemExit from the handler would unwind through Textual's event loop and can leave
    its input thread running, which holds the process open; so the handler does the whole job
    itself: stop the trainer, remove its files, give the terminal back (``monitor``), ``os._exit``.
    """
    saved = _terminal_state() if monitor else None

    def handler(signum: int, frame: Any) -> None:
        try:
            cleanup()
        finally:
            _restore_terminal(saved)
            os._exit(128 + signum)

    old = {sig: signal.signal(sig, handler) for sig in (signal.SIGTERM, signal.SIGHUP)}
    try:
        yield
    finally:
        for sig, h in old.items():
            signal.signal(sig, h)


def _terminal_state() -> list[Any] | None:
    try:
        import termios

        return termios.tcgetattr(sys.stdin.fileno()) if sys.stdin.isatty() else None
    except (ImportError, OSError, ValueError):
        return None


def _restore_terminal(saved: list[Any] | None) -> None:
    """Leave the monitor's alternate screen and raw mode, as Textual would on a normal exit."""
    if saved is None:
        return
    try:
        import termios

        err = sys.__stderr__
        if err is not None:
            err.write("\x1b[?1000l\x1b[?1003l\x1b[?1006l\x1b[?1015l\x1b[?2004l\x1b[?1049l\x1b[?25h")
            err.flush()
        termios.tcsetattr(sys.stdin.fileno(), termios.TCSANOW, saved)
    except Exception:  # noqa: BLE001 - the terminal may be gone (SIGHUP); exiting matters more
        pass


# ----------------------------------------------------------------------------------------------
def finding_line(event: Mapping[str, Any]) -> str:
    """One finding as one line: kind (the vocabulary's spelling), step, layer, then what and the
    fix, in the words of its line (an event, or the dict of its line)."""
    layer = event.get("layer") or "-"
    text = str(event.get("summary") or event.get("message") or "")
    if event.get("remedy"):
        text += f" Fix: {event['remedy']}"
    return f"{event.get('kind')} step={event.get('step')} layer={layer} | {' '.join(text.split())}"


def follow_headless(trainer: Trainer) -> int:
    """Print each finding as it is written to events.jsonl, until the trainer exits."""
    from nnwatch.store.event_tail import EventTail
    from nnwatch.store.events import FindingEvent

    assert trainer.info is not None, "follow a trainer after it registered"
    tail = EventTail(Path(trainer.info.run_dir) / "events.jsonl")
    count = 0

    def drain() -> None:
        nonlocal count
        while True:
            events = tail.read_events()
            if not events:
                return
            for ev in events:
                if isinstance(ev, FindingEvent):
                    print(finding_line(ev), flush=True)
                    count += 1

    while trainer.alive:
        drain()
        time.sleep(POLL)
    drain()
    return count


def list_demos(demos: dict[str, Demo]) -> None:
    for demo in ordered(demos):
        print(f"{demo.name:<13} {demo.summary}")
        if demo.story:
            import textwrap

            print(
                textwrap.fill(
                    demo.story, width=96, initial_indent=" " * 14, subsequent_indent=" " * 14
                )
            )
    print("\nRun one with `nnwatch demo NAME` (live monitor) or `nnwatch demo NAME --headless`.")


def run(args: argparse.Namespace) -> int:
    demo = _chosen(args)
    if isinstance(demo, int):
        return demo
    kept, status, snaps = _train(demo, args)
    _tell_kept(demo, kept, snaps, args.keep)
    return status


def _chosen(args: argparse.Namespace) -> Demo | int:
    """The demo asked for, or the exit status when there is none to run (said why)."""
    demos = find_demos()
    if not demos:
        print(
            f"nnwatch demo: no demo scripts found in {demos_dir()}; reinstall nnwatch",
            file=sys.stderr,
        )
        return 2
    if args.list or not args.name:
        list_demos(demos)
        return 0 if args.list else 2
    import importlib.util

    if importlib.util.find_spec("torch") is None:  # the demo trains a real model in a child
        raise ModuleNotFoundError("the demos train with torch", name="torch")
    demo = demos.get(args.name)
    if demo is None:
        print(
            f"nnwatch demo: no demo called {args.name!r}; choose one of: "
            + ", ".join(d.name for d in ordered(demos)),
            file=sys.stderr,
        )
        return 2
    if not args.headless and not sys.stdout.isatty() and not os.environ.get("NNWATCH_FORCE_TUI"):
        print(
            "nnwatch demo: the monitor needs a terminal (stdout is not one); "
            "add --headless to print the findings as text",
            file=sys.stderr,
        )
        return 1
    if args.steps is not None and args.steps < 1:
        print("nnwatch demo: --steps must be at least 1", file=sys.stderr)
        return 2
    return demo


def _train(demo: Demo, args: argparse.Namespace) -> tuple[str | None, int, list[Path]]:
    """Run the demo's trainer, headless or under the monitor; (where the run is kept, the exit
    status, its snapshots)."""
    steps = args.steps if args.steps is not None or not args.headless else HEADLESS_STEPS
    delay = args.delay if args.delay is not None else (0.0 if args.headless else MONITOR_DELAY)
    started: list[Trainer] = []

    def cleanup() -> str | None:
        return started[0].finish(args.keep) if started else None

    def abandon() -> str | None:
        # a closed terminal or a kill: nobody would read where a kept run is, so remove it all
        if started:
            started[0].keep_snapshots = False
        return cleanup()

    kept: str | None = None
    status = 0
    with cleanup_on_signals(abandon, monitor=not args.headless):
        try:
            started.append(Trainer(demo, steps, max(0.0, delay), args.seed))
            trainer = started[0]
            trainer.wait_registered()
            if args.headless:
                status = _headless(trainer)
            else:
                # a snapshot taken while watching is worth keeping: `nnwatch show` reads it later
                trainer.keep_snapshots = True
                status = _monitor(trainer, args)
        except DemoError as exc:
            print(f"nnwatch demo: {exc}", file=sys.stderr)
            status = 1
        except KeyboardInterrupt:
            status = 130
        finally:
            kept = cleanup()
    snaps = started[0].snapshots() if started and kept else []
    return kept, status, snaps


def _tell_kept(demo: Demo, kept: str | None, snaps: list[Path], keep: bool) -> None:
    """Where a kept run is, and what reads it."""
    if kept and snaps and not keep:
        print(
            f"nnwatch demo: a snapshot was taken during the run, so the run is kept in {kept}\n"
            f"  its batch, sample by sample: nnwatch show {snaps[-1]}\n"
            f"  the whole run: nnwatch open {kept}  (remove it with: rm -r {kept})",
            file=sys.stderr,
        )
    elif kept:
        print(f"nnwatch demo: the run is kept in {kept}", file=sys.stderr)
        if snaps:
            print(f"  its newest snapshot: nnwatch show {snaps[-1]}", file=sys.stderr)
        if demo.name == "nan_log":
            print(
                f"  find the op and line of the NaN: nnwatch replay {kept} "
                "--model nnwatch.demos.nan_log:make --anomaly",
                file=sys.stderr,
            )


def _headless(trainer: Trainer) -> int:
    count = follow_headless(trainer)
    rc = trainer.proc.returncode
    status = 0
    if rc not in (0, None):
        print(
            f"nnwatch demo: the {trainer.demo.name} trainer failed (status {rc}):\n"
            + trainer.output_tail(),
            file=sys.stderr,
        )
        status = 1
    print(f"nnwatch demo: {trainer.demo.name}: {count} finding(s)", file=sys.stderr)
    return status


def _monitor(trainer: Trainer, args: argparse.Namespace) -> int:
    from nnwatch.sources.base import SourceError
    from nnwatch.sources.live import LiveSource
    from nnwatch.tui.launch import run_monitor

    assert trainer.info is not None, "monitor a trainer after it registered"
    try:
        source = LiveSource.from_info(trainer.info)
    except SourceError as exc:
        raise DemoError(str(exc)) from None
    return run_monitor(source, args)
