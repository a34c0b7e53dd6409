"""A distributed job as a monitor follows it: one summary row per rank, and what stands out.

:class:`JobMonitor` follows the ranks of one job (grouped by :mod:`nnwatch.store.jobs`) and turns
them into one :class:`RankSummary` row each (step, steps/s, loss, grad norm, status), plus what
stands out across ranks: the rank where a NaN first appeared, the ranks that fall behind, and
(from :mod:`nnwatch.store.job_health`) the rank that stopped first and how, or the one the others
wait for in a collective. It is pure data for the TUI's rank selector and per-rank summary row;
nothing here imports torch or a UI library.

Multi-node: each node holds the rings of its own ranks (in its own ``/dev/shm``), so a monitor on
one node sees that node's ranks only; attach per node over SSH. What one rank learns about the
others (parameter drift, a rank gone NaN) travels through the cross-rank consistency check
(:mod:`nnwatch.probe.consistency`) into every rank's ``events.jsonl``, so it is visible from any node.
"""

from __future__ import annotations

import math
import time
from collections.abc import Iterable, Mapping
from typing import Any

import numpy as np

from nnwatch.sources.base import RunSource, SourceError
from nnwatch.sources.job_findings import LAG_STEPS, job_findings, lag_limit
from nnwatch.sources.job_stacks import RankStacks, StackWatch, Target, stalled
from nnwatch.sources.job_table import view_from_summary
from nnwatch.sources.job_view import JobView, RankSummary
from nnwatch.sources.live import LiveSource
from nnwatch.store.events import FindingEvent
from nnwatch.store.job_health import JobStops, certain_first, judge_job
from nnwatch.store.jobs import Job, read_job_summary
from nnwatch.store.registry import RunInfo, note_first_stop, refresh
from nnwatch.store.run_reader import load_run
from nnwatch.store.runlog import RunLogError
from nnwatch.store.schema import FieldName, sums_measured

#: A live rank this many steps behind the most advanced rank is called a straggler (or, in a
#: fast job, a second of its steps: see ``job_findings.lag_limit``).
STRAGGLER_STEPS = LAG_STEPS
#: Findings the consistency check writes; a job view collects them from every rank it follows.
CROSS_RANK_KINDS = ("rank_divergence", "rank_nonfinite")

# ------------------------------------------------------------------------------------------------
# Per-rank summaries (monitor side)


