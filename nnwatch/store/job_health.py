"""Which rank stopped a distributed job, and how; which rank a stalled job is waiting for.

When one rank of a torchrun job dies, the others follow within a second: their next collective
fails (gloo: "Connection reset by peer"), or the launcher terminates them. Judged one by one,
every rank then reads "crashed", and the one that matters, the first, is lost among them. And
while a rank is dead or frozen but the others live, the others only look idle ("no step for
11 s"), when in fact they wait in a collective for that one rank.

This module compares the ranks of one job, from what any reader can see of each (a
:class:`~nnwatch.store.registry.RunInfo`): ``end.json`` with its time and reason, the ring's last
heartbeat and last step, and whether the pid lives.

- A rank that ended with ``end.json`` stopped at its ``ended`` time, exactly. One that vanished
  without it (SIGKILL, the OOM killer, ``os._exit``, a segfault) died after its last heartbeat and
  at most about a heartbeat period (1 s) later.
- A stop that is a *consequence* (a failed collective, a peer that closed its connection, a
  termination signal) never counts as first while a rank stopped for its own reason.
- The first rank is the one whose stop came earliest. Two silent deaths less than a heartbeat
  apart cannot be ordered from the files: both are named, and the words say so. A monitor that
  was watching at the time knows better, and passes what it saw as ``known_first``.
- Every later stop (not a clean finish) is marked as stopped by the launcher after the first.
- A live rank that has made no step for a while (``stalled``) while another rank is dead, frozen
  (no heartbeat) or behind it, waits in a collective for that rank: the rank that holds the job.

Pure logic on a few numbers per rank: no I/O here, so ``nnwatch ls``, the ranks pane and tests
share one judgement.
"""

from __future__ import annotations

import math
import re
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from nnwatch.store.health import HEARTBEAT_STALE

#: The trainer's heartbeat thread beats once a second; a silent death lies within this (plus a
#: little scheduling slack) after the last beat.
HEARTBEAT_PERIOD = 1.0
SILENT_SLACK = 0.5
#: A live rank with no step for this many usual step times (and at least STALL_MIN seconds)
#: while another rank holds the job is waiting for it.
STALL_FACTOR = 5.0
STALL_MIN = 2.0
#: What a rank's exception says when it stopped because a peer went away, not for its own reason.
_CONSEQUENCE = re.compile(
    r"connection (closed|reset|refused)|by peer|broken pipe|gloo|nccl|collective|watchdog|"
    r"timed? ?out|process ?group|rendezvous|sigterm|signal 15|terminated|\bsignal\b",
    re.IGNORECASE,
)
_DIST_ERRORS = frozenset({"DistBackendError", "DistNetworkError", "DistStoreError", "DistError"})
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
class RankStop:
    """What stands out about one rank of the job.

    ``role``: ``first`` (stopped first), ``stopped_by_launcher`` (stopped after it), ``holds``
    (alive but frozen or behind, while the others wait for it) or ``waiting`` (alive, in a
    collective, waiting for the rank that holds the job).
    """

    rank: int
    role: str
    how: str  # killed, crashed, exited, interrupted, collective failed, terminated, frozen, ...
    at: float | None  # when it stopped, froze, or (waiting) made its last step; wall time
    words: str  # plain words for one rank: "killed at 12:03:04", "stopped by the launcher ..."
    detail: str = ""  # the exception or reason, when there is one

    @property
    def status(self) -> str:
        """One word for a STATUS column."""
        return {
            "first": self.how if self.how in ("killed", "crashed", "exited", "interrupted") else "crashed",
            "stopped_by_launcher": "stopped",
            "holds": "frozen" if self.how == "frozen" else "behind",
            "waiting": "waiting",
        }.get(self.role, self.role)  # fmt: skip

    @property
    def short(self) -> str:
        """A few words for a table cell (the ranks pane's note column)."""
        if self.role == "first":
            return f"← stopped first ({self.how}, {clock(self.at)})"
        if self.role == "stopped_by_launcher":
            return f"stopped by the launcher ({clock(self.at)})"
        if self.role == "holds":
            return f"← holds the job ({self.how} since {clock(self.at)})"
        return f"waits in a collective since {clock(self.at)}"

    def to_dict(self) -> dict[str, Any]:
        return {
            "role": self.role, "how": self.how, "at": self.at, "words": self.words,
            "detail": self.detail, "status": self.status,
        }  # fmt: skip


