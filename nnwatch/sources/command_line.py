"""A monitor's kept-open command connection, and the pause it may hold.

A run lifts a pause when the connection that asked for it closes, or when that connection has
been silent for the server's pause lease (``Limits.pause_lease``, 30 s): a frozen link cannot
hold a run forever. While this monitor holds a pause, :meth:`CommandLine.keepalive` (called from
every poll) renews the lease with a ``hello`` every ``KEEPALIVE_S`` seconds.
"""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any

from nnwatch.channel.client import ChannelClient, ChannelError
from nnwatch.channel.commands import CommandReply

#: Seconds between keepalives while a pause is held (a third of the server's lease).
KEEPALIVE_S = 10.0


def send_once(
    client: ChannelClient | None, path: Path, timeout: float, name: str, args: dict[str, Any]
) -> tuple[ChannelClient | None, CommandReply]:
    """Send one command on a kept-open connection (it holds any pause), reconnecting first if
    the run dropped it. Never resent: a lost reply may hide a command that was applied."""
    try:
        if client is None or not client.still_open():
            if client is not None:
                client.close()
            client = ChannelClient(path, timeout=timeout)
        return client, client.request(name, args)
    except ChannelError as exc:
        if client is not None:
            client.close()
        return None, CommandReply(False, error=str(exc))


class CommandLine:
    """One connection for a monitor's commands; keeps a pause it asked for alive."""

    def __init__(self, timeout: float, keepalive_s: float = KEEPALIVE_S) -> None:
        self.timeout = timeout
        self.keepalive_s = keepalive_s
        self.client: ChannelClient | None = None
        self.pausing = False
        self._due = 0.0
        self._lock = threading.Lock()

    def send(self, path: Path, name: str, args: dict[str, Any]) -> CommandReply:
        with self._lock:
            self.client, reply = send_once(self.client, path, self.timeout, name, args)
            if reply.ok and name in ("pause", "resume"):
                self.pausing = name == "pause"
            elif name == "pause" and reply.error.startswith("no reply within"):
                self.pausing = True  # delivered, applied at a slow step's end: keep the lease
            self._due = time.monotonic() + self.keepalive_s
        return reply

    def keepalive(self) -> None:
        """Renew a pause this monitor holds; never waits for a command in flight."""
        if not self.pausing or time.monotonic() < self._due:
            return
        if not self._lock.acquire(blocking=False):
            return  # a command is on its way: that renews the lease too
        try:
            self._due = time.monotonic() + self.keepalive_s
            if self.client is None or not self.client.still_open():
                self.pausing = False  # the connection and the pause it held are gone
                return
            self.client.request("hello", timeout=self.keepalive_s / 2)
        except ChannelError:
            self.pausing = False
        finally:
            self._lock.release()

    def close(self) -> None:
        with self._lock:
            if self.client is not None:
                self.client.close()
                self.client = None
            self.pausing = False
