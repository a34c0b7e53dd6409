"""How the training program is ending: cleanly, by an uncaught exception, by Ctrl-C or by exit(N).

A run left open when the interpreter exits is closed by an ``atexit`` handler, which by itself
cannot tell a clean end from a crash. Two small, chained hooks tell it: ``sys.excepthook`` sees an
uncaught exception (the ``OverflowError`` in the user's loop, a failed ``torch.save``) and
``sys.exit`` sees the status a framework exits with (Hydra catches a job's exception, prints it and
calls ``sys.exit(1)``, so no exception reaches the interpreter). Both call what was there before.

SIGTERM (a scheduler's time limit, preemption, torchrun tearing a job down) is told apart from a
SIGKILL or the OOM killer, which leave no word at all: a handler notes it and then does what was
there before, so the program's own semantics stay. The user's own Python handler is called; the
default action (termination) is taken again once the open runs wrote ``end.json`` ("interrupted",
with ``"signal": "SIGTERM"``), or after ``TERM_CLOSE_S`` at most (a close that waits on a collective
whose peer is gone); an ignored SIGTERM stays ignored (nothing is installed). A main
thread blocked in C (a collective, a data loader) would run a Python handler late, so a thread
woken by the signal's wakeup fd does the same at once.

Not seen: ``raise SystemExit(N)`` written out by hand (the interpreter handles it without any
hook), ``os._exit`` and SIGKILL (no ``atexit`` runs at all: readers then find the process gone
without an ``end.json`` and report the run as crashed, without a word from it).
"""

from __future__ import annotations

import atexit
import os
import signal
import sys
import threading
import time
import traceback
from dataclasses import asdict, dataclass
from types import TracebackType
from typing import Any

from nnwatch.store.events import RunEnded


@dataclass(frozen=True)
class Ending:
    """The run's final status and why: what ``end.json`` and the events say."""

    status: str  # "finished", "crashed" or "interrupted"
    reason: str = ""
    exception: str | None = None  # the exception's type name
    message: str | None = None
    exit_code: int | None = None
    signal: str | None = None  # "SIGTERM": ended by that signal

    def to_dict(self) -> dict[str, Any]:
        """The fields of ``end.json``: the ``run_ended`` event's, written by that event."""
        out = RunEnded(step=0, **asdict(self)).to_json()
        del out["type"], out["step"]
        return out


