"""The command socket: how monitors steer a run without ever making the training thread wait.

One idle thread serves a Unix stream socket (no TCP listener, ever). It checks each peer's uid
with SO_PEERCRED, reads newline-delimited JSON, validates every request with
:mod:`nnwatch.channel.commands`, and queues the valid ones. It applies nothing itself: the
training thread calls :meth:`CommandServer.drain` at each step boundary, applies what it finds,
and answers with :meth:`PendingCommand.reply`, saying at which step the command takes effect.
``drain`` with nothing pending is one truth test of a deque: no lock, no syscall.

Two requests are answered by the server thread alone: ``hello`` (the run's description) and
``subscribe``, which turns the connection into a stream of the run's history, records, events and
status. The stream is served by a separate process (``python -m nnwatch.channel.stream``) that
reads the ring and the run log from disk, so a remote monitor costs the trainer nothing more; if
that process cannot be started, a thread in this process serves it instead.

A pause lifts itself when the connection that asked for it closes: when the last connection
holding a pause goes away without a ``resume``, the server queues a *synthetic* ``resume``
(``PendingCommand.synthetic`` is True, its ``reply`` does nothing), so a monitor that crashes or
loses its SSH session can never leave training paused. ``PendingCommand.connection_alive()``
tells whether the asker is still connected.
"""

from __future__ import annotations

import collections
import errno
import json
import logging
import os
import selectors
import socket
import stat
import struct
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

from nnwatch.channel.commands import (
    COMMANDS,
    MAX_REQUEST_BYTES,
    PROTOCOL_VERSION,
    Command,
    CommandError,
    encode_reply,
    parse_request,
)

log = logging.getLogger("nnwatch")

#: A client that does not read its replies is cut off once this much is waiting for it.
MAX_OUTBOX_BYTES = 1024 * 1024
MAX_CONNECTIONS = 32
#: What one connection may send: request lines per second (and a burst), bytes per second (and
#: a burst that holds one request of the largest size). Beyond it the server stops reading from
#: that connection until its budget refills, so a flooding client is slowed by its own socket
#: buffer filling up, at no cost to the trainer.
LINES_PER_S, LINES_BURST = 100.0, 256.0
BYTES_PER_S, BYTES_BURST = 64.0 * 1024, float(2 * MAX_REQUEST_BYTES)
#: The same for all connections together, which bounds the server thread's CPU (JSON parsing
#: takes the GIL from the training thread) whatever the number of clients.
TOTAL_LINES_PER_S, TOTAL_BYTES_PER_S = 500.0, 512.0 * 1024
TOTAL_LINES_BURST = 512.0
#: A connection that has sent no complete request this long after connecting is closed; one that
#: has been silent this long is closed too, unless it holds a pause (its monitor is the one to
#: lift it). Monitors reconnect when they next need to send.
HANDSHAKE_TIMEOUT = 10.0
IDLE_TIMEOUT = 120.0
#: At close, how long streams served from threads get to send their last records and "end".
STREAM_FLUSH_S = 1.0
_PEERCRED = struct.Struct("3i")  # pid, uid, gid


class _Connection:
    """One accepted client. Its outbox is filled by the training thread and sent by the server."""

    __slots__ = (
        "sock", "fd", "inbuf", "outbox", "outbuf", "skipping", "closed", "peer_pid",
        "holds_pause", "writing", "lines", "bytes", "refilled", "connected", "last_request",
        "valid", "throttled_until", "mask",
    )  # fmt: skip

    def __init__(self, sock: socket.socket, peer_pid: int) -> None:
        now = time.monotonic()
        self.lines = LINES_BURST  # token buckets, see LINES_PER_S
        self.bytes = BYTES_BURST
        self.refilled = now
        self.connected = now
        self.last_request: float | None = None  # a complete line, valid or not
        self.valid = 0  # requests that passed validation: the mark of a real monitor
        self.throttled_until = 0.0
        self.mask = 0  # selector events registered for this connection
        self.sock = sock
        self.fd = sock.fileno()
        self.inbuf = bytearray()
        self.outbox: collections.deque[bytes] = collections.deque()
        self.outbuf = bytearray()
        self.skipping = False  # discarding the rest of an oversize line
        self.closed = False
        self.peer_pid = peer_pid
        self.holds_pause = False
        self.writing = False


