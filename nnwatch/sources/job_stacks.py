"""Where each rank of a job is stuck: every rank's Python stacks, asked of all ranks at once.

Each rank's command server answers ``stacks`` from its own thread (:mod:`nnwatch.channel.stacks`),
so a rank blocked in a collective answers with the line it waits on. :func:`gather` asks every
rank's socket in parallel (one thread per rank, each connection bounded by a timeout), so 64 ranks
answer in about the time of the slowest one, not the sum: ``bench/stacks.py`` measures it. A rank
that does not answer in time is reported as such (stopped, or stuck holding the GIL), never
waited for.

:func:`group` folds identical stacks together (the same thread name and frames on many ranks),
which is how a stuck job of hundreds of ranks reads: "ranks 0-62 wait in ``all_reduce``, rank 63
is in ``load_batch``". :class:`StackWatch` asks again every few seconds while a job is stuck and
keeps the latest answer, for the job view.
"""

from __future__ import annotations

import math
import time
from collections.abc import Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from nnwatch.channel.client import ChannelClient, ChannelError
from nnwatch.channel.commands import STACKS
from nnwatch.channel.stacks import format_thread, innermost
from nnwatch.store.job_health import STALL_FACTOR, STALL_MIN

#: How long one rank gets to answer.
ANSWER_S = 1.5
#: While a job is stuck, its stacks are asked again this often.
EVERY_S = 5.0
MAX_WORKERS = 128


@dataclass(frozen=True)
class RankStacks:
    """One rank's answer: its threads (each ``{"name", "main", "own", "frames"}``), or why not."""

    rank: int
    host: str = ""
    pid: int = 0
    threads: tuple[dict[str, Any], ...] = ()
    error: str = ""  # "" when it answered
    taken_at: float = math.nan

    def to_dict(self) -> dict[str, Any]:
        return {"rank": self.rank, "host": self.host, "pid": self.pid, "threads": list(self.threads),
                "error": self.error, "taken_at": self.taken_at}  # fmt: skip

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> RankStacks:
        threads = tuple(t for t in d.get("threads") or () if isinstance(t, dict))
        taken = d.get("taken_at")
        return cls(int(d.get("rank", -1)), str(d.get("host") or ""), int(d.get("pid") or 0),
                   threads, str(d.get("error") or ""),
                   float(taken) if isinstance(taken, (int, float)) else math.nan)  # fmt: skip


@dataclass(frozen=True)
class Target:
    """A rank to ask: its number, where it runs (for the words), its command socket."""

    rank: int
    host: str
    pid: int
    socket: str


def ask(target: Target, timeout: float = ANSWER_S) -> RankStacks:
    """One rank's stacks, or why it did not answer within ``timeout``."""
    try:
        with ChannelClient(Path(target.socket), timeout=timeout) as client:
            reply = client.request(STACKS, timeout=timeout)
    except ChannelError as exc:
        return RankStacks(target.rank, target.host, target.pid, error=str(exc))
    if not reply.ok:
        why = reply.error
        if reply.pending:
            why = (f"no answer within {timeout:g} s: the process is stopped, or stuck holding "
                   "the GIL (a C loop that never releases it)")  # fmt: skip
        return RankStacks(target.rank, target.host, target.pid, error=why)
    threads = tuple(t for t in reply.data.get("threads") or () if isinstance(t, dict))
    taken = reply.data.get("taken_at")
    return RankStacks(target.rank, target.host, target.pid, threads,
                      taken_at=float(taken) if isinstance(taken, (int, float)) else time.time())  # fmt: skip


def gather(targets: Sequence[Target], timeout: float = ANSWER_S) -> list[RankStacks]:
    """Every target's stacks, asked all at once; ordered by rank."""
    if not targets:
        return []
    with ThreadPoolExecutor(max_workers=min(MAX_WORKERS, len(targets))) as pool:
        got = list(pool.map(lambda t: ask(t, timeout), targets))
    return sorted(got, key=lambda s: s.rank)


@dataclass(frozen=True)
class StackGroup:
    """One stack shared by several ranks (one thread of each)."""

    ranks: tuple[int, ...]
    thread: dict[str, Any]

    @property
    def where(self) -> str:
        return innermost(self.thread)


def _key(thread: dict[str, Any]) -> tuple[Any, ...]:
    frames = tuple((str(f[0]), int(f[1]), str(f[2])) for f in thread.get("frames") or ())
    return (str(thread.get("name")), bool(thread.get("main")), frames)


def group(stacks: Iterable[RankStacks], *, own: bool = False) -> list[StackGroup]:
    """Identical threads across ranks folded together: the main threads first, then the
    program's other threads; nnwatch's own threads only with ``own``. Largest groups first."""
    groups: dict[tuple[Any, ...], tuple[list[int], dict[str, Any]]] = {}
    for s in stacks:
        for thread in s.threads:
            if thread.get("own") and not own:
                continue
            ranks, _ = groups.setdefault(_key(thread), ([], thread))
            ranks.append(s.rank)
    out = [StackGroup(tuple(sorted(r)), t) for r, t in groups.values()]
    return sorted(out, key=lambda g: (not g.thread.get("main"), -len(g.ranks), g.ranks))


def span(ranks: Sequence[int]) -> str:
    """(0, 1, 2, 5) -> "ranks 0-2, 5"."""
    parts: list[tuple[int, int]] = []
    for r in sorted(ranks):
        if parts and parts[-1][1] == r - 1:
            parts[-1] = (parts[-1][0], r)
        else:
            parts.append((r, r))
    text = ", ".join(f"{a}-{b}" if a != b else f"{a}" for a, b in parts)
    return f"rank{'s' if len(ranks) > 1 else ''} {text}"


def describe(stacks: Sequence[RankStacks], *, own: bool = False) -> list[str]:
    """The stacks as text: the silent ranks first, then each group of identical threads."""
    lines: list[str] = []
    for s in stacks:
        if s.error:
            lines.append(f"rank {s.rank}{' on ' + s.host if s.host else ''}: {s.error}")
    hidden = sorted({t.get("name", "?") for s in stacks for t in s.threads if t.get("own")})
    for g in group(stacks, own=own):
        lines.append("")
        lines.append(f"{span(g.ranks)} · {g.where}")
        lines += format_thread(g.thread, "  ")
    if hidden and not own:
        lines.append("")
        lines.append(f"(nnwatch's own threads left out: {', '.join(hidden)}; --all-threads shows them)")
    return lines


@dataclass
class StackWatch:
    """Asks a job's ranks for their stacks every :data:`EVERY_S` while the job is stuck; keeps
    the latest answer per rank (cleared once the job moves again)."""

    every: float = EVERY_S
    latest: dict[int, RankStacks] = field(default_factory=dict)
    asked_at: float = -math.inf

    def update(self, targets: Sequence[Target], stuck: bool) -> dict[int, RankStacks]:
        if not stuck:
            self.latest, self.asked_at = {}, -math.inf
            return self.latest
        if targets and time.monotonic() - self.asked_at >= self.every:
            self.asked_at = time.monotonic()
            self.latest = {s.rank: s for s in gather(targets)}
        return self.latest


def stalled(last_step_at: float | None, step_interval: float | None, now: float) -> bool:
    """No step for many times the rank's usual step time (the judgement ``job_health`` makes of
    a rank that waits in a collective)."""
    if last_step_at is None:
        return False
    return now - last_step_at > max(STALL_MIN, STALL_FACTOR * (step_interval or 0.0))
