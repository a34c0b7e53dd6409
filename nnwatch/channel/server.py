"""The command socket: how monitors steer a run without ever making the training thread wait.

One idle thread serves a Unix stream socket (no TCP listener, ever). It checks each peer's uid
with SO_PEERCRED (:mod:`~nnwatch.channel.admission`), reads newline-delimited JSON within the
budgets of :mod:`~nnwatch.channel.limits`, validates every request with
:mod:`nnwatch.channel.commands`, and queues the ones the training thread applies. It applies
nothing itself: the training thread calls :meth:`CommandServer.drain` at each step boundary,
applies what it finds, and answers with :meth:`PendingCommand.reply`, saying at which step the
command takes effect. ``drain`` with nothing pending is one truth test of a deque: no lock, no
syscall.

Requests the specification marks as applied by the server are answered by this thread alone:
``hello`` (the run's description) and ``subscribe``, which hands the connection to a streamer
(:mod:`~nnwatch.channel.handoff`).

The pause follows one rule (:mod:`nnwatch.channel.pause`): it holds while its holder renews it
(``renew``, answered here), and when the last connection holding it closes or falls silent for
the lease, the server queues a *synthetic* ``resume`` (``PendingCommand.synthetic`` is True, its
``reply`` does nothing), so a monitor that crashes or loses its SSH session can never leave
training paused. ``stacks`` is answered here too, from this thread: a training thread blocked in
C (a collective) still shows where it is. ``PendingCommand.connection_alive()`` tells whether the
asker is still connected.
"""

from __future__ import annotations

import collections
import os
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from nnwatch.channel.commands import (
    COMMANDS,
    MAX_REQUEST_BYTES,
    PAUSE,
    PROTOCOL_VERSION,
    RENEW,
    RESUME,
    STACKS,
    Command,
    CommandError,
    encode_reply,
    parse_request,
)
from nnwatch.channel.connection import TOO_LONG, WAIT, Connection, PendingCommand
from nnwatch.channel.handoff import StreamHandoff
from nnwatch.channel.limits import Bucket, Limits
from nnwatch.channel.loop import ConnectionLoop
from nnwatch.channel.pause import PauseBook
from nnwatch.channel.stacks import own_stacks

#: At close, how long streams served from threads get to send their last records and "end".
STREAM_FLUSH_S = 1.0

__all__ = ["CommandServer", "Limits", "PendingCommand", "wait_for_socket"]