@dataclass(frozen=True)
class JobStops:
    """The job's story in one line, and each rank's part in it (ranks with nothing to say left out)."""

    ranks: dict[int, RankStop] = field(default_factory=dict)
    first: tuple[int, ...] = ()  # the rank(s) that stopped first
    first_at: float | None = None
    first_how: str = ""
    holders: tuple[int, ...] = ()  # ranks the live ones wait for (dead first ranks included)
    waiting: tuple[int, ...] = ()
    summary: str = ""  # "" when nothing stands out (running, or every rank finished)

    def to_dict(self) -> dict[str, Any]:
        return {
            "first": list(self.first), "first_at": self.first_at, "first_how": self.first_how,
            "holders": list(self.holders), "waiting": list(self.waiting), "summary": self.summary,
        }  # fmt: skip


@dataclass(frozen=True)
class _Stop:
    rank: int
    lo: float  # earliest possible stop time (NaN: unknown)
    hi: float  # latest possible stop time
    how: str
    detail: str
    consequence: bool


def clock(t: float | None) -> str:
    """A wall time as the user's local HH:MM:SS."""
    if t is None or not math.isfinite(t):
        return "an unknown time"
    return time.strftime("%H:%M:%S", time.localtime(t))


def _join(items: Iterable[Any]) -> str:
    items = [str(i) for i in items]
    return str(items[0] if len(items) == 1 else ", ".join(items[:-1]) + " and " + items[-1])


def _ranks(ranks: Sequence[int]) -> str:
    return f"rank{'s' if len(ranks) > 1 else ''} {_join(ranks)}"


def _short(text: str) -> str:
    text = " ".join(str(text).split())
    return text if len(text) <= DETAIL_MAX else text[: DETAIL_MAX - 1] + "…"


def stop_of(run: RankRun) -> _Stop | None:
    """How and when one rank stopped; None while it runs, and for a clean finish."""
    end = run.ending
    hb = run.heartbeat_at if run.heartbeat_at is not None else run.last_step_at
    if end is not None:
        status = str(end.get("status", "finished"))
        if status == "finished":
            return None
        t = end.get("ended")
        if isinstance(t, (int, float)):
            lo = hi = float(t)
        elif hb is not None:
            lo, hi = hb, hb + HEARTBEAT_PERIOD + SILENT_SLACK
        else:
            lo = hi = math.nan
        reason = str(end.get("reason") or "")
        exc = end.get("exception") if isinstance(end.get("exception"), dict) else None
        if exc:
            detail = f"{exc.get('type', 'Exception')}: {exc.get('message', '')}".rstrip(": ")
        else:
            detail = reason
        consequence = bool(_CONSEQUENCE.search(detail)) or (
            exc is not None and str(exc.get("type")) in _DIST_ERRORS
        )
        if status == "interrupted":
            how = "terminated" if consequence else "interrupted"
        elif exc:
            how = "collective failed" if consequence else "crashed"
        elif isinstance(end.get("exit_code"), int):
            how = "exited"
            detail = detail or f"exit status {end['exit_code']}"
        else:
            how = "terminated" if consequence else "crashed"
        return _Stop(run.rank, lo, hi, how, _short(detail), consequence)
    if run.alive is False or (run.state == "crashed" and run.alive is None):
        # gone without a word: it died after its last heartbeat, within about one period
        if hb is None:
            return _Stop(run.rank, math.nan, math.nan, "killed", "", False)
        return _Stop(run.rank, hb, hb + HEARTBEAT_PERIOD + SILENT_SLACK, "killed", "", False)
    return None


