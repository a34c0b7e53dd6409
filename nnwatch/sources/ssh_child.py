"""The user's own ``ssh`` as a child process: how its command line starts, and how it ends.

An ``ssh -N -L`` outlives a monitor killed with ``kill -9`` (nothing of the monitor runs then),
orphaned, with the forward still open. On Linux the child asks the kernel to send it SIGTERM when
its parent goes (``PR_SET_PDEATHSIG``). The kernel means the *thread* that forked, so every such
child is forked from one long-lived daemon thread, which lives as long as the process does.
"""

from __future__ import annotations

import os
import queue
import shlex
import signal
import subprocess
import sys
import threading
import time
import weakref
from collections.abc import Callable, Sequence
from typing import Any, Protocol

PR_SET_PDEATHSIG = 1


def ssh_base(ssh: str, ssh_args: Sequence[str]) -> list[str]:
    """The ssh program (it may carry its own words, ``ssh -F cfg``) and the user's arguments."""
    return [*shlex.split(ssh), *ssh_args]


def stop_process(proc: subprocess.Popen[Any] | None) -> None:
    """End an ssh child: terminate, and kill it if it has not gone within 5 s."""
    if proc is not None and proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def _die_with_parent() -> Callable[[], None] | None:
    """A ``preexec_fn`` that ties the child's life to this process (Linux); None elsewhere."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        import ctypes

        prctl = ctypes.CDLL(None, use_errno=True).prctl  # looked up before the fork
    except (OSError, AttributeError):
        return None
    parent = os.getpid()

    def preexec() -> None:
        prctl(PR_SET_PDEATHSIG, int(signal.SIGTERM), 0, 0, 0)
        if os.getppid() != parent:  # the parent died before the prctl: go now
            os._exit(1)

    return preexec


class _Spawner:
    """One daemon thread that forks every tied child (see the module docstring)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._jobs: queue.Queue[tuple[Callable[[], Any], queue.Queue[Any]]] | None = None

    def run(self, make: Callable[[], Any]) -> Any:
        with self._lock:
            if self._jobs is None:
                self._jobs = queue.Queue()
                threading.Thread(target=self._serve, name="nnwatch-ssh-spawner", daemon=True).start()
            jobs = self._jobs
        reply: queue.Queue[Any] = queue.Queue(maxsize=1)
        jobs.put((make, reply))
        ok, value = reply.get()
        if not ok:
            raise value
        return value

    def _serve(self) -> None:
        assert self._jobs is not None
        while True:
            make, reply = self._jobs.get()
            try:
                reply.put((True, make()))
            except BaseException as exc:  # noqa: BLE001 - handed back to the caller
                reply.put((False, exc))


_SPAWNER = _Spawner()


def spawn_tied(cmd: Sequence[str], **popen: Any) -> subprocess.Popen[Any]:
    """``subprocess.Popen(cmd, **popen)`` for a child that must not outlive this process."""
    preexec = _die_with_parent()
    if preexec is None:
        return subprocess.Popen(list(cmd), **popen)
    return _SPAWNER.run(lambda: subprocess.Popen(list(cmd), preexec_fn=preexec, **popen))  # type: ignore[no-any-return]


def die_of(signum: int) -> None:
    """End this process by ``signum`` as if nothing had handled it (its parent sees the same
    signal): the disposition reset to the default, then the signal sent again."""
    try:
        signal.signal(signum, signal.SIG_DFL)
        os.kill(os.getpid(), signum)
        time.sleep(5)  # delivery is asynchronous; the process ends here
    except (OSError, ValueError):
        pass
    os._exit(128 + signum)


class Closable(Protocol):
    def close(self) -> None: ...


#: What holds private files beside its ssh children (a tunnel's directory, the job view's control
#: sockets): closed on a hang-up or termination signal, since no ``atexit`` runs then and a
#: closed terminal would leave them behind.
_OPEN: weakref.WeakSet[Any] = weakref.WeakSet()
_HANDLED: dict[int, Any] = {}


def close_on_signals(obj: Closable) -> None:
    """Close ``obj`` on SIGHUP or SIGTERM, then do what was there before (a handler of the
    program's own, or the default: die of the signal). Installed from the main thread only; an
    ignored signal stays ignored."""
    _OPEN.add(obj)
    if threading.current_thread() is not threading.main_thread():
        return
    for signum in (signal.SIGHUP, signal.SIGTERM):
        try:
            prev = signal.getsignal(signum)
            if signum in _HANDLED or prev is None or prev == signal.SIG_IGN or prev is _on_signal:
                continue
            signal.signal(signum, _on_signal)
            _HANDLED[signum] = prev
        except (ValueError, OSError):
            pass


def closed(obj: Closable) -> None:
    """``obj`` closed itself: nothing to do for it on a signal any more."""
    _OPEN.discard(obj)


def close_all() -> None:
    """Close every tunnel and connection still open (a dashboard whose terminal is gone)."""
    for obj in list(_OPEN):
        try:
            obj.close()
        except Exception:  # noqa: BLE001 - the rest must still be closed
            pass


def _on_signal(signum: int, frame: Any) -> None:
    close_all()
    prev = _HANDLED.get(signum)
    if callable(prev):
        prev(signum, frame)
    else:
        die_of(signum)
