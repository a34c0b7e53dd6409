"""How the training program is ending: cleanly, by an uncaught exception, by Ctrl-C or by exit(N).

A run left open when the interpreter exits is closed by an ``atexit`` handler, which by itself
cannot tell a clean end from a crash. Two small, chained hooks tell it: ``sys.excepthook`` sees an
uncaught exception (the ``OverflowError`` in the user's loop, a failed ``torch.save``) and
``sys.exit`` sees the status a framework exits with (Hydra catches a job's exception, prints it and
calls ``sys.exit(1)``, so no exception reaches the interpreter). Both call what was there before.

Not seen: ``raise SystemExit(N)`` written out by hand (the interpreter handles it without any
hook), ``os._exit`` and signals (no ``atexit`` runs at all: readers then find the process gone
without an ``end.json`` and report the run as crashed).
"""

from __future__ import annotations

import sys
import threading
import traceback
from dataclasses import dataclass
from types import TracebackType
from typing import Any


@dataclass(frozen=True)
class Ending:
    """The run's final status and why: what ``end.json`` and the events say."""

    status: str  # "finished", "crashed" or "interrupted"
    reason: str = ""
    exception: str | None = None  # the exception's type name
    message: str | None = None
    exit_code: int | None = None

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"status": self.status}
        if self.reason:
            out["reason"] = self.reason
        if self.exception is not None:
            out["exception"] = {"type": self.exception, "message": self.message or ""}
        if self.exit_code is not None:
            out["exit_code"] = self.exit_code
        return out


FINISHED = Ending("finished")


def from_exception(exc_type: type[BaseException] | None, exc: BaseException | None) -> Ending:
    """The ending that an exception leaving the training code means."""
    if exc_type is None:
        return FINISHED
    if issubclass(exc_type, KeyboardInterrupt):
        return Ending("interrupted", "KeyboardInterrupt (Ctrl-C)", exc_type.__name__, str(exc or ""))
    if issubclass(exc_type, SystemExit):
        return from_exit_code(exc.code if isinstance(exc, SystemExit) else None)
    message = str(exc) if exc is not None else ""
    reason = f"{exc_type.__name__}: {message}" if message else exc_type.__name__
    return Ending("crashed", f"uncaught {reason}", exc_type.__name__, message)


def from_exit_code(code: Any) -> Ending:
    """``sys.exit(code)``: 0 and None are a clean exit; anything else is a failure."""
    if code is None or code == 0:
        return Ending("finished", "exit status 0", exit_code=0)
    if isinstance(code, int):
        return Ending("crashed", f"the program exited with status {code}", exit_code=code)
    return Ending("crashed", f"the program exited with a message: {code}", message=str(code), exit_code=1)


class ExitObserver:
    """Process-wide: remembers the first sign of how the process is ending."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.ending: Ending | None = None
        self._installed = False
        self._prev_excepthook: Any = None
        self._prev_exit: Any = None
        self._hook: Any = None
        self._exit: Any = None

    def install(self) -> None:
        with self._lock:
            if self._installed:
                return
            self._installed = True
            self._prev_excepthook = sys.excepthook
            self._prev_exit = sys.exit
            observer = self

            def excepthook(
                exc_type: type[BaseException], exc: BaseException, tb: TracebackType | None
            ) -> None:
                observer.note(from_exception(exc_type, exc))
                prev = observer._prev_excepthook or sys.__excepthook__
                try:
                    prev(exc_type, exc, tb)
                except Exception:  # noqa: BLE001 - never lose the user's traceback
                    traceback.print_exception(exc_type, exc, tb)

            def exit(status: Any = None) -> Any:  # noqa: A001 - stands in for sys.exit
                if threading.current_thread() is threading.main_thread():
                    observer.note(from_exit_code(status))
                return observer._prev_exit(status)

            self._hook, self._exit = excepthook, exit
            sys.excepthook = excepthook
            sys.exit = exit

    def note(self, ending: Ending) -> None:
        """Keep the first ending seen: the exception that started it, not the exit after it."""
        if self.ending is None or (self.ending.status == "finished" and ending.status != "finished"):
            self.ending = ending

    def final(self) -> Ending:
        return self.ending or FINISHED


#: The one observer of this process.
OBSERVER = ExitObserver()


def last_exception() -> object:
    """The last exception an interactive shell showed (IPython keeps it in ``sys.last_value``)."""
    return getattr(sys, "last_value", None)


def taken_over(seen_at_start: object) -> Ending:
    """How an earlier, still open watch of a model ends when a new watch of it takes over.

    "interrupted" when Ctrl-C stopped its cell: the shell's last exception is a
    KeyboardInterrupt that was not there yet when that watch started (``seen_at_start``, from
    :func:`last_exception`); else "finished".
    """
    last = last_exception()
    if isinstance(last, KeyboardInterrupt) and last is not seen_at_start:
        return Ending("interrupted", "KeyboardInterrupt (Ctrl-C) stopped the cell that trained")
    return Ending("finished", "a new watch of the same model took over")


def close_at_exit(ref: Any) -> None:
    """The ``atexit`` handler: ``ref`` is a weak reference to a watch's closing method."""
    method = ref()
    if method is not None:
        try:
            method()
        except Exception:  # noqa: BLE001
            pass