def _stalled(run: RankRun, now: float) -> bool:
    if run.last_step_at is None:
        return False
    limit = max(STALL_MIN, STALL_FACTOR * (run.step_interval or 0.0))
    return now - run.last_step_at > limit


def _frozen(run: RankRun, now: float) -> bool:
    return run.heartbeat_at is not None and now - run.heartbeat_at > HEARTBEAT_STALE


def _first_words(s: _Stop) -> str:
    at = clock(s.lo)
    if s.how == "killed":
        return (
            f"killed at {at} (its process vanished without a word: SIGKILL, the OOM killer, "
            "os._exit or a segfault)"
        )
    verb = {"exited": "exited", "interrupted": "interrupted"}.get(s.how, "crashed")
    return f"{verb} at {at}" + (f" ({s.detail})" if s.detail else "")


def _first_line(s: _Stop) -> str:
    """ "rank 1 died at 12:03:04 (killed)", "rank 1 crashed at 12:03:04 (OSError: ...)"."""
    at = clock(s.lo)
    if s.how == "killed":
        return f"rank {s.rank} died at {at} (killed)"
    verb = {"exited": "exited", "interrupted": "was interrupted"}.get(s.how, "crashed")
    return f"rank {s.rank} {verb} at {at}" + (f" ({s.detail})" if s.detail else "")


def _after_words(s: _Stop, who: str) -> str:
    at = clock(s.lo)
    if s.how == "collective failed":
        return f"stopped at {at}, after rank {who}: its collective failed ({s.detail})"
    if s.how == "killed":
        return f"stopped by the launcher at {at}, after rank {who} (ended from outside)"
    why = f"{s.how}: {s.detail}" if s.detail else s.how
    return f"stopped by the launcher at {at}, after rank {who} ({why})"


def _finite(t: float) -> float | None:
    return t if math.isfinite(t) else None


def _pick_first(stops: dict[int, _Stop], known_first: Sequence[int]) -> tuple[int, ...]:
    known = [r for r in known_first if r in stops]
    if known:
        return tuple(sorted(known))
    pool = [s for s in stops.values() if not s.consequence] or list(stops.values())
    timed = [s for s in pool if math.isfinite(s.lo)]
    if not timed:
        return tuple(sorted(s.rank for s in pool))
    head = min(timed, key=lambda s: (s.lo, s.rank))
    # stops that may have come before the earliest one was over cannot be ordered
    return tuple(sorted(s.rank for s in timed if s.lo <= head.hi))


def certain_first(runs: Sequence[RankRun], stops: JobStops) -> tuple[int, ...]:
    """The first rank(s), when no doubt is possible: they stopped while every other rank still
    lives. A reader that sees this should record it (``registry.note_first_stop``)."""
    if not stops.first:
        return ()
    others = [r for r in runs if r.rank not in stops.first]
    if others and all(r.ending is None and r.alive for r in others):
        return stops.first
    return ()


