"""A dashboard whose terminal is gone ends.

When a terminal goes away, the kernel hangs its tty up and sends SIGHUP; but a monitor started
under ``nohup``, in the background of a shell that ignores SIGHUP, or whose session leader died
first, never gets the signal. It then ran on a deleted pty for ever: every read of the hung-up
tty returns at once with nothing, and Textual's input thread spun on it (a fifth of a core per
dashboard, with its ssh tunnels and connections kept open, and any pause it held renewed).

A hung-up tty refuses every ``ioctl`` (EIO), so ``isatty`` turns False on it: every
:data:`CHECK_S` seconds the app asks. When its terminal is gone, the app's descriptors 0-2 are
pointed at ``/dev/null`` (nothing may block or fail on the dead tty any more), what it holds is
closed at once (its sources: their connections, so a pause it held lifts, and its ssh tunnels),
and it exits; since Textual's own shutdown can wait for ever on an output queue whose writer
died on the dead tty, the process ends by itself after :data:`GRACE_S` if that exit hangs.
Headless apps (tests, ``serve``) have no terminal to lose and are left alone.
"""

from __future__ import annotations

import os
import sys
import threading
from collections.abc import Callable
from typing import Any

#: How often a dashboard checks that its terminal is still there.
CHECK_S = 2.0
#: How long a clean exit may take once the terminal is gone, before the process just ends.
GRACE_S = 5.0


def _ttys() -> list[int]:
    """The descriptors of stdin and stdout that are terminals now."""
    out = []
    for stream in (sys.__stdin__, sys.__stdout__):
        try:
            if stream is not None and os.isatty(stream.fileno()):
                out.append(stream.fileno())
        except (OSError, ValueError):
            pass
    return out


def terminal_lost(ttys: list[int]) -> bool:
    """Whether any of ``ttys`` (terminals when the app started) is no longer one: hung up, its
    pty deleted, or the descriptor closed."""
    return any(not os.isatty(fd) for fd in ttys)


def _to_devnull() -> None:
    try:
        null = os.open(os.devnull, os.O_RDWR)
    except OSError:
        return
    for fd in (0, 1, 2):
        try:
            os.dup2(null, fd)
        except OSError:
            pass
    os.close(null)


def watch_terminal(app: Any, close: Callable[[], None] | None = None) -> None:
    """From an app's ``on_mount``: once its terminal is gone, ``close()`` what the app holds and
    end the app (and the process, if Textual cannot finish its exit)."""
    if getattr(app, "is_headless", False):
        return
    ttys = _ttys()
    if not ttys:
        return  # not started in a terminal (a pipe, NNWATCH_FORCE_TUI): nothing to lose

    def check() -> None:
        if not terminal_lost(ttys):
            return
        _to_devnull()
        try:
            if close is not None:
                close()
        finally:
            from nnwatch.sources.ssh_child import close_all

            close_all()  # ssh tunnels and connections, whoever opened them
            threading.Timer(GRACE_S, os._exit, (1,)).start()
            app.exit(return_code=1)

    app.set_interval(CHECK_S, check, name="nnwatch-terminal")
