"""Who may hold a connection to the command socket, and for how long.

Peers of another uid are turned away by SO_PEERCRED. New connections are accepted at a bounded
rate (a connect/disconnect storm waits in the kernel's listen backlog, not in Python). When every
slot is taken, a newcomer gets one: the server closes the connection that never sent a valid
request, else the one silent longest, never one that holds a pause. Connections that send nothing
are closed after a while, with the reason.
"""

from __future__ import annotations

import socket
import struct
from collections.abc import Iterable

from nnwatch.channel.commands import encode_reply
from nnwatch.channel.connection import Connection
from nnwatch.channel.limits import Bucket, Limits

_PEERCRED = struct.Struct("3i")  # pid, uid, gid


class Doorman:
    """The accept policy of one server: uid check, accept rate, eviction, timeouts."""

    def __init__(self, uid: int, limits: Limits, now: float) -> None:
        self.uid = uid
        self.limits = limits
        self.accepts = Bucket(limits.accepts_burst, limits.accepts_burst, now)
        self.refused = 0  # peers of another uid, turned away
        self.evicted = 0  # connections closed to make room, or for sending only junk
        self.timed_out = 0  # connections closed for silence

    def accept_wait(self, now: float) -> float:
        """0 when one more connection may be accepted now (and counts it), else how long until
        one may."""
        rate = self.limits.accepts_per_s
        if self.accepts.refill(now, rate) >= 1:
            self.accepts.tokens -= 1
            return 0.0
        return self.accepts.wait(1, rate)

    def peer(self, sock: socket.socket) -> tuple[int, str]:
        """The peer's pid, and why it is refused (empty when it is not)."""
        pid, uid, _gid = _PEERCRED.unpack(
            sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, _PEERCRED.size)
        )
        if uid != self.uid:
            self.refused += 1
            return pid, f"refused: this run belongs to uid {self.uid}; you are uid {uid}"
        return pid, ""

    def victim(self, conns: Iterable[Connection]) -> Connection | None:
        """The connection to close so that a new monitor gets in: first one that never sent a valid
        request, then the one silent longest; never one that holds a pause."""
        candidates = [c for c in conns if not c.holds_pause]
        if not candidates:
            return None
        self.evicted += 1
        return min(candidates, key=lambda c: (c.valid > 0, c.last_request or c.connected))

    def expired(self, conns: Iterable[Connection], now: float) -> list[tuple[Connection, str]]:
        """Connections to close for silence, with the reason to tell them."""
        lim = self.limits
        out = []
        for conn in conns:
            if conn.closed:
                continue
            if conn.holds_pause:
                heard = conn.last_request if conn.last_request is not None else conn.connected
                if now - heard <= lim.pause_lease:
                    continue
                why = (
                    f"closed: held a pause but sent nothing for {lim.pause_lease:g} s; "
                    "the pause is lifted (a monitor renews it with any request)"
                )
            elif conn.last_request is None and now - conn.connected > lim.handshake_timeout:
                why = f"closed: no request within {lim.handshake_timeout:g} s of connecting"
            elif conn.last_request is not None and now - conn.last_request > lim.idle_timeout:
                why = f"closed: idle for {lim.idle_timeout:g} s (reconnect to send more)"
            else:
                continue
            self.timed_out += 1
            out.append((conn, why))
        return out

    def junk_only(self, conn: Connection) -> str:
        """Why ``conn`` is closed for sending only malformed requests (empty when it is not)."""
        if conn.bad_streak < self.limits.bad_streak:
            return ""
        self.evicted += 1
        return (
            f"closed: {conn.bad_streak} malformed requests in a row; send one JSON object per "
            'line, e.g. {"cmd": "hello"}'
        )


def refuse(sock: socket.socket, message: str) -> None:
    """Tell a peer why it is not served (best effort, briefly), and close it."""
    try:
        sock.settimeout(0.2)
        sock.sendall(encode_reply(None, ok=False, error=message))
    except OSError:
        pass
    finally:
        sock.close()