def judge_job(
    runs: Sequence[RankRun], *, now: float | None = None, known_first: Sequence[int] = ()
) -> JobStops:
    """The story of one job's ranks right now (see the module docstring). ``known_first``: ranks
    a reader saw stop first; ranks whose run records that (``seen_first_at``) count as such too."""
    now = time.time() if now is None else now
    if len(runs) < 2:
        return JobStops()
    stops = {s.rank: s for s in (stop_of(r) for r in runs) if s is not None}
    seen = [r.rank for r in runs if getattr(r, "seen_first_at", None) is not None]
    known_first = list(known_first) or seen
    out: dict[int, RankStop] = {}
    parts: list[str] = []

    if len(stops) > 1 and all(s.how == "interrupted" for s in stops.values()):
        # Ctrl-C reaches every rank at once: none of them went first
        for s in stops.values():
            out[s.rank] = RankStop(
                s.rank, "stopped_by_launcher", s.how, _finite(s.lo), _first_words(s), s.detail
            )
        at = min((s.lo for s in stops.values() if math.isfinite(s.lo)), default=math.nan)
        return JobStops(out, summary=f"{_ranks(sorted(stops))} were interrupted at {clock(at)}")

    first = _pick_first(stops, known_first) if stops else ()
    heads = [stops[r] for r in first]
    first_at = min((s.lo for s in heads if math.isfinite(s.lo)), default=None)
    for s in heads:
        out[s.rank] = RankStop(s.rank, "first", s.how, _finite(s.lo), _first_words(s), s.detail)
    if len(heads) == 1:
        parts.append(_first_line(heads[0]) + ", the first rank to stop")
    elif heads:
        hows = ", ".join(sorted({s.how for s in heads}))
        parts.append(
            f"{_ranks(first)} stopped within a second of each other at {clock(first_at)} "
            f"({hows}); nnwatch cannot tell which went first"
        )
    after = sorted(
        (s for r, s in stops.items() if r not in first),
        key=lambda s: (s.lo if math.isfinite(s.lo) else math.inf, s.rank),
    )
    for s in after:
        words = _after_words(s, _join(first))
        out[s.rank] = RankStop(s.rank, "stopped_by_launcher", s.how, _finite(s.lo), words, s.detail)
    if after:
        them = "it" if len(first) == 1 else "them"
        parts.append(
            f"{_ranks([s.rank for s in after])} stopped after {them}, as the launcher ends a job"
        )

    # the live ranks: who holds the job, and who waits for it
    live = [r for r in runs if r.rank not in stops and r.ending is None and r.alive is not False]
    holders = list(first)
    frozen = [r for r in live if _frozen(r, now)]
    for r in frozen:
        words = (
            f"frozen since {clock(r.heartbeat_at)} (no heartbeat: the process is stopped, or "
            "stuck holding the GIL)"
        )
        out[r.rank] = RankStop(r.rank, "holds", "frozen", r.heartbeat_at, words)
        holders.append(r.rank)
        parts.append(f"rank {r.rank} is {words}")
    moving = [r for r in live if r not in frozen]
    stalled = [r for r in moving if _stalled(r, now)]
    if not holders and len(moving) > 1 and len(stalled) == len(moving):
        # everyone alive has stopped stepping: the ones left behind hold the others
        steps = [r.step for r in moving if r.step is not None]
        if steps and min(steps) < max(steps):
            low = min(steps)
            behind = [r for r in moving if r.step == low]
            for r in behind:
                words = (
                    f"stopped stepping at step {low} ({clock(r.last_step_at)}); the others went on"
                )
                out[r.rank] = RankStop(r.rank, "holds", "behind", r.last_step_at, words)
                holders.append(r.rank)
            parts.append(f"{_ranks([r.rank for r in behind])} stopped stepping at step {low}")
    waiting = [r for r in stalled if r.rank not in holders] if holders else []
    if waiting:
        since = min(r.last_step_at for r in waiting if r.last_step_at is not None)
        held_by = _ranks(sorted(set(holders)))
        for r in waiting:
            words = f"waits in a collective since {clock(r.last_step_at)}, for {held_by}"
            out[r.rank] = RankStop(r.rank, "waiting", "waiting", r.last_step_at, words)
        verb = "waits" if len(waiting) == 1 else "wait"
        parts.append(
            f"{_ranks([r.rank for r in waiting])} {verb} in a collective since {clock(since)}"
        )
    return JobStops(
        out, first, first_at, heads[0].how if heads else "", tuple(sorted(set(holders))),
        tuple(r.rank for r in waiting), "; ".join(parts),
    )  # fmt: skip
