"""The monitor's end of the command socket, shared by ``nnwatch ctl`` and the TUI.

Two kinds of connection: :class:`ChannelClient` sends commands and waits for their replies (and,
while it stays open, holds any pause it asked for); :class:`Subscription` turns a connection into
the run's stream (see :mod:`nnwatch.channel.stream`). Requests are validated here with the same
rules the server uses, so a typo is reported before anything is sent.
"""

from __future__ import annotations

import base64
import errno
import os
import select
import socket
import struct
import time
import zlib
from pathlib import Path
from typing import Any

import numpy as np

from nnwatch.channel.commands import (
    COMMANDS,
    Command,
    CommandError,
    CommandReply,
    encode_request,
    validate,
)
from nnwatch.store.clean_text import loads
from nnwatch.store.schema import RunMeta

#: Largest line accepted from a run: stream chunks are at most ~1.4 MB of base64.
MAX_LINE_BYTES = 16 * 1024 * 1024
DEFAULT_TIMEOUT = 10.0
#: Within one poll, how long to wait for the next line of a stream that is still flowing.
_BURST_WAIT = 0.005
#: Socket buffer asked for on stream connections, so a backlog moves in few wake-ups.
STREAM_BUFFER = 4 * 1024 * 1024


class ChannelError(RuntimeError):
    """The run cannot be reached or answered nonsense; the message says what to do."""


def connect(path: Path | str, timeout: float = DEFAULT_TIMEOUT) -> socket.socket:
    """Connect to a run's command socket, turning OS errors into plain words.

    The run accepts connections at a bounded rate, so under a connection flood its listen backlog
    may be full. A non-blocking connect would then fail at once; a blocking one with a send
    timeout waits in the kernel's queue for a slot, in turn, for up to ``timeout`` seconds.
    """
    path = os.fspath(path)
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    whole = int(max(0.0, timeout))
    usec = int((max(0.0, timeout) - whole) * 1e6)
    wait = struct.pack("ll", whole, usec if whole or usec else 1)  # (0, 0) would wait forever
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDTIMEO, wait)
        sock.connect(path)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDTIMEO, struct.pack("ll", 0, 0))
        sock.settimeout(timeout)
    except BlockingIOError:
        sock.close()
        raise ChannelError(
            f"the run at {path} did not take the connection within {timeout:g} s: its command "
            "socket has a queue of connections (is something flooding it?); try again"
        ) from None
    except FileNotFoundError:
        sock.close()
        raise ChannelError(
            f"no socket at {path}: the run has ended, or the path is wrong (see `nnwatch ls`)"
        ) from None
    except ConnectionRefusedError:
        sock.close()
        raise ChannelError(
            f"nobody answers at {path}: the run (or the ssh tunnel to it) is gone and left "
            f"its socket file behind. For a tunnel: `rm {path}` and run ssh again with "
            "`-o StreamLocalBindUnlink=yes` (or let `nnwatch attach HOST:RUN` manage the "
            "tunnel); for a local run, `nnwatch gc` removes it"
        ) from None
    except PermissionError:
        sock.close()
        raise ChannelError(f"not allowed to open {path}: it belongs to another user") from None
    except OSError as exc:
        sock.close()
        if exc.errno == errno.ENAMETOOLONG or "too long" in str(exc):
            raise ChannelError(f"the socket path {path} is too long for a Unix socket") from None
        raise ChannelError(f"cannot connect to {path}: {exc.strerror or exc}") from None
    return sock