FINISHED = Ending("finished")
#: At most this long between SIGTERM and the default action while the open runs write their end.
TERM_CLOSE_S = 2.0
#: How a SIGTERM ends a run: from outside, not by the program's own failure.
SIGTERM_ENDING = Ending(
    "interrupted",
    "SIGTERM (signal 15): terminated from outside (a scheduler's limit or preemption, the "
    "launcher, or kill)",
    signal="SIGTERM",
)


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
        #: weak references to the closing methods of the open watches (closed before a SIGTERM's
        #: default action ends the process, which runs no ``atexit``)
        self._closers: list[Any] = []
        #: weak references to the open runs' ``note_ending``: a SIGTERM's first act is to say how
        #: the process ends (``exit.json``), before a close that may not finish in time
        self._noters: list[Any] = []
        self._prev_sigterm: Any = None
        self._term_lock = threading.Lock()
        self._terminating = False
        self._wakeup: tuple[int, int] | None = None  # the wakeup pipe, when this process made it

    def at_exit(self, ref: Any) -> None:
        """Close a watch (``ref``: a weak reference to its closing method) when the process
        ends: at interpreter exit, and before a SIGTERM's default action."""
        atexit.register(close_at_exit, ref)
        with self._lock:
            self._closers = [r for r in self._closers if r() is not None] + [ref]

    def on_terminate(self, ref: Any) -> None:
        """Call ``ref()`` (a weak reference to a run's ``note_ending(ending)``) first thing when a
        SIGTERM ends the process."""
        with self._lock:
            self._noters = [r for r in self._noters if r() is not None] + [ref]

    def install(self) -> None:
        with self._lock:
            if self._installed:
                return
            self._installed = True
            self._install_sigterm()
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

    def _install_sigterm(self) -> None:
        """Chain a SIGTERM handler in front of what is there; never where it cannot be chained
        (not the main thread, an ignored signal, a handler installed outside Python)."""
        try:
            if threading.current_thread() is not threading.main_thread():
                return
            prev = signal.getsignal(signal.SIGTERM)
            if prev is None or prev == signal.SIG_IGN:
                return
            self._prev_sigterm = prev
            signal.signal(signal.SIGTERM, self._on_sigterm)
            if prev == signal.SIG_DFL:
                self._watch_wakeup_fd()
            os.register_at_fork(after_in_child=self._forget_in_child)
        except (ValueError, OSError, RuntimeError):  # an embedded interpreter, a closed fd...
            pass

    def _forget_in_child(self) -> None:
        """A forked child (a DataLoader worker) gets SIGTERM as it did before: it has no run of
        its own to close, and must not write into the parent's wakeup pipe (the parent's thread
        would take the child's SIGTERM for its own)."""
        try:
            if self._wakeup is not None:
                signal.set_wakeup_fd(-1)
                for fd in self._wakeup:
                    os.close(fd)
                self._wakeup = None
            if signal.getsignal(signal.SIGTERM) == self._on_sigterm:
                signal.signal(signal.SIGTERM, self._prev_sigterm)
        except (ValueError, OSError):
            pass
        self._closers = []
        self._noters = []

    def _watch_wakeup_fd(self) -> None:
        """A thread that learns of SIGTERM at once, even while the main thread is blocked in C
        (only when no one else uses the wakeup fd: asyncio's loop does)."""
        r, w = os.pipe()
        os.set_blocking(w, False)
        old = signal.set_wakeup_fd(w, warn_on_full_buffer=False)
        if old != -1:
            signal.set_wakeup_fd(old)
            os.close(r)
            os.close(w)
            return
        self._wakeup = (r, w)

        def wait() -> None:
            while True:
                try:
                    got = os.read(r, 64)
                except OSError:
                    return
                if not got:
                    return
                if signal.SIGTERM in got and signal.getsignal(signal.SIGTERM) == self._on_sigterm:
                    self._terminate(signal.SIGTERM)

        threading.Thread(target=wait, name="nnwatch-sigterm", daemon=True).start()

    def _on_sigterm(self, signum: int, frame: Any) -> None:
        prev = self._prev_sigterm
        if callable(prev):  # the program's own handler decides what SIGTERM does
            self.note(Ending(
                "interrupted", SIGTERM_ENDING.reason + "; the program's own handler ran",
                signal="SIGTERM",
            ))  # fmt: skip
            prev(signum, frame)
            return
        self._terminate(signum)

    def _terminate(self, signum: int) -> None:
        """The default action of SIGTERM, after the open runs wrote how they ended."""
        with self._term_lock:
            if self._terminating:
                return
            self._terminating = True
        self.note(SIGTERM_ENDING)
        for ref in list(self._noters):
            method = ref()
            if method is not None:
                try:
                    method(self.final())
                except Exception:  # noqa: BLE001 - the close below still runs
                    pass

        def close_all() -> None:
            for ref in list(self._closers):
                close_at_exit(ref)

        # bounded: a close that waits on a collective with a rank gone (torchrun's teardown)
        # must not keep the process alive much longer than SIGTERM alone would
        closing = threading.Thread(target=close_all, name="nnwatch-sigterm-close", daemon=True)
        closing.start()
        closing.join(TERM_CLOSE_S)
        _default_action(signum)

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


def taken_over(seen_at_start: object, same_model: bool = True) -> Ending:
    """How an earlier, still open watch of a model (or under the same name) ends when a new
    watch takes over.

    "interrupted" when Ctrl-C stopped its cell: the shell's last exception is a
    KeyboardInterrupt that was not there yet when that watch started (``seen_at_start``, from
    :func:`last_exception`); else "finished".
    """
    last = last_exception()
    if isinstance(last, KeyboardInterrupt) and last is not seen_at_start:
        return Ending("interrupted", "KeyboardInterrupt (Ctrl-C) stopped the cell that trained")
    what = "of the same model" if same_model else "under the same name"
    return Ending("finished", f"a new watch {what} took over")


def _default_action(signum: int) -> None:
    """Die of ``signum`` as if no handler had been there (the parent sees the same signal), from
    any thread: the disposition is reset in libc, then the signal sent again."""
    try:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        libc.signal.restype = ctypes.c_void_p
        libc.signal.argtypes = (ctypes.c_int, ctypes.c_void_p)
        libc.signal(signum, None)  # SIG_DFL is 0
        os.kill(os.getpid(), signum)
        time.sleep(5)  # delivery is asynchronous; the process ends here
    except Exception:  # noqa: BLE001
        pass
    os._exit(128 + signum)


def close_at_exit(ref: Any) -> None:
    """The ``atexit`` handler: ``ref`` is a weak reference to a watch's closing method."""
    method = ref()
    if method is not None:
        try:
            method()
        except Exception:  # noqa: BLE001
            pass