class RankState:
    """Running facts about one rank's records, updated with each new batch (O(new rows))."""

    def __init__(self) -> None:
        self.step: int | None = None
        self.loss = math.nan
        self.grad_norm = math.nan
        self.step_times: list[float] = []
        self.memory = math.nan
        self.loss_seen = False
        self.first: dict[str, int] = {}
        #: steps not measured (``layer_sums`` 0) whose layer rows may still come; pruned as they do
        self._unmeasured = np.zeros(0, dtype=np.int64)

    def update(self, scalars: np.ndarray, layers: np.ndarray) -> None:
        if len(scalars):
            steps = scalars[FieldName.STEP]
            loss = scalars[FieldName.LOSS].astype(np.float64)
            self.step = int(steps[-1])
            self.loss = float(loss[-1])
            gn = scalars[FieldName.GRAD_NORM]
            measured = np.flatnonzero(~np.isnan(gn))  # the cost budget may skip some steps
            if len(measured):
                self.grad_norm = float(gn[measured[-1]])
            st = scalars[FieldName.STEP_TIME][-20:]
            self.step_times = (
                self.step_times + [float(x) for x in st if np.isfinite(x) and x > 0]
            )[-20:]
            mem = float(scalars[FieldName.CUDA_PEAK][-1])
            self.memory = mem if math.isfinite(mem) and mem > 0 else float(scalars[FieldName.RSS][-1])
            bad_loss = np.isinf(loss)
            finite = np.isfinite(loss)
            before = np.maximum.accumulate(finite) | self.loss_seen
            bad_loss |= np.isnan(loss) & before
            self.loss_seen = self.loss_seen or bool(finite.any())
            self._first("loss", steps, bad_loss)
            # 1.0 only when a measured gradient held NaN/Inf; NaN there means "not measured"
            self._first("gradients", steps, scalars[FieldName.NONFINITE_GRADS] == 1.0)
            # steps whose layer output sums the cost budget left out but that get a layer row
            # (their stats were sampled, or a gradient went bad)
            rowed = (scalars[FieldName.LAYER_STATS] == 1.0) | (scalars[FieldName.NONFINITE_GRADS] == 1.0)
            skipped = steps[~sums_measured(scalars) & rowed]
            if len(skipped):
                self._unmeasured = np.union1d(self._unmeasured, skipped.astype(np.int64))
        if len(layers) and FieldName.ACT_SUM in (layers.dtype.names or ()):
            act = layers[FieldName.ACT_SUM].reshape(len(layers), -1)
            if act.shape[1]:
                lsteps = layers[FieldName.STEP].astype(np.int64)
                # a row for a step whose stats were sampled but whose sums were not measured
                # holds NaN sums: "not measured", never "non-finite"
                measured_rows = ~np.isin(lsteps, self._unmeasured)
                self._first("activations", lsteps, ~np.isfinite(act).all(axis=1) & measured_rows)
                self._unmeasured = self._unmeasured[self._unmeasured > lsteps[-1]]

    def _first(self, what: str, steps: np.ndarray, bad: np.ndarray) -> None:
        if what in self.first or not bad.any():
            return
        self.first[what] = int(steps[int(np.argmax(bad))])

    @property
    def step_time(self) -> float:
        return float(np.median(self.step_times)) if self.step_times else math.nan

    @property
    def steps_per_s(self) -> float | None:
        med = self.step_time
        return 1.0 / med if med > 0 else None

    def nonfinite(self) -> tuple[int | None, str | None, int | None]:
        if not self.first:
            return None, None, None
        order = {"activations": 0, "loss": 1, "gradients": 2}
        what = min(self.first, key=lambda k: (self.first[k], order[k]))
        fwd = [v for k, v in self.first.items() if k != "gradients"]
        return self.first[what], what, (min(fwd) if fwd else None)


