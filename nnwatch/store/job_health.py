"""Which rank stopped a distributed job, and how; which rank a stalled job is waiting for.

When one rank of a torchrun job dies, the others follow within a second: their next collective
fails (gloo: "Connection reset by peer"), or the launcher terminates them. Judged one by one,
every rank then reads "crashed", and the one that matters, the first, is lost among them. And
while a rank is dead or frozen but the others live, the others only look idle ("no step for
11 s"), when in fact they wait in a collective for that one rank.

This module compares the ranks of one job, from what any reader can see of each (a
:class:`~nnwatch.store.registry.RunInfo`): ``end.json`` with its time and reason, the ring's last
heartbeat and last step, and whether the pid lives.

- A rank that ended with ``end.json`` stopped at its ``ended`` time, exactly; so did one whose
  ``exit.json`` says how it ended when ``end.json`` could not be written (a SIGTERM's first act,
  or a node-mate that read a SIGKILL's exit status: :mod:`nnwatch.store.exit_note`). One that
  vanished without a word died after its last heartbeat and at most about a heartbeat period
  (1 s) later.
- Each stop has a cause: its *own* (an exception, an exit status, a kill), from *outside* (a
  SIGTERM: the launcher tearing the job down, a scheduler) or a *peer* (its collective failed:
  "Connection reset by peer", a gloo or NCCL error). The first rank is the earliest of those
  that stopped for a reason of their own; failing that, a rank terminated from outside before
  any collective failed. A rank whose collective failed is never first: it is a victim.
- Two stops less than a heartbeat apart cannot be ordered from the files: both are named, and
  the words say so. A monitor that was watching at the time knows better, and passes what it
  saw as ``known_first``.
- Every later stop is a victim: stopped by the launcher, or failed in a collective.
- When the job's other ranks are not seen (``missing``: on other nodes) and no rank seen stopped
  for a reason of its own, no rank is named first: the story says the first is elsewhere.
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
from typing import Any

from nnwatch.store.health import HEARTBEAT_STALE
from nnwatch.store.rank_end import _PEER, RankRun, _Stop, stop_of

#: A live rank with no step for this many usual step times (and at least STALL_MIN seconds)
#: while another rank holds the job is waiting for it.
STALL_FACTOR = 5.0
STALL_MIN = 2.0
#: The few words of a failed collective's error that say what happened (its summary's gist).
_GIST = re.compile(r"connection (closed|reset|refused)( by peer)?|broken pipe|timed? ?out|watchdog",
                   re.IGNORECASE)  # fmt: skip


@dataclass(frozen=True)
class RankStop:
    """What stands out about one rank of the job.

    ``role``: ``first`` (stopped first, for a reason of its own), ``stopped_by_launcher`` (ended
    from outside after it: torchrun's SIGTERM), ``victim`` (its collective failed because a peer
    was gone), ``holds`` (alive but frozen or behind, while the others wait for it) or
    ``waiting`` (alive, in a collective, waiting for the rank that holds the job).
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
            "victim": "victim",
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
        if self.role == "victim":
            return f"victim of a lost peer ({clock(self.at)})"
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


def clock(t: float | None) -> str:
    """A wall time as the user's local HH:MM:SS."""
    if t is None or not math.isfinite(t):
        return "an unknown time"
    return time.strftime("%H:%M:%S", time.localtime(t))


def join_words(items: Iterable[Any]) -> str:
    """``1``, ``1 and 2``, ``1, 2 and 3``."""
    items = [str(i) for i in items]
    return str(items[0] if len(items) == 1 else ", ".join(items[:-1]) + " and " + items[-1])


def _ranks(ranks: Sequence[int]) -> str:
    return f"rank{'s' if len(ranks) > 1 else ''} {join_words(ranks)}"


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
        if s.detail:
            return f"killed {s.detail} at {at}"
        return (
            f"killed at {at} (its process vanished without a word: SIGKILL, the OOM killer, "
            "os._exit or a segfault)"
        )
    verb = {"exited": "exited", "interrupted": "interrupted", "terminated": "terminated"}.get(
        s.how, "crashed"
    )
    return f"{verb} at {at}" + (f" ({s.detail})" if s.detail else "")