class LineReader:
    """Split a socket's bytes into lines, refusing any line longer than ``limit``."""

    def __init__(self, sock: socket.socket, limit: int = MAX_LINE_BYTES) -> None:
        self.sock = sock
        self.limit = limit
        self.buf = bytearray()
        self.eof = False
        self.received = 0  # bytes read from the socket, for benchmarks

    def _take_line(self) -> bytes | None:
        nl = self.buf.find(b"\n")
        if nl < 0:
            if len(self.buf) > self.limit:
                raise ChannelError(f"the run sent a line longer than {self.limit} bytes")
            return None
        line = bytes(self.buf[:nl])
        del self.buf[: nl + 1]
        return line

    def read_exact(self, n: int, timeout: float | None) -> bytes | None:
        """Exactly ``n`` bytes (the payload after a binary message's header line), or None when
        the other end closed or ``timeout`` passed first (what arrived stays buffered)."""
        if n > self.limit:
            raise ChannelError(f"the run announced a message of {n} bytes (limit {self.limit})")
        deadline = None if timeout is None else time.monotonic() + timeout
        while len(self.buf) < n:
            if self.eof or not self._fill(deadline):
                return None
        data = bytes(self.buf[:n])
        del self.buf[:n]
        return data

    def _fill(self, deadline: float | None) -> bool:
        """Read once from the socket; False when nothing came before ``deadline``."""
        wait = None if deadline is None else max(0.0, deadline - time.monotonic())
        ready, _, _ = select.select([self.sock], [], [], wait)
        if not ready:
            return False
        try:
            data = self.sock.recv(1 << 20)
        except (BlockingIOError, InterruptedError, TimeoutError):
            return True
        except OSError:
            data = b""
        if not data:
            self.eof = True
            return True
        self.received += len(data)
        self.buf += data
        return True

    def readline(self, timeout: float | None) -> bytes | None:
        """The next line, or None when ``timeout`` passed first or the other end closed."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            line = self._take_line()
            if line is not None:
                return line
            if self.eof:
                return None
            if not self._fill(deadline):
                return None


def _reply(obj: dict[str, Any]) -> CommandReply:
    data = obj.get("data")
    step = obj.get("applies_at_step")
    return CommandReply(
        ok=bool(obj.get("ok")),
        applies_at_step=int(step) if isinstance(step, (int, float)) else None,
        error=str(obj.get("error") or ""),
        data=data if isinstance(data, dict) else {},
    )


class ChannelClient:
    """A command connection to one run. Keep it open to hold a pause; close it to lift it."""

    def __init__(self, path: Path | str, *, timeout: float = DEFAULT_TIMEOUT) -> None:
        self.path = Path(path)
        self.timeout = timeout
        self.sock = connect(self.path, timeout)
        self._lines = LineReader(self.sock)
        self._next_id = 1

    @property
    def closed(self) -> bool:
        return self.sock.fileno() < 0 or self._lines.eof

    def request(
        self, name: str, args: dict[str, Any] | None = None, *, timeout: float | None = None
    ) -> CommandReply:
        """Send one command and wait for its reply. Never raises for a refused command."""
        rid = self._next_id
        self._next_id += 1
        try:
            command = validate(name, args or {}, rid)
        except CommandError as exc:
            return CommandReply(False, error=exc.message)
        if COMMANDS[name].takes_connection:
            return CommandReply(
                False, error=f"use Subscription for {name}; it takes the connection"
            )
        try:
            self.sock.sendall(encode_request(command))
        except OSError as exc:
            raise ChannelError(
                f"lost the connection to {self.path}: {exc.strerror or exc}"
            ) from None
        wait = self.timeout if timeout is None else timeout
        deadline = time.monotonic() + wait
        while True:
            line = self._lines.readline(max(0.0, deadline - time.monotonic()))
            if line is None:
                if self._lines.eof:
                    raise ChannelError(f"the run closed the connection ({self.path})")
                return CommandReply(False, error=(
                    f"no reply within {wait:g} s: the run applies commands between steps, so it "
                    "may be hung, or stuck in a long step"
                ), pending=True)  # fmt: skip
            try:
                obj = loads(line)
            except ValueError:
                continue
            if not isinstance(obj, dict):
                continue
            if obj.get("id") == rid or (obj.get("id") is None and not obj.get("ok")):
                return _reply(obj)

    def still_open(self) -> bool:
        """Whether the run still holds this connection (a closed one reads as end-of-file)."""
        if self.closed:
            return False
        try:
            ready, _, _ = select.select([self.sock], [], [], 0)
            if ready and not self.sock.recv(1, socket.MSG_PEEK):
                self._lines.eof = True
                return False
        except OSError:
            return False
        return True

    def command(self, name: str, **args: Any) -> CommandReply:
        return self.request(name, args)

    def hello(self) -> dict[str, Any]:
        reply = self.request("hello")
        if not reply.ok:
            raise ChannelError(reply.error or "the run refused hello")
        return reply.data

    def close(self) -> None:
        try:
            self.sock.close()
        except OSError:
            pass

    def __enter__(self) -> ChannelClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _subscribe_args(
    history: bool,
    start: str | int,
    max_hz: float,
    after_step: float | None,
    events_offset: int,
    binary: bool,
    extra: dict[str, Any] | None,
) -> dict[str, Any]:
    """The ``subscribe`` command's arguments: the stream's settings, and what the monitor already
    holds (to resume rather than restart)."""
    args: dict[str, Any] = {"history": history, "start": start, "max_hz": max_hz}
    args.update(extra or {})  # e.g. the overview mode of nnwatch.channel.stream_summary
    if after_step is not None:
        args["after_step"] = float(after_step)
    if events_offset:
        args["events_offset"] = int(events_offset)
    if binary:
        args["binary"] = True
    return args


class Subscription:
    """A stream of one run's history, records, events and status, decoded into numpy rows.

    ``poll()`` returns the messages that arrived, with ``rows`` already decoded (``scalars``,
    ``layers`` and ``records`` messages). ``ended`` is set by the ``end`` message; ``lost`` when the
    connection dropped without one. To resume rather than restart, pass what the monitor already
    holds: ``after_step`` (its last step), ``start`` (the next ring sequence, a record's
    ``next_seq``) and ``events_offset`` (an events message's ``offset``).
    """

    def __init__(
        self,
        path: Path | str,
        *,
        history: bool = True,
        start: str | int = "oldest",
        max_hz: float = 20.0,
        timeout: float = DEFAULT_TIMEOUT,
        after_step: float | None = None,
        events_offset: int = 0,
        binary: bool = True,
        extra: dict[str, Any] | None = None,
    ) -> None:
        self.path = Path(path)
        args = _subscribe_args(history, start, max_hz, after_step, events_offset, binary, extra)
        command = validate("subscribe", args, 1)
        self.sock = connect(self.path, timeout)
        try:
            self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, STREAM_BUFFER)
        except OSError:
            pass
        self._lines = LineReader(self.sock)
        self._take_reply(self._ask(command, timeout))
        self._head: dict[str, Any] | None = None  # a binary message whose bytes are still due
        self.ended: dict[str, Any] | None = None
        self.lost = False

    def _ask(self, command: Command, timeout: float) -> bytes:
        """Send ``subscribe`` and wait for its reply line; without one the connection is closed
        and the error says why in words (a tunnel that could not reach the run, a silent run)."""
        t0 = time.monotonic()
        try:
            self.sock.sendall(encode_request(command))
            line = self._lines.readline(timeout)
        except OSError as exc:
            self.close()
            raise ChannelError(
                f"lost the connection to {self.path}: {exc.strerror or exc}"
            ) from None
        if line is None:
            self.close()
            if self._lines.eof:
                raise ChannelError(
                    f"the connection at {self.path} closed after "
                    f"{time.monotonic() - t0:.2g} s without an answer: whatever listens there "
                    "(an ssh tunnel?) could not reach the run; check that the run is still "
                    "alive on its host (`nnwatch ls` there) and forward its socket again"
                )
            raise ChannelError(
                f"the run at {self.path} did not answer subscribe within {timeout:g} s"
            )
        return line

    def _take_reply(self, line: bytes) -> None:
        """Read the reply: the stream's ``info`` and the run's meta, whose schema gives the dtypes
        of the rows that follow; a refusal or an unreadable reply closes the connection."""
        try:
            reply = _reply(loads(line))
        except ValueError:
            self.close()
            raise ChannelError(f"the run at {self.path} answered subscribe with garbage") from None
        if not reply.ok:
            self.close()
            raise ChannelError(f"the run refused to stream: {reply.error}")
        self.info = reply.data
        try:
            self.meta = RunMeta.from_json(str(reply.data.get("meta") or ""))
        except (ValueError, KeyError, TypeError) as exc:
            self.close()
            raise ChannelError(f"the run sent an unreadable description: {exc}") from None
        schema = self.meta.schema
        self._dtypes = {
            "scalars": schema.scalar_dtype(),
            "layers": schema.layer_row_dtype(),
            "records": schema.record_dtype(),
        }

    @property
    def received(self) -> int:
        """Bytes read from the connection so far."""
        return self._lines.received

    def _decode(self, msg: dict[str, Any], raw: bytes) -> bool:
        kind = msg["type"]
        try:
            if msg.pop("zlib", False):
                raw = zlib.decompress(raw)
            if kind not in self._dtypes:  # a payload its reader decodes (e.g. summaries)
                msg["raw"] = raw
                msg.pop("bytes", None)
                return True
            rows = np.frombuffer(raw, dtype=self._dtypes[kind]).copy()
        except (ValueError, TypeError, zlib.error):
            return False
        msg["rows"] = rows
        msg.pop("data", None)
        msg.pop("bytes", None)
        return True

    def poll(
        self, timeout: float = 0.0, *, budget: float = 0.1, max_messages: int = 10_000
    ) -> list[dict[str, Any]]:
        """Messages that arrived, waiting up to ``timeout`` for the first one.

        While more keeps coming (a backlog larger than the socket buffer), it goes on reading for
        up to ``budget`` seconds, so that a monitor polling a few times a second catches up. A
        message whose bytes have not all arrived stays for the next poll: nothing is lost.
        """
        out: list[dict[str, Any]] = []
        wait: float | None = timeout
        until = time.monotonic() + timeout + budget
        while len(out) < max_messages and not self.lost:
            try:
                if self._head is not None:
                    raw = self._lines.read_exact(int(self._head["bytes"]), wait)
                    if raw is None:
                        if self._lines.eof and self.ended is None:
                            self.lost = True
                        break
                    msg, self._head = self._head, None
                    if self._decode(msg, raw):
                        out.append(msg)
                    wait = min(_BURST_WAIT, max(0.0, until - time.monotonic()))
                    continue
                line = self._lines.readline(wait)
            except ChannelError:
                self.lost = True
                break
            if line is None:
                if self._lines.eof and self.ended is None:
                    self.lost = True
                break
            wait = min(_BURST_WAIT, max(0.0, until - time.monotonic()))
            try:
                msg = loads(line)
            except ValueError:
                continue
            if not isinstance(msg, dict):
                continue
            kind = msg.get("type")
            if kind in self._dtypes:
                if isinstance(msg.get("bytes"), int):
                    self._head = msg  # its bytes follow the line
                    continue
                try:
                    raw = base64.b64decode(msg.get("data") or "")
                except (ValueError, TypeError):
                    continue
                if not self._decode(msg, raw):
                    continue
            elif isinstance(msg.get("bytes"), int):
                self._head = msg  # a payload of another kind: its bytes follow the line too
                continue
            elif kind == "end":
                self.ended = msg
            elif kind is None and msg.get("ok") is False:  # e.g. the stream process failed
                msg = {"type": "error", "message": str(msg.get("error") or "the stream failed")}
            out.append(msg)
        return out

    def close(self) -> None:
        try:
            self.sock.close()
        except OSError:
            pass