class JobMonitor:
    """Follows every rank of one job on this machine; :meth:`poll` returns a fresh :class:`JobView`.

    Each rank is read through a :class:`~nnwatch.sources.live.LiveSource` (its run log, then its
    ring), so a poll costs O(new records). Ranks whose files are not on this machine (other nodes)
    appear as ``missing`` in the job, not as rows.
    """

    def __init__(
        self, job: Job, *, hung_min: float | None = None, use_summary: bool = True
    ) -> None:
        self.job = job
        #: with ranks on other nodes, show rank 0's job summary (all ranks) when it writes one
        self.use_summary = use_summary
        self._hung_min = hung_min
        self._sources: dict[int, RunSource | None] = {}
        self._states: dict[int, RankState] = {r.rank: RankState() for r in job.runs}
        self._run_state: dict[int, str] = {}
        self._findings: list[dict[str, Any]] = []
        #: ranks seen stopped while every other rank still lived: the first, for certain, even
        #: when the files alone could not order their deaths any more
        self._first_seen: tuple[int, ...] = ()
        #: every rank's stacks while the job is stuck (asked through their sockets)
        self.stack_watch = StackWatch()

    def _source(self, info: RunInfo) -> RunSource | None:
        src = self._sources.get(info.rank)
        if src is None:
            kwargs: dict[str, Any] = {} if self._hung_min is None else {"hung_min": self._hung_min}
            try:
                src = LiveSource(info.run_dir, ring=info.ring or None, **kwargs)
            except SourceError:
                return None  # before its first step: no meta.json yet
            self._sources[info.rank] = src
        return src

    def poll(self) -> JobView:
        summary = self._summary_view()
        if summary is not None:
            return summary
        for info in self.job.runs:
            src = self._source(info)
            if src is None:
                self._run_state[info.rank] = "starting"
                continue
            try:
                update = src.poll()
            except Exception as exc:  # noqa: BLE001 - one unreadable rank must not hide the others
                self._run_state[info.rank] = "lost"
                self._findings.append(
                    {"kind": "unreadable", "rank": info.rank, "message": str(exc)}
                )
                continue
            self._states[info.rank].update(update.scalars, update.layers)
            self._run_state[info.rank] = update.status.state
            for ev in update.events:
                if isinstance(ev, FindingEvent) and ev.finding.kind in CROSS_RANK_KINDS:
                    self._findings.append({**ev.to_json(), "reported_by": info.rank})
        stops, runs = self._judge_stops()
        stacks = self._stacks(runs, stops)
        return build_view(self.job, self._states, self._run_state, self._findings, stops, stacks)

    def _stacks(self, runs: list[RunInfo], stops: JobStops) -> tuple[RankStacks, ...]:
        """Every live rank's stacks while the job is stuck: a rank waits in a collective, holds
        the others, or has made no step for many times its usual step time."""
        now = time.time()
        live = [r for r in runs if not r.ended and r.alive is not False and r.socket]
        stuck = any(r.role in ("waiting", "holds") for r in stops.ranks.values()) or any(
            r.state == "hung" or (r.state != "paused" and stalled(r.last_step_at, r.step_interval, now))
            for r in live
        )  # fmt: skip
        targets = [Target(r.rank, r.host, r.pid, str(r.socket)) for r in live]
        got = self.stack_watch.update(targets, stuck)
        return tuple(got[k] for k in sorted(got))

    def _summary_view(self) -> JobView | None:
        """Rank 0's job summary, when ranks are on other nodes and rank 0 writes one: it holds
        every rank, where this machine's files hold only its own."""
        rank0 = self.job.run_for(0)
        if not self.use_summary or not self.job.missing or rank0 is None:
            return None
        doc = read_job_summary(rank0.run_dir)
        return None if doc is None else view_from_summary(doc, self.job)

    def _judge_stops(self) -> tuple[JobStops, list[RunInfo]]:
        """Which rank stopped first, and which one the others wait for, judged afresh (and the
        ranks as they were judged)."""
        runs = []
        for info in self.job.runs:
            try:
                runs.append(refresh(info, hung_min=self._hung_min))
            except Exception:  # noqa: BLE001 - an unreadable rank is judged as it was
                runs.append(info)
        stops = judge_stops(runs, known_first=self._first_seen, missing=self.job.missing)
        if not self._first_seen and _whole(runs):
            self._first_seen = certain_first(runs, stops)
        return stops, runs

    def close(self) -> None:
        for src in self._sources.values():
            if src is not None:
                src.close()
        self._sources.clear()


def build_view(
    job: Job,
    states: Mapping[int, RankState],
    run_state: Mapping[int, str],
    findings: Iterable[dict[str, Any]] = (),
    stops: JobStops | None = None,
    stacks: tuple[RankStacks, ...] = (),
) -> JobView:
    """Rows plus what stands out: the NaN origin (earliest forward NaN), the stragglers, and
    (``stops``, from :func:`nnwatch.store.job_health.judge_job`) the rank that stopped first or
    that the others wait for."""
    stops = stops if stops is not None else JobStops()
    live = {"live", "running", "paused", "starting"}
    steps = [s.step for r, s in states.items() if s.step is not None and run_state.get(r) in live]
    lead = max(steps) if steps else None
    raw = []
    for info in job.runs:
        st = states.get(info.rank) or RankState()
        state = run_state.get(info.rank, info.state)
        first, what, fwd = st.nonfinite()
        behind = lead - st.step if lead is not None and st.step is not None and state in live else 0
        raw.append((info, st, state, first, what, fwd, behind))
    fwd_steps = [(f, i.rank) for i, _, _, _, _, f, _ in raw if f is not None]
    any_steps = [(f, i.rank) for i, _, _, f, _, _, _ in raw if f is not None]
    pool = fwd_steps or any_steps
    origin = tuple(sorted(r for f, r in pool if f == min(pool)[0])) if pool else ()
    if job.missing:  # ranks on other nodes may have gone non-finite before any seen here
        origin = ()
    limit = lag_limit(s.steps_per_s for r, s in states.items() if run_state.get(r) in live)
    stragglers = tuple(i.rank for i, *_, b in raw if b >= limit)
    rows = []
    for info, st, state, first, what, fwd, behind in raw:
        told = stops.ranks.get(info.rank)
        status, note = _status(
            info.rank, state, told, first, what, fwd, (behind, limit), origin, len(job.runs)
        )
        rows.append(
            RankSummary(
                rank=info.rank, host=info.host, pid=info.pid, run_dir=info.run_dir,
                step=st.step,
                steps_per_s=st.steps_per_s,
                loss=st.loss,
                grad_norm=st.grad_norm,
                state=state,
                status=status,
                nonfinite_step=first,
                nonfinite_what=what,
                forward_nonfinite_step=fwd,
                behind=behind,
                note=note,
                role=told.role if told is not None else "",
                step_time=st.step_time,
                memory=st.memory,
            )  # fmt: skip
        )
    findings = tuple(findings)
    found = job_findings(rows, nan_origin=origin, stops=stops, cross_rank=findings)
    return JobView(job, tuple(rows), origin, stragglers, findings, stops, found, stacks=stacks)