def _first_line(s: _Stop) -> str:
    """ "rank 1 died at 12:03:04 (killed by SIGKILL)", "rank 1 crashed at 12:03:04 (OSError: ...)"."""
    at = clock(s.lo)
    if s.how == "killed":
        return f"rank {s.rank} died at {at} (killed{' ' + s.detail if s.detail else ''})"
    verb = {"exited": "exited", "interrupted": "was interrupted", "terminated": "was terminated"}
    return f"rank {s.rank} {verb.get(s.how, 'crashed')} at {at}" + (f" ({s.detail})" if s.detail else "")


def _after_words(s: _Stop, who: str) -> str:
    at = clock(s.lo)
    if s.cause == "peer":
        return f"a victim of rank {who}: its collective failed at {at} ({s.detail})"
    if s.how == "killed":
        return f"stopped by the launcher at {at}, after rank {who} (ended from outside)"
    why = f"{s.how}: {s.detail}" if s.detail else s.how
    return f"stopped by the launcher at {at}, after rank {who} ({why})"


def _unexplained_words(s: _Stop) -> str:
    """A rank that stopped because of another, when the first rank is not among those seen."""
    at = clock(s.lo)
    if s.cause == "peer":
        return f"a victim of a lost peer: its collective failed at {at} ({s.detail})"
    return f"{s.how} at {at}" + (f" ({s.detail})" if s.detail else "") + ", from outside"


def _finite(t: float) -> float | None:
    return t if math.isfinite(t) else None


def _pick_first(stops: dict[int, _Stop], known_first: Sequence[int]) -> tuple[int, ...]:
    """The rank(s) that stopped first, for a reason of their own; () when none seen here did.

    A rank's own end (an exception, an exit status, a kill) comes first; else a signal sent to a
    rank from outside, when it came before any collective failed (a ``kill`` by hand, then the
    others lost their peer). A failed collective is never the first cause: its peer went first.
    """
    known = [r for r in known_first if r in stops]
    if known:
        return tuple(sorted(known))
    pool = [s for s in stops.values() if s.cause == "own"]
    if not pool:
        peer_at = min((s.lo for s in stops.values() if s.cause == "peer" and math.isfinite(s.lo)),
                      default=math.inf)  # fmt: skip
        pool = [s for s in stops.values()
                if s.cause == "outside" and math.isfinite(s.lo) and s.hi <= peer_at]  # fmt: skip
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


def _gist(detail: str) -> str:
    """A failed collective's error in a few words: "RuntimeError: connection closed by peer"
    rather than gloo's whole message (each rank's own words keep it whole)."""
    found = _GIST.search(detail) or _PEER.search(detail)
    if found is None:
        return detail
    kind = detail.split(":", 1)[0] if ":" in detail[:40] else ""
    return f"{kind}: {found.group(0)}" if kind else found.group(0)


def _ranges(ranks: Sequence[int]) -> str:
    """(2, 3, 4, 7) -> "2-4, 7"."""
    spans: list[tuple[int, int]] = []
    for r in sorted(ranks):
        if spans and spans[-1][1] == r - 1:
            spans[-1] = (spans[-1][0], r)
        else:
            spans.append((r, r))
    return ", ".join(f"{a}-{b}" if a != b else f"{a}" for a, b in spans)


