"""What the command socket lets its clients cost the trainer: rates, bursts, sizes and timeouts.

The command server's thread takes the GIL from the training thread whenever it works, so every
byte it parses and every line it answers slows a GIL-bound training loop. These limits bound that
work whatever a same-uid client sends: beyond a budget the server stops *reading* (the kernel's
socket buffer fills and the sender blocks on its own socket) instead of reading and discarding.

Rates are token buckets. A connection's rate is its fair share of the whole server's rate, capped
per connection, so that many connections together cost no more than one budget, and a quiet
monitor among flooders always has its own share at hand. A new connection starts with a small
allowance, so reconnecting does not buy a fresh burst.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from nnwatch.channel.commands import MAX_REQUEST_BYTES


@dataclass(frozen=True)
class Limits:
    """The command server's budgets (the defaults cost a GIL-bound loop about 1% at worst)."""

    max_connections: int = 32
    #: A client that does not read its replies is cut off once this much waits for it.
    max_outbox_bytes: int = 1024 * 1024
    #: Request lines per second: all connections together, one connection at most, its burst,
    #: and what a new connection may send before its bucket has filled.
    total_lines_per_s: float = 200.0
    lines_per_s: float = 20.0
    lines_burst: float = 64.0
    first_lines: float = 4.0
    #: The same for bytes read; the burst holds two requests of the largest size.
    total_bytes_per_s: float = 512.0 * 1024
    bytes_per_s: float = 64.0 * 1024
    bytes_burst: float = 2.0 * MAX_REQUEST_BYTES
    first_bytes: float = 16.0 * 1024
    #: Commands the training thread applies (each costs it a step-boundary call and an event).
    total_trainer_per_s: float = 20.0
    trainer_per_s: float = 5.0
    trainer_burst: float = 16.0
    first_trainer: float = 4.0
    #: Commands waiting for a step boundary; more are refused with the reason (a hung trainer).
    max_pending: int = 64
    #: New connections accepted per second (and a burst); the rest wait in the listen backlog.
    accepts_per_s: float = 64.0
    accepts_burst: float = 16.0
    #: A connection that sends this many malformed requests in a row is closed with the reason.
    bad_streak: int = 32
    #: A connection with no complete request this long after connecting is closed; so is one silent
    #: this long, unless it holds a pause (its monitor is the one to lift it).
    handshake_timeout: float = 10.0
    idle_timeout: float = 120.0
    #: A pause is a lease: its holder must send something (a ``hello`` keepalive will do) this
    #: often, or the connection is closed and the pause lifted. A frozen link cannot hold a run.
    pause_lease: float = 30.0
    #: A throttled connection is not read again for at least this long, and wake-ups are rounded
    #: up to this grid, so that throttled connections cost few wake-ups, together.
    min_pause: float = 0.1
    #: Bytes asked of the kernel per read at most, and at least (below it, wait for the budget).
    read_max: int = 65536
    read_min: int = 1024

    @staticmethod
    def share(per_connection: float, total: float, connections: int) -> float:
        """One connection's rate: its fair share of ``total``, at most ``per_connection``."""
        return min(per_connection, total / max(1, connections))

    def wake_at(self, now: float, wait: float) -> float:
        """When a connection throttled at ``now`` for ``wait`` seconds is read again."""
        at = now + max(self.min_pause, wait)
        return math.ceil(at / self.min_pause) * self.min_pause


class Bucket:
    """A token bucket: ``tokens`` grow at the rate given to :meth:`refill`, up to ``cap``."""

    __slots__ = ("cap", "stamp", "tokens")

    def __init__(self, tokens: float, cap: float, now: float) -> None:
        self.tokens = min(tokens, cap)
        self.cap = cap
        self.stamp = now

    def refill(self, now: float, rate: float) -> float:
        self.tokens = min(self.cap, self.tokens + (now - self.stamp) * rate)
        self.stamp = now
        return self.tokens

    def wait(self, need: float, rate: float) -> float:
        """Seconds until the bucket holds ``need`` tokens at ``rate``."""
        return max(0.0, (min(need, self.cap) - self.tokens) / rate) if rate > 0 else math.inf
