"""How and when one rank of a job stopped, and whose fault it was, from what its files say.

:mod:`nnwatch.store.job_health` compares the ranks of a job; each rank's part of that comparison
starts here, one rank at a time: its ``end.json`` (or the ``exit.json`` that stands in for it)
read into a time span, a kind of end and a cause (its own, from outside, or a peer's), or, for
a rank that vanished without a word, the heartbeat period after its last beat. Pure logic on a
few numbers per rank, like the comparison.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import Any, Protocol

#: The trainer's heartbeat thread beats once a second; a silent death lies within this (plus a
#: little scheduling slack) after the last beat.
HEARTBEAT_PERIOD = 1.0
SILENT_SLACK = 0.5
#: What a rank's exception says when its collective failed because a peer went away.
_PEER = re.compile(
    r"connection (closed|reset|refused)|by peer|broken pipe|gloo|nccl|collective|watchdog|"
    r"timed? ?out|process ?group|rendezvous",
    re.IGNORECASE,
)
#: What an ending says when a signal ended the rank from outside (the launcher, a scheduler).
_OUTSIDE = re.compile(r"sigterm|signal 15|terminated|\bsignal\b", re.IGNORECASE)
_DIST_ERRORS = frozenset({"DistBackendError", "DistNetworkError", "DistStoreError", "DistError"})
#: Signals sent on purpose from outside; any other (SIGKILL, SIGSEGV, ...) is the rank's own end.
_FROM_OUTSIDE = frozenset({"SIGTERM", "SIGINT", "SIGHUP"})
DETAIL_MAX = 160


class RankRun(Protocol):
    """What is read of each rank (a ``RunInfo`` has it all)."""

    @property
    def rank(self) -> int: ...
    @property
    def state(self) -> str: ...
    @property
    def step(self) -> int | None: ...
    @property
    def heartbeat_at(self) -> float | None: ...
    @property
    def last_step_at(self) -> float | None: ...
    @property
    def step_interval(self) -> float | None: ...
    @property
    def ending(self) -> dict[str, Any] | None: ...
    @property
    def alive(self) -> bool | None: ...
    @property
    def heartbeat_age(self) -> float | None: ...
    @property
    def seen_first_at(self) -> float | None: ...


@dataclass(frozen=True)
class _Stop:
    rank: int
    lo: float  # earliest possible stop time (NaN: unknown)
    hi: float  # latest possible stop time
    how: str
    detail: str
    #: "own" (its own failure: an exception, an exit status, a kill), "outside" (a signal sent to
    #: it: the launcher's teardown, a scheduler) or "peer" (its collective failed: a peer went first)
    cause: str

    @property
    def consequence(self) -> bool:
        return self.cause != "own"


def _short(text: str) -> str:
    text = " ".join(str(text).split())
    return text if len(text) <= DETAIL_MAX else text[: DETAIL_MAX - 1] + "…"


def _span(end: dict[str, Any], hb: float | None) -> tuple[float, float]:
    t = end.get("ended")
    if isinstance(t, (int, float)):
        return float(t), float(t)
    if hb is not None:
        return hb, hb + HEARTBEAT_PERIOD + SILENT_SLACK
    return math.nan, math.nan


def _how_it_ended(end: dict[str, Any]) -> tuple[str, str, str]:
    """(how, detail, cause) from ``end.json`` (or the ``exit.json`` that stands in for it)."""
    status = str(end.get("status", "finished"))
    reason = str(end.get("reason") or "")
    exc = end.get("exception") if isinstance(end.get("exception"), dict) else None
    detail = f"{exc.get('type', 'Exception')}: {exc.get('message', '')}".rstrip(": ") if exc else reason
    sig = end.get("signal") if isinstance(end.get("signal"), str) else ""
    seen = str(end.get("observed_by") or "")
    if sig and sig not in _FROM_OUTSIDE and not exc:
        by = f"by {sig}" + (f", seen by {seen}" if seen and seen != "the process itself" else "")
        return "killed", by, "own"
    if sig and not exc:
        return "terminated", f"{sig} ({reason})" if reason and sig not in reason else reason or sig, "outside"
    peer = bool(_PEER.search(detail)) or (exc is not None and str(exc.get("type")) in _DIST_ERRORS)
    outside = bool(_OUTSIDE.search(detail))
    if status == "interrupted":
        return ("terminated", detail, "outside") if (outside or peer) else ("interrupted", detail, "own")
    if exc:
        if peer:
            return "collective failed", detail, "peer"
        return ("terminated", detail, "outside") if outside else ("crashed", detail, "own")
    if isinstance(end.get("exit_code"), int):
        return "exited", detail or f"exit status {end['exit_code']}", "own"
    if peer:
        return "collective failed", detail, "peer"
    return ("terminated", detail, "outside") if outside else ("crashed", detail, "own")


def stop_of(run: RankRun) -> _Stop | None:
    """How and when one rank stopped; None while it runs, and for a clean finish."""
    end = run.ending
    hb = run.heartbeat_at if run.heartbeat_at is not None else run.last_step_at
    if end is not None:
        if str(end.get("status", "finished")) == "finished":
            return None
        lo, hi = _span(end, hb)
        how, detail, cause = _how_it_ended(end)
        return _Stop(run.rank, lo, hi, how, _short(detail), cause)
    if run.alive is False or (run.state == "crashed" and run.alive is None):
        # gone without a word: it died after its last heartbeat, within about one period
        if hb is None:
            return _Stop(run.rank, math.nan, math.nan, "killed", "", "own")
        return _Stop(run.rank, hb, hb + HEARTBEAT_PERIOD + SILENT_SLACK, "killed", "", "own")
    return None
