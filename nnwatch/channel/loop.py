"""The command socket's plumbing: one thread, one selector, non-blocking connections with budgets.

:class:`ConnectionLoop` binds the socket (mode 0600), accepts peers through the
:class:`~nnwatch.channel.admission.Doorman`, stops reading from a connection while it is over its
budget (:meth:`_throttle`; the client then waits on its own socket buffer, at no cost here), sends
replies queued from any thread without ever blocking, and closes connections. What a connection's
bytes mean is the subclass's business (:meth:`_read`); see :mod:`nnwatch.channel.server`.
"""

from __future__ import annotations

import collections
import errno
import logging
import os
import selectors
import socket
import stat
import threading
import time
from pathlib import Path

from nnwatch.channel.admission import Doorman, refuse
from nnwatch.channel.commands import encode_reply
from nnwatch.channel.connection import Connection
from nnwatch.channel.limits import Limits

log = logging.getLogger("nnwatch")


class ConnectionLoop:
    """Serve connections to the Unix socket at ``path`` from one daemon thread."""

    def __init__(self, path: Path, *, limits: Limits, max_connections: int) -> None:
        self.path = Path(path)
        if len(os.fsencode(self.path)) > 107:
            raise ValueError(
                f"the socket path {self.path} is longer than a Unix socket allows (107 bytes)"
            )
        self.limits = limits
        self.max_connections = max_connections
        self.uid = os.getuid()
        self.door = Doorman(self.uid, limits, time.monotonic())
        self.throttled = 0  # times a connection was not read for sending too much
        self.accepted = 0  # connections taken from the listen backlog (of this uid)
        self._conns: dict[int, Connection] = {}
        self._throttled: set[Connection] = set()
        self._dirty: collections.deque[Connection] = collections.deque()  # replies to send
        self._accept_at = 0.0  # the listener is not watched before this (accept budget)
        self._stop = False
        self._thread: threading.Thread | None = None
        self._listener: socket.socket | None = None
        self._sel: selectors.BaseSelector | None = None
        self._wake_r, self._wake_w = -1, -1

    @property
    def refused(self) -> int:
        """Peers of another uid, turned away."""
        return self.door.refused

    @property
    def evicted(self) -> int:
        """Connections closed to make room for a new one, or for sending only junk."""
        return self.door.evicted

    @property
    def timed_out(self) -> int:
        """Connections closed for silence."""
        return self.door.timed_out

    @property
    def connections(self) -> int:
        return len(self._conns)

    # -- what a subclass adds ----------------------------------------------------------------------
    def _read(self, conn: Connection, *, recv: bool = True) -> None:
        """``conn`` is readable (or, with ``recv`` False, its throttle has ended)."""
        raise NotImplementedError

    def _dropped(self, conn: Connection, *, lift_pause: bool) -> None:
        """``conn`` has just been closed (or handed over)."""

    def _tick(self) -> None:
        """Called about once a second by the server thread."""

    # -- lifecycle -------------------------------------------------------------------------------
    def start(self) -> None:
        """Bind the socket (mode 0600) and start serving. Raises OSError if the path is unusable."""
        if self._thread is not None:
            return
        _remove_stale_socket(self.path)
        listener = _listen_private(self.path)
        self._listener = listener
        self._wake_r, self._wake_w = os.pipe()
        os.set_blocking(self._wake_r, False)
        os.set_blocking(self._wake_w, False)
        self._sel = selectors.DefaultSelector()
        self._sel.register(listener, selectors.EVENT_READ, "listen")
        self._sel.register(self._wake_r, selectors.EVENT_READ, "wake")
        self._thread = threading.Thread(target=self._serve, name="nnwatch-commands", daemon=True)
        self._thread.start()

    def close(self) -> None:
        """Stop serving and remove the socket file."""
        if self._thread is None or self._stop:
            return
        self._stop = True
        self._wake()
        try:
            self._thread.join(timeout=5)
        except RuntimeError:
            pass  # start() was interrupted (a Ctrl-C) before the thread ran: it sees _stop and ends
        for conn in list(self._conns.values()):
            self._drop(conn, lift_pause=False)
        if self._sel is not None:
            self._sel.close()
        if self._listener is not None:
            self._listener.close()
        for fd in (self._wake_r, self._wake_w):
            try:
                os.close(fd)
            except OSError:
                pass
        try:
            os.unlink(self.path)
        except OSError:
            pass

    # -- the loop -----------------------------------------------------------------
    def _serve(self) -> None:
        assert self._sel is not None
        next_sweep = time.monotonic() + 1.0
        while not self._stop:
            now = time.monotonic()
            due = [next_sweep, *(c.throttled_until for c in self._throttled)]
            if self._accept_at:
                due.append(self._accept_at)
            try:
                events = self._sel.select(timeout=max(0.0, min(due) - now))
            except OSError:
                break
            for key, mask in events:
                try:
                    if key.data == "listen":
                        self._accept()
                    elif key.data == "wake":
                        self._drain_wake()
                    else:
                        if mask & selectors.EVENT_READ:
                            self._read(key.data)
                        if mask & selectors.EVENT_WRITE and not key.data.closed:
                            self._flush(key.data)
                except Exception as exc:  # noqa: BLE001 - one bad client must not end the server
                    log.debug("nnwatch: command socket error: %r", exc)
                    if isinstance(key.data, Connection):
                        self._drop(key.data)
            now = time.monotonic()
            for conn in [c for c in self._throttled if c.throttled_until <= now]:
                self._unthrottle(conn)
            if self._accept_at and now >= self._accept_at:
                self._accept_at = 0.0
                self._sel.register(self._listener, selectors.EVENT_READ, "listen")  # type: ignore[arg-type]
            while self._dirty:
                conn = self._dirty.popleft()
                if conn.outbox and not conn.closed:
                    self._flush(conn)
            if now >= next_sweep:
                next_sweep = now + 1.0
                for conn, why in self.door.expired(list(self._conns.values()), now):
                    self._goodbye(conn, why)
                self._tick()

    def _wake(self) -> None:
        try:
            os.write(self._wake_w, b"x")
        except OSError:
            pass  # pipe full (a wake-up is already pending) or closed

    def _drain_wake(self) -> None:
        try:
            while os.read(self._wake_r, 4096):
                pass
        except OSError:
            pass

    def _accept(self) -> None:
        """Accept what the accept budget allows; past it, stop watching the listener for a while
        (the backlog holds the rest, and a connecting client waits in the kernel)."""
        assert self._listener is not None and self._sel is not None
        while True:
            now = time.monotonic()
            wait = self.door.accept_wait(now)
            if wait > 0:
                self._accept_at = self.limits.wake_at(now, wait)
                self._sel.unregister(self._listener)
                return
            try:
                sock, _ = self._listener.accept()
            except (BlockingIOError, InterruptedError):
                self.door.accepts.tokens += 1  # nobody was waiting: give the token back
                return
            pid, why = self.door.peer(sock)
            if why:
                refuse(sock, why)
                continue
            if len(self._conns) >= self.max_connections:
                victim = self.door.victim(self._conns.values())
                if victim is None:
                    refuse(
                        sock, f"refused: too many monitors connected (limit {self.max_connections})"
                    )
                    continue
                self._goodbye(
                    victim, "closed to make room for a new monitor (too many connections)"
                )
            self.accepted += 1
            sock.setblocking(False)
            conn = Connection(sock, pid, self.limits, now)
            self._conns[conn.fd] = conn
            self._interest(conn)

    def _interest(self, conn: Connection) -> None:
        """Register what the selector should watch on ``conn``: reading unless it is throttled,
        writing while replies wait."""
        if self._sel is None or conn.closed:
            return
        mask = (0 if conn.throttled_until else selectors.EVENT_READ) | (
            selectors.EVENT_WRITE if conn.writing else 0
        )
        if mask == conn.mask:
            return
        if conn.mask and mask:
            self._sel.modify(conn.sock, mask, conn)
        elif mask:
            self._sel.register(conn.sock, mask, conn)
        else:
            self._sel.unregister(conn.sock)
        conn.mask = mask

    def _throttle(self, conn: Connection, now: float, wait: float) -> None:
        """Stop reading from ``conn`` for ``wait`` seconds (at least ``limits.min_pause``)."""
        conn.throttled_until = self.limits.wake_at(now, wait)
        self._throttled.add(conn)
        self.throttled += 1
        self._interest(conn)

    def _unthrottle(self, conn: Connection) -> None:
        self._throttled.discard(conn)
        conn.throttled_until = 0.0
        if conn.closed:
            return
        try:
            self._interest(conn)
            self._read(conn, recv=False)  # what is already buffered goes first
        except Exception as exc:  # noqa: BLE001
            log.debug("nnwatch: command socket error: %r", exc)
            self._drop(conn)

    # -- replies and closing ------------------------------------------------------
    def _send(self, conn: Connection, line: bytes) -> None:
        """Queue a line for ``conn`` from any thread; the server thread sends it."""
        if conn.closed:
            return
        conn.outbox.append(line)
        self._dirty.append(conn)
        if threading.current_thread() is not self._thread:
            self._wake()

    def _flush(self, conn: Connection) -> None:
        while conn.outbox:
            try:
                conn.outbuf += conn.outbox.popleft()
            except IndexError:
                break
        if len(conn.outbuf) > self.limits.max_outbox_bytes:
            self._drop(conn)
            return
        while conn.outbuf:
            try:
                sent = conn.sock.send(conn.outbuf)
            except (BlockingIOError, InterruptedError):
                break
            except OSError:
                self._drop(conn)
                return
            del conn.outbuf[:sent]
        want_write = bool(conn.outbuf)
        if want_write != conn.writing:
            conn.writing = want_write
            self._interest(conn)

    def _goodbye(self, conn: Connection, message: str) -> None:
        """Tell a client why it is being closed, after the replies it is still owed (best effort,
        never blocking), then close it."""
        if not conn.closed:
            conn.outbox.append(encode_reply(None, ok=False, error=message))
            self._flush(conn)
        self._drop(conn)

    def _drop(self, conn: Connection, *, lift_pause: bool = True, close: bool = True) -> None:
        if conn.closed:
            return
        conn.closed = True
        self._conns.pop(conn.fd, None)
        self._throttled.discard(conn)
        if self._sel is not None and conn.mask:
            try:
                self._sel.unregister(conn.sock)
            except (KeyError, ValueError, OSError):
                pass
        conn.mask = 0
        if close:
            try:
                conn.sock.close()
            except OSError:
                pass
        self._dropped(conn, lift_pause=lift_pause)


def _remove_stale_socket(path: Path) -> None:
    """Unlink a socket at ``path`` that nobody listens on (left behind by a dead process);
    refuse anything else there, or one another process still serves."""
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return
    if not stat.S_ISSOCK(st.st_mode):
        raise OSError(errno.EEXIST, f"{path} exists and is not a socket; not replacing it")
    probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    probe.settimeout(0.5)
    try:
        probe.connect(os.fspath(path))
    except OSError:
        os.unlink(path)  # nobody listens: left behind by a dead process
        return
    finally:
        probe.close()
    raise OSError(errno.EADDRINUSE, f"another process already serves {path}")


def _listen_private(path: Path) -> socket.socket:
    """A non-blocking listening socket bound at ``path`` with mode 0600 (never wider, even for
    the moment between bind and chmod)."""
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        old = os.umask(0o177)
        try:
            listener.bind(os.fspath(path))
        finally:
            os.umask(old)
        os.chmod(path, 0o600)
        listener.listen(16)
        listener.setblocking(False)
    except BaseException:
        listener.close()
        raise
    return listener
