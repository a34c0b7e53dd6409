"""The wire under the ``subscribe`` stream: a bounded, non-blocking sender, and the message bytes.

:mod:`nnwatch.channel.stream` decides what to send; this is how it goes down the socket: one
JSON object per line, rows as their little-endian bytes (zlib-compressed when that is smaller)
or base64, through a buffer of at most ``OUT_LIMIT`` bytes that never makes the stream wait on a
slow link, and gives up on a monitor that takes nothing for ``STALL_LIMIT`` seconds.
"""

from __future__ import annotations

import base64
import json
import select
import socket
import time
import zlib
from typing import Any

import numpy as np

#: Bytes the stream holds for a monitor that is not taking them, before it stops producing more.
OUT_LIMIT = 8 * 1024 * 1024
#: A monitor that takes nothing at all for this long is given up (a half-open connection).
STALL_LIMIT = 600.0


class _Gone(Exception):
    """The monitor closed its end or stopped reading for good."""


class _Out:
    """Non-blocking sender with a bounded buffer: the stream never waits on a slow link for
    longer than one poll period, and it knows when to stop producing."""

    def __init__(self, sock: socket.socket, limit: int = OUT_LIMIT) -> None:
        self.sock = sock
        self.limit = limit
        self.buf = bytearray()
        self.sent = 0
        self.progress = time.monotonic()
        self.on_data: Any = None  # what the monitor sends (overview mode: its requests)
        sock.setblocking(False)

    @property
    def full(self) -> bool:
        return len(self.buf) >= self.limit

    def put(self, data: bytes) -> None:
        self.buf += data
        self.push()

    def push(self) -> None:
        """Send what the socket takes now."""
        while self.buf:
            try:
                n = self.sock.send(self.buf)
            except (BlockingIOError, InterruptedError):
                break
            except OSError as exc:
                raise _Gone from exc
            if n <= 0:
                break
            del self.buf[:n]
            self.sent += n
            self.progress = time.monotonic()
        if self.buf and time.monotonic() - self.progress > STALL_LIMIT:
            raise _Gone

    def wait(self, timeout: float) -> None:
        """Wait up to ``timeout`` for the link to take more or the monitor to speak or close."""
        want_w = [self.sock] if self.buf else []
        try:
            r, w, _ = select.select([self.sock], want_w, [], timeout)
        except (OSError, ValueError) as exc:
            raise _Gone from exc
        if r:
            try:
                data = self.sock.recv(65536)
                if not data:
                    raise _Gone  # the monitor closed its end
                if self.on_data is not None:
                    self.on_data(data)
            except (BlockingIOError, InterruptedError):
                pass
            except OSError as exc:
                raise _Gone from exc
        self.push()

    def drain(self, timeout: float) -> None:
        """Send everything buffered, waiting up to ``timeout`` (for the last message)."""
        deadline = time.monotonic() + timeout
        while self.buf and time.monotonic() < deadline:
            self.wait(min(0.1, max(0.0, deadline - time.monotonic())))


def _json_line(message: dict[str, Any]) -> bytes:
    return (json.dumps(message) + "\n").encode()


def _rows_bytes(kind: str, rows: np.ndarray, binary: bool, **extra: Any) -> bytes:
    raw = np.ascontiguousarray(rows).tobytes()
    head: dict[str, Any] = {"type": kind, "rows": int(len(rows)), **extra}
    if not binary:
        head["data"] = base64.b64encode(raw).decode("ascii")
        return _json_line(head)
    packed = zlib.compress(raw, 1)
    if len(packed) < len(raw):
        head["zlib"] = True
        raw = packed
    head["bytes"] = len(raw)
    return _json_line(head) + raw