def _status(
    rank: int,
    state: str,
    told: Any,
    first: int | None,
    what: str | None,
    fwd: int | None,
    lag: tuple[int, float],
    origin: tuple[int, ...],
    ranks: int,
) -> tuple[str, str]:
    """A rank's status and note: the stop judge's word first, then a lost process, a NaN (and
    whether it started here), then lagging behind the leading rank."""
    if told is not None:
        return told.status, told.words
    if state in ("crashed", "lost", "hung"):
        return state, ""
    if first is not None:
        note = f"non-finite {what} since step {first}"
        if rank in origin and len(origin) < ranks:
            note += " (first rank to go non-finite)"
        elif what == "gradients" and fwd is None:
            note += " (reached this rank through the gradient all-reduce)"
        return "nan", note
    behind, limit = lag
    if behind >= limit:
        return "behind", f"{behind} steps behind the leading rank"
    return state, ""


def summarize_runs(job: Job) -> JobView:
    """A one-off view of a job read from its run logs (finished or crashed jobs, scripts, tests)."""
    states: dict[int, RankState] = {}
    run_state: dict[int, str] = {}
    findings: list[dict[str, Any]] = []
    for info in job.runs:
        st = RankState()
        try:
            run = load_run(info.run_dir)
        except RunLogError:
            run_state[info.rank] = "starting"
            states[info.rank] = st
            continue
        st.update(np.asarray(run.scalars), np.asarray(run.layers))
        states[info.rank] = st
        run_state[info.rank] = run.status
        findings += [
            {**e.to_json(), "reported_by": info.rank}
            for e in run.findings if e.finding.kind in CROSS_RANK_KINDS
        ]
    stops = judge_stops([refresh(info) for info in job.runs], missing=job.missing)
    return build_view(job, states, run_state, findings, stops)


def judge_stops(
    runs: list[RunInfo], *, known_first: tuple[int, ...] = (), missing: tuple[int, ...] = ()
) -> JobStops:
    """:func:`~nnwatch.store.job_health.judge_job` for the ranks of one job, recording in the
    first rank's run directory when this reader sees it stopped while the others still live (so
    that later readers know, even when the files alone could not order their deaths)."""
    stops = judge_job(runs, known_first=known_first, missing=missing)
    # "stopped while every other rank still lived" holds only if every rank is seen: on one node
    # of a multi-node job, a rank whose collective failed after a rank elsewhere died would
    # otherwise be written down as the first (and every later reader would believe it)
    certain = certain_first(runs, stops) if _whole(runs) else ()
    for info in runs:
        if info.rank in certain and info.seen_first_at is None:
            others = [r.rank for r in runs if r.rank not in certain]
            note_first_stop(info.run_dir, info.rank, others, stops.first_how)
    return stops


def _whole(runs: list[RunInfo]) -> bool:
    """Every rank of the job is among ``runs`` (no rank on another node, none unseen)."""
    world = max((int(getattr(r, "world_size", 1) or 1) for r in runs), default=1)
    return len({r.rank for r in runs}) >= world
