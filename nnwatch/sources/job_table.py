"""The whole job as rank 0 sees it: its ``job.json`` (the job summary) as one :class:`JobView`.

With ``watch(job_summary_every=N)``, rank 0 receives every rank's step, loss, grad norm, step time,
non-finite count and memory through the job's process group, and every rank's liveness through
the job's key-value store (:mod:`nnwatch.probe.job_summary`). This module turns that file into
the same rows the ranks pane draws for ranks read from their own files, so a monitor attached to
rank 0 alone shows every rank, on every node, with the same judgement of who stopped first
(:func:`nnwatch.store.job_health.judge_job`) and the same job-level findings.

Times in the file are rank 0's clock, so they are compared with each other, not with this one;
when rank 0 itself stops writing, the view says the table is as of its last write.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from nnwatch.sources.job_findings import job_findings, lag_limit
from nnwatch.sources.job_view import JobView, RankSummary
from nnwatch.store.job_health import clock, judge_job
from nnwatch.store.jobs import Job, read_job_summary
from nnwatch.store.schema import FieldName

#: rank 0 writes twice a second; older than this (and not closed) it has stopped writing.
STALE_AFTER_S = 3.0


@dataclass(frozen=True)
class SeenRank:
    """One rank as rank 0 saw it, in the shape :func:`judge_job` reads."""

    rank: int
    state: str
    step: int | None
    heartbeat_at: float | None
    last_step_at: float | None
    step_interval: float | None
    ending: dict[str, Any] | None
    alive: bool | None
    heartbeat_age: float | None = None
    seen_first_at: float | None = None


def _num(x: Any) -> float:
    try:
        return float(x) if x is not None else math.nan
    except (TypeError, ValueError):
        return math.nan


def view_from_summary(doc: dict[str, Any], job: Job, *, now: float | None = None) -> JobView:
    """A :class:`JobView` from rank 0's ``job.json`` (``doc``); ``job`` is rank 0's job here."""
    now = time.time() if now is None else now
    written = _num(doc.get("written"))
    stale = not doc.get("closed") and math.isfinite(written) and now - written > STALE_AFTER_S
    at = written if (stale or doc.get("closed")) and math.isfinite(written) else now
    silent = _num(doc.get("silent_after")) if doc.get("silent_after") else 1.0
    raw = [r for r in doc.get("ranks", []) if isinstance(r, dict)]
    beat_steps = [int(r["beat_step"]) for r in raw if isinstance(r.get("beat_step"), int)]
    lead = max(beat_steps) if beat_steps else None
    seen, rows = _seen_ranks(raw, at, silent)
    world = int(doc.get("world_size") or len(seen))
    have = {r.rank for r in seen}
    stops = judge_job(seen, now=at, missing=tuple(r for r in range(world) if r not in have))
    origin_steps = [(int(f), rank) for _, rank, _, _, _, f in rows if math.isfinite(f) and f >= 0]
    origin = tuple(sorted(rk for f, rk in origin_steps if f == min(origin_steps)[0])) if origin_steps else ()  # fmt: skip
    out = []
    limit = lag_limit(1.0 / t for _, _, st, _, t, _ in rows if st == "live" and t > 0)
    for r, rank, state, step, step_time, first_nf in rows:
        told = stops.ranks.get(rank)
        behind = lead - step if lead is not None and step is not None and state == "live" else 0
        status, note = state, ""
        nf = int(first_nf) if math.isfinite(first_nf) and first_nf >= 0 else None
        if told is not None:
            status, note = told.status, told.words
        elif nf is not None:
            status, note = "nan", f"non-finite loss or activations since step {nf}"
        elif behind >= limit:
            status, note = "behind", f"{behind} steps behind the leading rank"
        out.append(RankSummary(
            rank=rank, host=str(r.get("host") or "?"), pid=int(r.get("pid") or 0), run_dir="",
            step=step, steps_per_s=(1.0 / step_time) if step_time > 0 else None,
            loss=_num(r.get("loss")), grad_norm=_num(r.get(FieldName.GRAD_NORM)), state=state,
            status=status, nonfinite_step=nf, nonfinite_what="loss" if nf is not None else None,
            forward_nonfinite_step=nf, behind=behind, note=note,
            role=told.role if told is not None else "", step_time=step_time,
            memory=_num(r.get("memory")),
        ))  # fmt: skip
    note = _table_note(doc, stale, written, at, silent)
    stragglers = tuple(x.rank for x in out if x.status == "behind")
    found = job_findings(out, nan_origin=origin, stops=stops)
    return JobView(job, tuple(out), origin, stragglers, (), stops, found, via="summary", note=note)


def _seen_ranks(raw: list[dict[str, Any]], at: float, silent: float) -> tuple[list[SeenRank], list[Any]]:
    """Each rank of the summary as the stop judge sees it, and its row's raw values."""
    seen: list[SeenRank] = []
    rows: list[Any] = []
    for r in raw:
        rank = int(r.get("rank", 0))
        ended = r.get("ended") if isinstance(r.get("ended"), dict) else None
        beat_at = r.get("beat_at")
        quiet = beat_at is not None and at - float(beat_at) > silent
        if ended is not None:
            state = "finished" if ended.get("status") == "finished" else "crashed"
        elif quiet:
            state = "crashed"
        else:
            state = "live" if beat_at is not None else "starting"
        step_time = _num(r.get(FieldName.STEP_TIME))
        steps = [int(x) for x in (_num(r.get("beat_step")), _num(r.get("step"))) if math.isfinite(x)]
        step = max(steps) if steps else None
        seen.append(SeenRank(
            rank, state, step, beat_at, r.get("step_seen_at"),
            step_time if math.isfinite(step_time) else None, ended,
            False if (quiet and ended is None) else None,
        ))  # fmt: skip
        first_nf = _num(r.get("first_nonfinite"))
        rows.append((r, rank, state, step, step_time, first_nf))
    return seen, rows


def _table_note(doc: dict[str, Any], stale: bool, written: float, at: float, silent: float) -> str:
    """Why the table may be old: rank 0 stopped writing it, or a rank keeps a summary waiting."""
    note = ""
    if stale:
        note = (f"rank 0 stopped writing the job summary at {clock(written)}: the table is as "
                "of then")  # fmt: skip
    elif doc.get("waiting"):
        since = _num(doc["waiting"].get("since"))
        if math.isfinite(since) and at - since > 2 * silent:
            note = (f"the job summary of step {doc['waiting'].get('step')} has waited "
                    f"{at - since:.0f} s for a rank (since {clock(since)})")  # fmt: skip
    return note


class JobSummaryMonitor:
    """Follows rank 0's ``job.json``; :meth:`poll` returns a fresh :class:`JobView`, or None while
    rank 0 has not written one (the job summary is off, or the first summary is not in yet)."""

    def __init__(self, job: Job, run_dir: str | Path) -> None:
        self.job = job
        self.run_dir = Path(run_dir)

    def poll(self) -> JobView | None:
        doc = read_job_summary(self.run_dir)
        return None if doc is None else view_from_summary(doc, self.job)

    def close(self) -> None:
        pass
