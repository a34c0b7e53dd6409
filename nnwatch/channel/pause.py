"""The pause, one rule from the key to the trainer.

**The rule.** A pause holds until someone lifts it (``resume``) for as long as its holder, the
monitor or ``nnwatch ctl`` that asked for it, is there to renew it. The holder sends ``renew`` on
the connection that paused every :data:`RENEW_S` seconds; the run lifts the pause by itself when
that connection closes, or when no word came on it for the server's lease
(``Limits.pause_lease``, 30 s). So a holder that lives holds the run for hours, through ssh too,
and one that is gone (killed, its laptop asleep, its link frozen) releases the run within the
lease: nobody can leave a job paused by walking away.

One owner per side, and every part names the commands by their constants
(:data:`~nnwatch.channel.commands.PAUSE`, ``RESUME``, ``RENEW``):

- the asking side: :class:`KeptConnection`, one kept-open command connection that takes the pause,
  renews it from a thread of its own (so no caller's poll loop has to remember to), lifts it, and
  knows whether it still holds it: the server's answer to ``renew`` says so;
- the run's command server: :class:`PauseBook`, the connections that hold the pause, and the
  synthetic ``resume`` when the last of them goes (the lease itself is judged with the other
  silences, in :mod:`nnwatch.channel.admission`);
- the training thread: ``CommandHandler.paused``, which ``pause`` and ``resume`` set, and the one
  pause loop (``RunEndpoint.at_step_boundary``) that holds the thread and writes "paused" into
  the ring's status for every reader.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from nnwatch.channel.client import ChannelClient, ChannelError
from nnwatch.channel.commands import HELLO, PAUSE, RENEW, RESUME, Command, CommandReply
from nnwatch.channel.connection import Connection

#: How often a holder renews its pause: a third of the server's 30 s lease.
RENEW_S = 10.0


class PauseBook:
    """The command server's record of which connections hold the pause."""

    def __init__(self, queue_resume: Callable[[Command], None]) -> None:
        """``queue_resume``: how a synthetic ``resume`` reaches the training thread."""
        self._queue_resume = queue_resume
        self.holders: set[Connection] = set()

    def taken(self, conn: Connection) -> None:
        """``conn`` asked for a pause (queued for the training thread)."""
        conn.holds_pause = True
        self.holders.add(conn)

    def lifted(self) -> None:
        """Someone asked to resume: no connection holds the pause any more."""
        for holder in self.holders:
            holder.holds_pause = False
        self.holders.clear()

    def holds(self, conn: Connection) -> bool:
        """The answer to ``renew``: the request itself renewed the lease (any request does)."""
        return conn in self.holders

    def dropped(self, conn: Connection, *, lift: bool) -> None:
        """``conn`` closed (or was closed for silence); the last holder's going lifts the pause."""
        if conn not in self.holders:
            return
        self.holders.discard(conn)
        if lift and not self.holders:
            self._queue_resume(
                Command(RESUME, {"reason": "the monitor that paused training disconnected"})
            )


class KeptConnection:
    """One monitor's command connection, kept open: it holds any pause it asked for and renews
    it by itself until the pause is lifted, the connection is lost, or :meth:`close`."""

    def __init__(
        self, path: Path | str, *, timeout: float = 10.0, renew_s: float = RENEW_S
    ) -> None:
        self.path = Path(path)
        self.timeout = timeout
        self.renew_s = renew_s
        self.client: ChannelClient | None = None
        #: Whether this connection holds a pause (as far as the run last said).
        self.holding = False
        #: Why a pause this connection held ended without being lifted here ("" while none did).
        self.lost = ""
        self._lock = threading.Lock()
        self._renew_with = RENEW  # HELLO for a run whose nnwatch predates ``renew``
        self._stop = threading.Event()
        self._renewer: threading.Thread | None = None

    def send(self, name: str, args: dict[str, Any] | None = None) -> CommandReply:
        """Send one command, reconnecting first if the run dropped the connection. Never resent:
        a lost reply may hide a command that was applied."""
        with self._lock:
            try:
                if self.client is None or not self.client.still_open():
                    if self.client is not None:
                        self.client.close()
                        self._forget("the connection that held the pause was lost")
                    self.client = ChannelClient(self.path, timeout=self.timeout)
                reply = self.client.request(name, args or {})
            except ChannelError as exc:
                self._drop_client("the connection that held the pause was lost")
                return CommandReply(False, error=str(exc))
            if name == PAUSE and (reply.ok or reply.pending):
                # delivered (a slow step may apply it late): the server holds it for us already
                self.holding, self.lost = True, ""
                self._start_renewing()
            elif name == RESUME and reply.ok:
                self.holding = False
        return reply

    def renew(self) -> bool:
        """Renew a pause this connection holds, now; whether it still holds one. Never waits
        for a command in flight (that command renews the lease too)."""
        if not self.holding:
            return False
        if not self._lock.acquire(blocking=False):
            return True
        try:
            if self.client is None or not self.client.still_open():
                self._drop_client("the run closed the connection that held the pause")
                return False
            wait = max(1.0, self.renew_s / 2)
            reply = self.client.request(self._renew_with, timeout=wait)
            if not reply.ok and not reply.pending and self._renew_with == RENEW:
                # a run older than ``renew``: any request renews its lease, ``hello`` will do
                self._renew_with = HELLO
                reply = self.client.request(HELLO, timeout=wait)
            if reply.ok and self._renew_with == RENEW and not reply.data.get("held"):
                self._forget("the run no longer counts this pause (resumed elsewhere, or lapsed)")
            elif not reply.ok and not reply.pending:  # the run said why it closes this connection
                self._drop_client(reply.error or "the run refused to renew the pause")
        except ChannelError as exc:
            self._drop_client(f"the connection that held the pause was lost: {exc}")
        finally:
            self._lock.release()
        return self.holding

    def _start_renewing(self) -> None:
        if self._renewer is not None and self._renewer.is_alive():
            return
        self._stop.clear()
        self._renewer = threading.Thread(target=self._renew_loop, name="nnwatch-pause", daemon=True)
        self._renewer.start()

    def _renew_loop(self) -> None:
        while not self._stop.wait(self.renew_s):
            if not self.renew():
                return

    def _forget(self, why: str) -> None:
        if self.holding:
            self.holding, self.lost = False, why

    def _drop_client(self, why: str) -> None:
        if self.client is not None:
            self.client.close()
            self.client = None
        self._forget(why)

    def close(self) -> None:
        """Close the connection: a pause it still holds lifts (the run's rule)."""
        self._stop.set()
        with self._lock:
            if self.client is not None:
                self.client.close()
                self.client = None
            self.holding = False
        renewer = self._renewer
        if renewer is not None and renewer is not threading.current_thread():
            renewer.join(timeout=5)


def hold_until(
    conns: list[KeptConnection], done: Callable[[], bool], poll: float = 0.1
) -> str:
    """Wait while ``done()`` is False and some connection still holds its pause (each renews its
    own); "" when ``done`` ended it, else why the last pause was lost."""
    while not done():
        if not any(c.holding for c in conns):
            return next((c.lost for c in conns if c.lost), "the pause was lifted")
        time.sleep(poll)
    return ""
