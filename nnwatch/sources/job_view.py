"""The rows of a job view: one :class:`RankSummary` per rank, and the :class:`JobView` around them.

Shared by every way of gathering a job (this machine's files, rank 0's job summary, SSH to every
node), so that the ranks pane draws one shape whatever the route.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from nnwatch.sources.job_findings import JobFinding
from nnwatch.sources.job_stacks import RankStacks
from nnwatch.store.job_health import JobStops
from nnwatch.store.jobs import Job


@dataclass(frozen=True)
class RankSummary:
    """One row of the per-rank summary: what a user compares across ranks at a glance."""

    rank: int
    host: str
    pid: int
    run_dir: str
    step: int | None
    steps_per_s: float | None
    loss: float  # NaN when not measured
    grad_norm: float  # before clipping; NaN when not measured
    state: str  # the run's own state: live, paused, hung, finished, crashed, lost, starting
    status: str  # what to show: the state, or "nan", "behind" when that stands out more
    nonfinite_step: int | None = None  # first step with a non-finite loss, activation or gradient
    nonfinite_what: str | None = None  # "loss", "activations" or "gradients"
    forward_nonfinite_step: int | None = None  # first non-finite loss or activation (not gradients)
    behind: int = 0  # steps behind the most advanced rank of the job (live ranks)
    note: str = ""  # plain words for a tooltip or the events pane
    role: str = ""  # first, stopped_by_launcher, holds or waiting (see channel.job_health)
    step_time: float = math.nan  # the rank's usual (median) step time, seconds
    memory: float = math.nan  # bytes: peak CUDA memory where there is a GPU, else resident memory
    reachable: bool = True  # False: its host could not be reached (the row says what is known)


@dataclass(frozen=True)
class JobView:
    """Everything the TUI needs for one job: a row per rank, and what stands out."""

    job: Job
    rows: tuple[RankSummary, ...]
    nan_origin: tuple[int, ...]  # the rank(s) where a NaN appeared first (forward before backward)
    stragglers: tuple[int, ...]
    cross_rank_findings: tuple[dict[str, Any], ...]  # rank_divergence / rank_nonfinite events
    #: which rank stopped first and how, and which one the live ranks wait for
    stops: JobStops = field(default_factory=JobStops)
    #: job-level findings (stragglers, outliers, the first non-finite rank, a dead rank)
    findings: tuple[JobFinding, ...] = ()
    #: hosts that could not be reached, with the reason in plain words (never hidden)
    unreachable: tuple[tuple[str, str], ...] = ()
    via: str = "local"  # how the rows were gathered: local, ssh or summary (rank 0's job summary)
    note: str = ""  # one line about the view itself (e.g. a stale job summary)
    #: while the job is stuck: every rank's Python stacks, as last asked (empty while it moves)
    stacks: tuple[RankStacks, ...] = ()
