"""One client of the command socket, and a command waiting for the training thread to apply it.

A :class:`Connection` holds what the server keeps per client: its buffers, its budgets (see
:mod:`nnwatch.channel.limits`), whether it holds a pause, and what it has sent so far (a client
that has sent a valid request is a monitor; one that has sent only junk is the first to go).
Splitting its bytes into lines is here too, so that an endless line costs one search per read and
no per-line work at all.
"""

from __future__ import annotations

import collections
import socket
from collections.abc import Callable
from typing import Any

from nnwatch.channel.commands import MAX_REQUEST_BYTES, Command, encode_reply
from nnwatch.channel.limits import Bucket, Limits

#: What :meth:`Connection.take_line` returns when an oversize line starts being discarded, and
#: when a line is buffered but may not be taken yet (neither can be a request: they are not JSON).
TOO_LONG = b"\x00too long"
WAIT = b"\x00wait"


class Connection:
    """One accepted client. Its outbox is filled by the training thread and sent by the server."""

    __slots__ = (
        "sock", "fd", "inbuf", "outbox", "outbuf", "skipping", "closed", "peer_pid",
        "holds_pause", "writing", "lines", "bytes", "trainer", "connected", "last_request",
        "valid", "bad_streak", "held", "throttled_until", "mask",
    )  # fmt: skip

    def __init__(self, sock: socket.socket, peer_pid: int, limits: Limits, now: float) -> None:
        self.sock = sock
        self.fd = sock.fileno()
        self.peer_pid = peer_pid
        self.lines = Bucket(limits.first_lines, limits.lines_burst, now)
        self.bytes = Bucket(limits.first_bytes, limits.bytes_burst, now)
        self.trainer = Bucket(limits.first_trainer, limits.trainer_burst, now)
        self.connected = now
        self.last_request: float | None = None  # a complete line, valid or not
        self.valid = 0  # requests that passed validation: the mark of a real monitor
        self.bad_streak = 0  # malformed requests in a row
        self.held: Command | None = None  # a command waiting for this connection's budget
        self.throttled_until = 0.0  # not read before this (monotonic time); 0: not throttled
        self.mask = 0  # selector events registered for this connection
        self.inbuf = bytearray()
        self.outbox: collections.deque[bytes] = collections.deque()
        self.outbuf = bytearray()
        self.skipping = False  # discarding the rest of an oversize line
        self.closed = False
        self.holds_pause = False
        self.writing = False

    def take_line(self, allowed: bool = True) -> bytes | None:
        """The next complete line (without its newline); :data:`TOO_LONG` when the buffer holds
        more than a request may be without a newline (it is discarded up to the next one); None
        when no complete line is buffered; :data:`WAIT` when there is one but not ``allowed``
        (it stays buffered). Discarding the rest of an oversize line is always done."""
        buf = self.inbuf
        while True:
            nl = buf.find(b"\n")
            if self.skipping:
                if nl < 0:
                    buf.clear()
                    return None
                del buf[: nl + 1]
                self.skipping = False
                continue
            if nl < 0:
                if len(buf) < MAX_REQUEST_BYTES:
                    return None
                if not allowed:
                    return WAIT
                buf.clear()
                self.skipping = True
                return TOO_LONG
            if not allowed:
                return WAIT
            line = bytes(buf[:nl])
            del buf[: nl + 1]
            return line


class PendingCommand:
    """A validated command waiting for the training thread. Reply exactly once (later calls are
    ignored); the reply is sent by the server thread, so ``reply`` never blocks training."""

    __slots__ = ("name", "args", "id", "synthetic", "_conn", "_send", "_replied")

    def __init__(
        self,
        command: Command,
        conn: Connection | None,
        send: Callable[[Connection, bytes], None],
        *,
        synthetic: bool = False,
    ) -> None:
        self.name = command.name
        self.args = command.args
        self.id = command.id
        self.synthetic = synthetic
        self._conn = conn
        self._send = send
        self._replied = False

    def reply(
        self, applies_at_step: int | None, ok: bool = True, error: str = "", **data: Any
    ) -> None:
        """Answer the monitor: whether it worked, and from which step it applies."""
        if self._replied or self._conn is None:
            return
        self._replied = True
        line = encode_reply(self.id, ok=ok, applies_at_step=applies_at_step, error=error, data=data)
        self._send(self._conn, line)

    def connection_alive(self) -> bool:
        """Whether the connection that sent this command is still open (False for synthetic ones)."""
        return self._conn is not None and not self._conn.closed

    def __repr__(self) -> str:
        kind = " synthetic" if self.synthetic else ""
        return f"<PendingCommand{kind} {self.name} {self.args}>"