class PendingCommand:
    """A validated command waiting for the training thread. Reply exactly once (later calls are
    ignored); the reply is sent by the server thread, so ``reply`` never blocks training."""

    __slots__ = ("name", "args", "id", "synthetic", "_conn", "_server", "_replied")

    def __init__(
        self,
        command: Command,
        conn: _Connection | None,
        server: CommandServer,
        *,
        synthetic: bool = False,
    ) -> None:
        self.name = command.name
        self.args = command.args
        self.id = command.id
        self.synthetic = synthetic
        self._conn = conn
        self._server = server
        self._replied = False

    def reply(
        self, applies_at_step: int | None, ok: bool = True, error: str = "", **data: Any
    ) -> None:
        """Answer the monitor: whether it worked, and from which step it applies."""
        if self._replied or self._conn is None:
            return
        self._replied = True
        line = encode_reply(self.id, ok=ok, applies_at_step=applies_at_step, error=error, data=data)
        self._server._send(self._conn, line)

    def connection_alive(self) -> bool:
        """Whether the connection that sent this command is still open (False for synthetic ones)."""
        return self._conn is not None and not self._conn.closed

    def __repr__(self) -> str:
        kind = " synthetic" if self.synthetic else ""
        return f"<PendingCommand{kind} {self.name} {self.args}>"