class CommandServer(ConnectionLoop):
    """Serve the command socket at ``path`` from one daemon thread.

    ``hello`` is the run's description returned by the ``hello`` command; the registry entry is a
    good one. Its ``ring`` and ``run_dir`` keys tell ``subscribe`` what to stream.
    ``subscribe_mode`` is "process" (the default: a helper process streams), "thread", or "off".
    """

    def __init__(
        self,
        path: Path,
        *,
        hello: dict[str, Any],
        subscribe_mode: str = "process",
        max_connections: int | None = None,
        limits: Limits | None = None,
    ) -> None:
        limits = limits or Limits()
        super().__init__(
            path, limits=limits, max_connections=max_connections or limits.max_connections
        )
        self.hello = dict(hello)
        self.streams = StreamHandoff(self.hello, subscribe_mode)
        self.subscribe_mode = subscribe_mode
        self.rejected = 0  # requests that failed validation
        #: What the server thread answers itself, by command name (the rest go to the trainer).
        self.answers: dict[str, Callable[[Connection, Command], None]] = {
            "hello": self._hello,
            "subscribe": self._subscribe,
            RENEW: self._renew,
            STACKS: self._stacks,
        }
        self._queue: collections.deque[PendingCommand] = collections.deque()
        #: the same queue, read-only for the step boundary: empty means nothing to drain (a
        #: truth test, where ``drain()`` is a call on every step)
        self.pending: collections.deque[PendingCommand] = self._queue
        self._arrived = threading.Event()
        self.pauses = PauseBook(self._queue_synthetic)
        self._per_command: dict[str, Bucket] = {}  # for commands with a rate of their own

    def close(self) -> None:
        """Stop serving and remove the socket file. Streams already handed off finish on their own."""
        super().close()
        self.streams.join(STREAM_FLUSH_S)

    # -- training thread -------------------------------------------------------------------------
    def drain(self) -> list[PendingCommand]:
        """Commands that arrived since the last call, oldest first. O(1) when there are none."""
        queue = self._queue
        if not queue:
            return []
        self._arrived.clear()
        out = []
        while True:
            try:
                out.append(queue.popleft())
            except IndexError:
                return out

    def wait(self, timeout: float) -> bool:
        """Block until a command is pending or ``timeout`` passes (for a paused training loop)."""
        if self._queue:
            return True
        self._arrived.clear()
        if self._queue:
            return True
        return self._arrived.wait(timeout)

    # -- server thread: requests -----------------------------------------------------------------
    def _read(self, conn: Connection, *, recv: bool = True) -> None:
        if conn.throttled_until:
            return
        now = time.monotonic()
        lim, n = self.limits, len(self._conns)
        line_rate = lim.share(lim.lines_per_s, lim.total_lines_per_s, n)
        conn.lines.refill(now, line_rate)
        if recv:
            byte_rate = lim.share(lim.bytes_per_s, lim.total_bytes_per_s, n)
            room = int(min(conn.bytes.refill(now, byte_rate), lim.read_max))
            if room < lim.read_min:
                self._throttle(conn, now, conn.bytes.wait(lim.read_min, byte_rate))
                return
            try:
                data = conn.sock.recv(room)
            except (BlockingIOError, InterruptedError):
                return
            except OSError:
                data = b""
            if not data:
                self._drop(conn)
                return
            conn.bytes.tokens -= len(data)
            conn.inbuf += data
        if conn.held is not None:
            held, conn.held = conn.held, None
            if not self._submit(conn, held, now):
                return
        while not conn.closed:
            line = conn.take_line(allowed=conn.lines.tokens >= 1)
            if line is None:
                return
            if line is WAIT:
                self._throttle(conn, now, conn.lines.wait(1, line_rate))
                return
            conn.lines.tokens -= 1
            conn.last_request = now
            if line is TOO_LONG:
                self._reject(conn, CommandError(
                    f"message too large (over {MAX_REQUEST_BYTES} bytes without a newline); "
                    "it was discarded"
                ))  # fmt: skip
            elif line.strip() and not self._handle(conn, line, now):
                return

    def _reject(self, conn: Connection, exc: CommandError) -> None:
        self.rejected += 1
        conn.bad_streak += 1
        self._send(conn, encode_reply(exc.request_id, ok=False, error=exc.message))
        why = self.door.junk_only(conn)
        if why:
            self._goodbye(conn, why)

    def _handle(self, conn: Connection, line: bytes, now: float) -> bool:
        """Answer or queue one request line; False when ``conn`` must wait for its budget."""
        try:
            command = parse_request(line)
        except CommandError as exc:
            self._reject(conn, exc)
            return True
        conn.valid += 1
        conn.bad_streak = 0
        answer = self.answers.get(command.name)
        if answer is not None:
            answer(conn, command)
            return True
        if not COMMANDS[command.name].applied_by_trainer:
            self._refuse(conn, command, f"this run does not serve {command.name}")
            return True
        return self._submit(conn, command, now)

    def _refuse(self, conn: Connection, command: Command, why: str) -> None:
        self._send(conn, encode_reply(command.id, ok=False, error=why))

    def _submit(self, conn: Connection, command: Command, now: float) -> bool:
        """Queue a command for the training thread, within its budgets; False when ``conn`` is
        throttled until it may (the command is held, and goes first when it may)."""
        spec, lim = COMMANDS[command.name], self.limits
        rate = spec.per_s
        if rate is not None:
            own = self._per_command.setdefault(command.name, Bucket(1.0, max(1.0, rate), now))
            if own.refill(now, rate) < 1:
                self._refuse(conn, command, (
                    f"{command.name}: at most {rate:g} a second; try again in "
                    f"{own.wait(1, rate):.1f} s"
                ))  # fmt: skip
                return True
        if len(self._queue) >= lim.max_pending:
            self._refuse(conn, command, (
                f"the run is busy: {len(self._queue)} commands wait for its next step boundary"
            ))  # fmt: skip
            return True
        trainer_rate = lim.share(lim.trainer_per_s, lim.total_trainer_per_s, len(self._conns))
        if conn.trainer.refill(now, trainer_rate) < 1:
            conn.held = command
            self._throttle(conn, now, conn.trainer.wait(1, trainer_rate))
            return False
        conn.trainer.tokens -= 1
        if rate is not None:
            self._per_command[command.name].tokens -= 1
        if command.name == PAUSE:
            self.pauses.taken(conn)
        elif command.name == RESUME:
            self.pauses.lifted()
        self._queue.append(PendingCommand(command, conn, self._send))
        self._arrived.set()
        return True

    def _hello(self, conn: Connection, command: Command) -> None:
        data = dict(self.hello)
        data.update(
            protocol=PROTOCOL_VERSION, commands=list(COMMANDS), subscribe=self.subscribe_mode
        )
        self._send(conn, encode_reply(command.id, ok=True, data=data))

    def _renew(self, conn: Connection, command: Command) -> None:
        held = self.pauses.holds(conn)
        self._send(conn, encode_reply(
            command.id, ok=True, data={"held": held, "lease_s": self.limits.pause_lease}
        ))  # fmt: skip

    def _stacks(self, conn: Connection, command: Command) -> None:
        data = own_stacks()
        data.update(rank=self.hello.get("rank"), pid=self.hello.get("pid"),
                    host=self.hello.get("host"))  # fmt: skip
        self._send(conn, encode_reply(command.id, ok=True, data=data))

    def _subscribe(self, conn: Connection, command: Command) -> None:
        why = self.streams.refusal()
        if why:
            self._refuse(conn, command, why)
            return
        self._flush(conn)  # anything still owed on this connection goes out before the stream
        owed = bytes(conn.outbuf)
        self._drop(conn, close=False)
        self.streams.hand_off(conn.sock, owed, {"id": command.id, "args": command.args})

    def _tick(self) -> None:
        self.streams.reap()

    def _dropped(self, conn: Connection, *, lift_pause: bool) -> None:
        """A pause lifts when the last connection that holds one goes."""
        self.pauses.dropped(conn, lift=lift_pause)

    def _queue_synthetic(self, command: Command) -> None:
        self._queue.append(PendingCommand(command, None, self._send, synthetic=True))
        self._arrived.set()


def wait_for_socket(path: Path, timeout: float = 5.0) -> bool:
    """Poll until a socket file exists at ``path`` (for tests and launchers)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if os.path.exists(path):
            return True
        time.sleep(0.01)
    return False