def _story_of_stops(
    stops: dict[int, _Stop], first: tuple[int, ...], missing: Sequence[int]
) -> tuple[dict[int, RankStop], list[str]]:
    """Each stopped rank's part, and the story's first sentences."""
    out: dict[int, RankStop] = {}
    parts: list[str] = []
    heads = [stops[r] for r in first]
    here = " of the ranks seen here" if missing else ""
    for s in heads:
        out[s.rank] = RankStop(s.rank, "first", s.how, _finite(s.lo), _first_words(s), s.detail)
    if len(heads) == 1:
        parts.append(_first_line(heads[0]) + f", the first rank to stop{here}")
    elif heads:
        hows = ", ".join(sorted({s.how for s in heads}))
        at = min((s.lo for s in heads if math.isfinite(s.lo)), default=math.nan)
        parts.append(
            f"{_ranks(first)} stopped within a second of each other at {clock(at)} "
            f"({hows}); nnwatch cannot tell which went first"
        )
    after = sorted(
        (s for r, s in stops.items() if r not in first),
        key=lambda s: (s.lo if math.isfinite(s.lo) else math.inf, s.rank),
    )
    for s in after:
        role = "victim" if s.cause == "peer" else "stopped_by_launcher"
        words = _after_words(s, join_words(first)) if first else _unexplained_words(s)
        out[s.rank] = RankStop(s.rank, role, s.how, _finite(s.lo), words, s.detail)
    launcher = [s.rank for s in after if s.cause != "peer"]
    victims = [s for s in after if s.cause == "peer"]
    them = "it" if len(first) == 1 else "them"
    if first and launcher:
        parts.append(f"{_ranks(launcher)} stopped after {them}, as the launcher ends a job")
    if first and victims:
        parts.append(f"{_ranks([s.rank for s in victims])} failed in a collective, victims of the "
                     f"lost peer ({_gist(victims[0].detail)})")  # fmt: skip
    if not first and after:
        why = _gist(next((s.detail for s in after if s.cause == "peer"), after[0].detail))
        parts.append(f"{_ranks([s.rank for s in after])} stopped because a peer was lost ({why})")
        if missing:
            parts.append(f"the rank that stopped first is not among those seen here (ranks "
                         f"{_ranges(missing)} are on other nodes: name them with --hosts)")  # fmt: skip
        else:
            parts.append("no rank was seen stopping for a reason of its own first")
    return out, parts


def judge_job(
    runs: Sequence[RankRun],
    *,
    now: float | None = None,
    known_first: Sequence[int] = (),
    missing: Sequence[int] = (),
) -> JobStops:
    """The story of one job's ranks right now (see the module docstring). ``known_first``: ranks
    a reader saw stop first; ranks whose run records that (``seen_first_at``) count as such too.
    ``missing``: the job's ranks not among ``runs`` (on other nodes), so that no rank seen here is
    named first for a stop that only followed one of theirs."""
    now = time.time() if now is None else now
    if len(runs) < 2 and not missing:
        return JobStops()
    stops = {s.rank: s for s in (stop_of(r) for r in runs) if s is not None}
    seen = [r.rank for r in runs if getattr(r, "seen_first_at", None) is not None]
    known_first = list(known_first) or seen

    if len(stops) > 1 and all(s.how == "interrupted" for s in stops.values()):
        # Ctrl-C reaches every rank at once: none of them went first
        out = {
            s.rank: RankStop(s.rank, "stopped_by_launcher", s.how, _finite(s.lo), _first_words(s), s.detail)
            for s in stops.values()
        }  # fmt: skip
        at = min((s.lo for s in stops.values() if math.isfinite(s.lo)), default=math.nan)
        return JobStops(out, summary=f"{_ranks(sorted(stops))} were interrupted at {clock(at)}")

    first = _pick_first(stops, known_first) if stops else ()
    out, parts = _story_of_stops(stops, first, missing)
    heads = [stops[r] for r in first]
    first_at = min((s.lo for s in heads if math.isfinite(s.lo)), default=None)

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
        _mark_behind(moving, out, holders, parts)
    waiting = _mark_waiting(stalled, out, holders, parts)
    return JobStops(
        out, first, first_at, heads[0].how if heads else "", tuple(sorted(set(holders))),
        tuple(r.rank for r in waiting), "; ".join(parts),
    )  # fmt: skip


def _mark_behind(
    moving: list[RankRun], out: dict[int, RankStop], holders: list[int], parts: list[str]
) -> None:
    """Everyone alive has stopped stepping: the ones left behind hold the others."""
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


def _mark_waiting(
    stalled: list[RankRun], out: dict[int, RankStop], holders: list[int], parts: list[str]
) -> list[RankRun]:
    """The stalled ranks that wait in a collective for the holders (none without holders)."""
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
    return waiting