class CommandServer:
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
        max_connections: int = MAX_CONNECTIONS,
    ) -> None:
        if subscribe_mode not in ("process", "thread", "off"):
            raise ValueError("subscribe_mode must be 'process', 'thread' or 'off'")
        self.path = Path(path)
        if len(os.fsencode(self.path)) > 107:
            raise ValueError(
                f"the socket path {self.path} is longer than a Unix socket allows (107 bytes)"
            )
        self.hello = dict(hello)
        self.subscribe_mode = subscribe_mode
        self.max_connections = max_connections
        self.uid = os.getuid()
        self.refused = 0  # peers of another uid, turned away
        self.rejected = 0  # requests that failed validation
        self.throttled = 0  # times a connection was paused for sending too much
        self.evicted = 0  # idle or junk connections closed to make room for a new monitor
        self.timed_out = 0  # connections closed for silence
        self._total_lines, self._total_bytes = TOTAL_LINES_BURST, TOTAL_BYTES_PER_S
        self._total_refilled = time.monotonic()
        self._queue: collections.deque[PendingCommand] = collections.deque()
        self._arrived = threading.Event()
        self._conns: dict[int, _Connection] = {}
        self._pause_holders: set[_Connection] = set()
        self._children: list[subprocess.Popen[bytes]] = []
        self._stream_threads: list[threading.Thread] = []
        self._stop = False
        self._thread: threading.Thread | None = None
        self._listener: socket.socket | None = None
        self._sel: selectors.BaseSelector | None = None
        self._wake_r, self._wake_w = -1, -1

    # -- lifecycle -------------------------------------------------------------------------------
    def start(self) -> None:
        """Bind the socket (mode 0600) and start serving. Raises OSError if the path is unusable."""
        if self._thread is not None:
            return
        self._remove_stale_socket()
        listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            old = os.umask(0o177)
            try:
                listener.bind(os.fspath(self.path))
            finally:
                os.umask(old)
            os.chmod(self.path, 0o600)
            listener.listen(16)
            listener.setblocking(False)
        except BaseException:
            listener.close()
            raise
        self._listener = listener
        self._wake_r, self._wake_w = os.pipe()
        os.set_blocking(self._wake_r, False)
        os.set_blocking(self._wake_w, False)
        self._sel = selectors.DefaultSelector()
        self._sel.register(listener, selectors.EVENT_READ, "listen")
        self._sel.register(self._wake_r, selectors.EVENT_READ, "wake")
        self._thread = threading.Thread(target=self._serve, name="nnwatch-commands", daemon=True)
        self._thread.start()

    def _remove_stale_socket(self) -> None:
        try:
            st = os.lstat(self.path)
        except FileNotFoundError:
            return
        if not stat.S_ISSOCK(st.st_mode):
            raise OSError(errno.EEXIST, f"{self.path} exists and is not a socket; not replacing it")
        probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        probe.settimeout(0.5)
        try:
            probe.connect(os.fspath(self.path))
        except OSError:
            os.unlink(self.path)  # nobody listens: left behind by a dead process
            return
        finally:
            probe.close()
        raise OSError(errno.EADDRINUSE, f"another process already serves {self.path}")

    def close(self) -> None:
        """Stop serving and remove the socket file. Streams already handed off finish on their own."""
        if self._thread is None or self._stop:
            return
        self._stop = True
        self._wake()
        self._thread.join(timeout=5)
        for conn in list(self._conns.values()):
            self._drop(conn, lift_pause=False)
        deadline = time.monotonic() + STREAM_FLUSH_S
        for t in self._stream_threads:  # let thread-served streams send the run's end
            t.join(timeout=max(0.0, deadline - time.monotonic()))
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

    @property
    def connections(self) -> int:
        return len(self._conns)

    # -- server thread ---------------------------------------------------------------------------
    def _serve(self) -> None:
        assert self._sel is not None
        next_sweep = time.monotonic() + 1.0
        while not self._stop:
            timeout = 1.0
            waiting = [c.throttled_until for c in self._conns.values() if c.throttled_until]
            if waiting:
                timeout = max(0.0, min(timeout, min(waiting) - time.monotonic()))
            try:
                events = self._sel.select(timeout=timeout)
            except OSError:
                break
            for key, mask in events:
                try:
                    if key.data == "listen":
                        self._accept()
                    elif key.data == "wake":
                        self._drain_wake()
                    else:
                        conn = key.data
                        if mask & selectors.EVENT_READ:
                            self._read(conn)
                        if mask & selectors.EVENT_WRITE and not conn.closed:
                            self._flush(conn)
                except Exception as exc:  # noqa: BLE001 - one bad client must not end the server
                    log.debug("nnwatch: command socket error: %r", exc)
                    if isinstance(key.data, _Connection):
                        self._drop(key.data)
            for conn in list(self._conns.values()):
                if conn.outbox and not conn.closed:
                    self._flush(conn)
            now = time.monotonic()
            for conn in list(self._conns.values()):
                if conn.throttled_until and now >= conn.throttled_until and not conn.closed:
                    conn.throttled_until = 0.0
                    try:
                        self._interest(conn)
                        self._read(conn, recv=False)  # lines already buffered go first
                    except Exception as exc:  # noqa: BLE001
                        log.debug("nnwatch: command socket error: %r", exc)
                        self._drop(conn)
            if now >= next_sweep:
                next_sweep = now + 1.0
                self._close_idle(now)
            if self._children:
                self._children = [p for p in self._children if p.poll() is None]

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
        assert self._listener is not None and self._sel is not None
        try:
            sock, _ = self._listener.accept()
        except (BlockingIOError, InterruptedError):
            return
        pid, uid, _gid = _PEERCRED.unpack(
            sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, _PEERCRED.size)
        )
        if uid != self.uid:
            self.refused += 1
            self._refuse(sock, f"refused: this run belongs to uid {self.uid}; you are uid {uid}")
            return
        if len(self._conns) >= self.max_connections and not self._make_room():
            self._refuse(
                sock, f"refused: too many monitors connected (limit {self.max_connections})"
            )
            return
        sock.setblocking(False)
        conn = _Connection(sock, pid)
        self._conns[conn.fd] = conn
        self._interest(conn)

    def _make_room(self) -> bool:
        """Close one connection so that a new monitor gets in: first one that never sent a valid
        request, then the one silent longest; never one that holds a pause."""
        candidates = [c for c in self._conns.values() if not c.holds_pause]
        if not candidates:
            return False
        victim = min(
            candidates, key=lambda c: (c.valid > 0, c.last_request or c.connected)
        )
        self.evicted += 1
        self._goodbye(victim, "closed to make room for a new monitor (too many connections)")
        return True

    def _close_idle(self, now: float) -> None:
        for conn in list(self._conns.values()):
            if conn.holds_pause or conn.closed:
                continue
            if conn.last_request is None and now - conn.connected > HANDSHAKE_TIMEOUT:
                why = f"closed: no request within {HANDSHAKE_TIMEOUT:g} s of connecting"
            elif conn.last_request is not None and now - conn.last_request > IDLE_TIMEOUT:
                why = f"closed: idle for {IDLE_TIMEOUT:g} s (reconnect to send more)"
            else:
                continue
            self.timed_out += 1
            self._goodbye(conn, why)

    def _goodbye(self, conn: _Connection, message: str) -> None:
        """Tell a client why it is being closed (best effort, never blocking), then close it."""
        try:
            conn.sock.send(encode_reply(None, ok=False, error=message))
        except OSError:
            pass
        self._drop(conn)

    def _interest(self, conn: _Connection) -> None:
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

    def _refill(self, conn: _Connection, now: float) -> None:
        dt = now - conn.refilled
        conn.refilled = now
        conn.lines = min(LINES_BURST, conn.lines + dt * LINES_PER_S)
        conn.bytes = min(BYTES_BURST, conn.bytes + dt * BYTES_PER_S)
        dt = now - self._total_refilled
        self._total_refilled = now
        self._total_lines = min(TOTAL_LINES_BURST, self._total_lines + dt * TOTAL_LINES_PER_S)
        self._total_bytes = min(TOTAL_BYTES_PER_S, self._total_bytes + dt * TOTAL_BYTES_PER_S)

    def _throttle(self, conn: _Connection, now: float) -> None:
        """Stop reading from ``conn`` until its (and the server's) budget has refilled a bit."""
        wait = 0.05
        if conn.lines < 1:
            wait = max(wait, (1 - conn.lines) / LINES_PER_S)
        if conn.bytes < 1024:
            wait = max(wait, (1024 - conn.bytes) / BYTES_PER_S)
        if self._total_lines < 1:
            wait = max(wait, (1 - self._total_lines) / TOTAL_LINES_PER_S)
        if self._total_bytes < 1024:
            wait = max(wait, (1024 - self._total_bytes) / TOTAL_BYTES_PER_S)
        conn.throttled_until = now + wait
        self.throttled += 1
        self._interest(conn)

    @staticmethod
    def _refuse(sock: socket.socket, message: str) -> None:
        try:
            sock.settimeout(0.2)
            sock.sendall(encode_reply(None, ok=False, error=message))
        except OSError:
            pass
        finally:
            sock.close()

    def _read(self, conn: _Connection, *, recv: bool = True) -> None:
        now = time.monotonic()
        self._refill(conn, now)
        if conn.throttled_until:
            return
        if recv:
            budget = int(min(conn.bytes, self._total_bytes, 65536))
            if budget < 1024:
                self._throttle(conn, now)
                return
            try:
                data = conn.sock.recv(budget)
            except (BlockingIOError, InterruptedError):
                return
            except OSError:
                data = b""
            if not data:
                self._drop(conn)
                return
            conn.bytes -= len(data)
            self._total_bytes -= len(data)
            conn.inbuf += data
        buf = conn.inbuf
        while not conn.closed:
            nl = buf.find(b"\n")
            if conn.skipping:
                if nl < 0:
                    buf.clear()
                    return
                del buf[: nl + 1]
                conn.skipping = False
                continue
            if nl < 0:
                if len(buf) >= MAX_REQUEST_BYTES:
                    buf.clear()
                    conn.skipping = True
                    self.rejected += 1
                    self._send(conn, encode_reply(None, ok=False, error=(
                        f"message too large (over {MAX_REQUEST_BYTES} bytes without a newline); "
                        "it was discarded"
                    )))  # fmt: skip
                return
            if conn.lines < 1 or self._total_lines < 1:
                self._throttle(conn, now)  # the rest of the buffer waits for the budget
                return
            conn.lines -= 1
            self._total_lines -= 1
            line = bytes(buf[:nl])
            del buf[: nl + 1]
            conn.last_request = now
            if line.strip():
                self._handle(conn, line)

    def _handle(self, conn: _Connection, line: bytes) -> None:
        try:
            command = parse_request(line)
        except CommandError as exc:
            self.rejected += 1
            self._send(conn, encode_reply(exc.request_id, ok=False, error=exc.message))
            return
        conn.valid += 1
        if command.name == "hello":
            data = dict(self.hello)
            data.update(
                protocol=PROTOCOL_VERSION, commands=list(COMMANDS), subscribe=self.subscribe_mode
            )
            self._send(conn, encode_reply(command.id, ok=True, data=data))
            return
        if command.name == "subscribe":
            self._subscribe(conn, command)
            return
        if command.name == "pause":
            conn.holds_pause = True
            self._pause_holders.add(conn)
        elif command.name == "resume":
            for holder in self._pause_holders:
                holder.holds_pause = False
            self._pause_holders.clear()
        self._queue.append(PendingCommand(command, conn, self))
        self._arrived.set()

    def _send(self, conn: _Connection, line: bytes) -> None:
        """Queue a line for ``conn`` from any thread; the server thread sends it."""
        if conn.closed:
            return
        conn.outbox.append(line)
        if threading.current_thread() is not self._thread:
            self._wake()

    def _flush(self, conn: _Connection) -> None:
        while conn.outbox:
            try:
                conn.outbuf += conn.outbox.popleft()
            except IndexError:
                break
        if len(conn.outbuf) > MAX_OUTBOX_BYTES:
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

    def _drop(self, conn: _Connection, *, lift_pause: bool = True, close: bool = True) -> None:
        if conn.closed:
            return
        conn.closed = True
        self._conns.pop(conn.fd, None)
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
        if conn in self._pause_holders:
            self._pause_holders.discard(conn)
            if lift_pause and not self._pause_holders:
                resume = Command(
                    "resume", {"reason": "the monitor that paused training disconnected"}
                )
                self._queue.append(PendingCommand(resume, None, self, synthetic=True))
                self._arrived.set()

    # -- subscribe: hand the connection to a streamer --------------------------------------------
    def _subscribe(self, conn: _Connection, command: Command) -> None:
        ring, run_dir = self.hello.get("ring"), self.hello.get("run_dir")
        if self.subscribe_mode == "off" or not ring or not run_dir:
            why = (
                "streaming is off for this run"
                if self.subscribe_mode == "off"
                else ("this run has no ring file to stream")
            )
            self._send(conn, encode_reply(command.id, ok=False, error=why))
            return
        self._flush(conn)  # anything still owed on this connection goes out before the stream
        sock = conn.sock
        owed = bytes(conn.outbuf)
        self._drop(conn, close=False)
        try:
            sock.settimeout(2.0)
            if owed:
                sock.sendall(owed)
            sock.settimeout(None)
        except OSError:
            sock.close()
            return
        request = {"id": command.id, "args": command.args}
        if self.subscribe_mode == "process":
            try:
                self._children.append(_spawn_streamer(sock, ring, run_dir, request))
                sock.close()
                return
            except OSError as exc:
                log.debug(
                    "nnwatch: cannot start a stream process (%r); streaming from a thread", exc
                )
        from nnwatch.channel.stream import serve_subscription

        def run() -> None:
            try:
                serve_subscription(sock, ring_path=Path(ring), run_dir=Path(run_dir),
                                   request=request, mode="thread")  # fmt: skip
            finally:
                sock.close()

        t = threading.Thread(target=run, name="nnwatch-stream", daemon=True)
        self._stream_threads = [x for x in self._stream_threads if x.is_alive()] + [t]
        t.start()


def _spawn_streamer(
    sock: socket.socket, ring: str, run_dir: str, request: dict[str, Any]
) -> subprocess.Popen[bytes]:
    fd = sock.fileno()
    env = dict(os.environ)
    package_parent = str(Path(__file__).resolve().parents[2])
    env["PYTHONPATH"] = package_parent + (
        os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else ""
    )
    return subprocess.Popen(
        [
            sys.executable, "-m", "nnwatch.channel.stream", "--fd", str(fd), "--ring", str(ring),
            "--run-dir", str(run_dir), "--request", json.dumps(request),
        ],
        pass_fds=(fd,),
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
        env=env,
    )  # fmt: skip


def wait_for_socket(path: Path, timeout: float = 5.0) -> bool:
    """Poll until a socket file exists at ``path`` (for tests and launchers)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if os.path.exists(path):
            return True
        time.sleep(0.01)
    return False
