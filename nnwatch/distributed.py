"""Distributed jobs, as a monitor sees them: which runs are ranks of one job, and how each rank does.

Every rank of a ``torch.distributed`` job writes its own run (ring, log, registry entry; its run
directory ends in ``-r<rank>``). To show them as one job, the probe records the job's identity in
``meta.json`` (``extra["job"]``, from :func:`job_extra`), and :func:`group_jobs` puts the runs that
share it together. The identity is ``TORCHELASTIC_RUN_ID`` when the launcher set one (torchrun
does), else the master address and port; since a port is reused by later jobs, runs that share an
address are also split by start time and by rank (a job holds each rank once). A loopback master
address (``localhost``) is qualified by the host, since it names a different machine on each node.

:class:`JobMonitor` follows the ranks of one job and turns them into one :class:`RankSummary` row
each (step, steps/s, loss, grad norm, status), plus what stands out across ranks: the rank where a
NaN first appeared, the ranks that fall behind, and (from :mod:`nnwatch.channel.job_health`) the
rank that stopped first and how, or the one the others wait for in a collective. It is pure data
for the TUI's rank selector and per-rank summary row; nothing here imports torch or a UI library.

Multi-node: each node holds the rings of its own ranks (in its own ``/dev/shm``), so a monitor on
one node sees that node's ranks only; attach per node over SSH. What one rank learns about the
others (parameter drift, a rank gone NaN) travels through the cross-rank consistency check
(:mod:`nnwatch.probe.consistency`) into every rank's ``events.jsonl``, so it is visible from any node.
"""

from __future__ import annotations

import json
import math
import os
import socket
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from nnwatch.channel.job_health import JobStops, certain_first, judge_job
from nnwatch.schema import sums_measured

if TYPE_CHECKING:
    from nnwatch.channel.registry import RunInfo
    from nnwatch.sources.base import RunSource

#: Runs that share a master address but started further apart than this are different jobs.
JOIN_WINDOW_S = 600.0
#: A live rank this many steps behind the most advanced rank is called a straggler.
STRAGGLER_STEPS = 2
LOOPBACK = frozenset({"localhost", "127.0.0.1", "::1", "0.0.0.0", "127.0.1.1"})
#: Findings the consistency check writes; a job view collects them from every rank it follows.
CROSS_RANK_KINDS = ("rank_divergence", "rank_nonfinite")


# ------------------------------------------------------------------------------------------------
# Identity (training side)


def job_identity(
    env: Mapping[str, str] | None = None, host: str | None = None
) -> dict[str, Any] | None:
    """The identity of the distributed job this process belongs to, or None outside of one."""
    env = os.environ if env is None else env
    try:
        world = int(env.get("WORLD_SIZE", "1"))
    except ValueError:
        world = 1
    run_id = env.get("TORCHELASTIC_RUN_ID", "")
    addr, port = env.get("MASTER_ADDR", ""), env.get("MASTER_PORT", "")
    try:
        restart = int(env.get("TORCHELASTIC_RESTART_COUNT", "0"))
    except ValueError:
        restart = 0
    host = host or socket.gethostname()
    if addr and addr.lower() in LOOPBACK:
        addr = f"{host}/{addr}"
    master = f"{addr}:{port}" if addr and port else ""
    if run_id and run_id.lower() != "none":  # torchrun's default --rdzv-id is the string "none"
        job_id, source = f"torchelastic:{run_id}", "torchelastic"
    elif master:
        job_id, source = f"master:{master}", "master"
    elif world > 1:
        job_id, source = "", "unknown"
    else:
        return None
    return {
        "id": job_id,
        "source": source,
        "master": master,
        "restart": restart,
        "world_size": world,
        "group_rank": env.get("GROUP_RANK"),
    }


def job_extra() -> dict[str, Any]:
    """What the probe adds to ``RunMeta.extra``: ``{"job": identity}``, or nothing outside a job."""
    ident = job_identity()
    return {"job": ident} if ident is not None else {}


# ------------------------------------------------------------------------------------------------
# Grouping (monitor side)

_job_cache: dict[str, tuple[int, dict[str, Any] | None]] = {}


def read_job(run_dir: str | os.PathLike[str]) -> dict[str, Any] | None:
    """The job identity a run recorded in its ``meta.json`` (cached until the file changes)."""
    path = Path(run_dir) / "meta.json"
    try:
        mtime = path.stat().st_mtime_ns
    except OSError:
        return None
    key = str(path)
    hit = _job_cache.get(key)
    if hit is not None and hit[0] == mtime:
        return hit[1]
    try:
        meta = json.loads(path.read_text())
        job = (meta.get("extra") or {}).get("job")
    except (OSError, ValueError, AttributeError):
        job = None
    job = job if isinstance(job, dict) else None
    _job_cache[key] = (mtime, job)
    return job


@dataclass(frozen=True)
class Job:
    """The runs of one job, one per rank present, ordered by rank."""

    key: str
    label: str
    source: str  # torchelastic | master | unknown | single
    world_size: int
    restart: int
    runs: tuple[RunInfo, ...]

    @property
    def ranks(self) -> tuple[int, ...]:
        return tuple(r.rank for r in self.runs)

    @property
    def missing(self) -> tuple[int, ...]:
        """Ranks the job should have but that no run here belongs to (e.g. on other nodes)."""
        have = set(self.ranks)
        return tuple(r for r in range(self.world_size) if r not in have)

    @property
    def distributed(self) -> bool:
        return self.world_size > 1

    @property
    def hosts(self) -> tuple[str, ...]:
        return tuple(sorted({r.host for r in self.runs}))

    def run_for(self, rank: int) -> RunInfo | None:
        return next((r for r in self.runs if r.rank == rank), None)


@dataclass
class _Open:
    key: str
    ident: dict[str, Any] | None
    first_started: float
    world: int
    runs: dict[int, RunInfo] = field(default_factory=dict)


def group_jobs(runs: Iterable[RunInfo]) -> list[Job]:
    """Group runs (from ``list_runs()`` and/or ``recorded_runs()``) into jobs.

    Every run lands in exactly one job; a run outside a distributed job is a job of its own.
    Jobs come oldest first, and their runs by rank.
    """
    ordered = sorted(runs, key=lambda r: (r.started, r.rank))
    open_jobs: list[_Open] = []
    for info in ordered:
        ident = read_job(info.run_dir) if info.world_size > 1 else None
        base = _base_key(info, ident)
        target = None
        if base is not None:
            for job in reversed(open_jobs):
                if job.key != base or info.rank in job.runs or job.world != info.world_size:
                    continue
                if ident is not None and ident.get("source") == "torchelastic":
                    target = job  # one run id is one job, however long its ranks take to start
                elif info.started - job.first_started <= JOIN_WINDOW_S:
                    target = job
                break
        if target is None:
            target = _Open(base or f"run:{info.run_dir}", ident, info.started, info.world_size)
            open_jobs.append(target)
        target.runs[info.rank] = info
    return [_freeze(j) for j in open_jobs]


def _base_key(info: RunInfo, ident: dict[str, Any] | None) -> str | None:
    if info.world_size <= 1:
        return None
    if ident is None or not ident.get("id"):
        return f"unknown:{info.host}:{info.world_size}"  # same host, same size, close in time
    return f"{ident['id']}#{int(ident.get('restart') or 0)}"


def _freeze(j: _Open) -> Job:
    runs = tuple(j.runs[r] for r in sorted(j.runs))
    first = runs[0]
    ident = j.ident or {}
    source = str(ident.get("source") or ("single" if j.world <= 1 else "unknown"))
    restart = int(ident.get("restart") or 0)
    name = Path(first.run_dir).name
    if name.endswith(f"-r{first.rank}"):
        name = name[: -len(f"-r{first.rank}")]
    if j.world > 1:
        where = {"torchelastic": f"run id {str(ident.get('id', '')).split(':', 1)[-1][:12]}",
                 "master": f"master {ident.get('master', '')}"}.get(source, "job")  # fmt: skip
        again = f", restart {restart}" if restart else ""
        label = f"{name} ({where}{again}; {len(runs)}/{j.world} ranks here)"
    else:
        label = name
    return Job(j.key, label, source, j.world, restart, runs)


def run_info_from_dir(run_dir: str | os.PathLike[str]) -> RunInfo:
    """A :class:`RunInfo` for a run directory that has no registry entry (a finished job, a
    copied directory), from its ``meta.json`` and ``end.json``, to group it with :func:`group_jobs`.
    """
    import time

    from nnwatch.channel.health import read_end
    from nnwatch.channel.registry import RunInfo, inspect_dir, ring_path
    from nnwatch.runlog import RunLogError
    from nnwatch.schema import RunMeta

    run_dir = Path(run_dir).expanduser()
    try:
        meta = RunMeta.from_json((run_dir / "meta.json").read_text())
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise RunLogError(f"{run_dir} is not a readable nnwatch run ({exc})") from None
    seen = inspect_dir(run_dir)  # when things happened: heartbeat, last step, end, pid
    end = read_end(run_dir)
    if end is not None:
        state = "crashed" if end.get("status") == "crashed" else "finished"
        steps = end.get("steps")
    else:
        state, steps = "recorded", None
    return RunInfo(
        name=meta.name, pid=meta.pid, host=meta.host, rank=meta.rank, world_size=meta.world_size,
        state=state, message="", step=steps - 1 if isinstance(steps, int) and steps > 0 else None,
        steps_per_s=None, age=max(0.0, time.time() - meta.started), heartbeat_age=None,
        last_step_age=None, dropped_records=0, run_dir=str(run_dir),
        ring=str(ring_path(run_dir, meta.rank)), socket=None, entry_path="",
        local_rank=meta.local_rank, started=meta.started,
        heartbeat_at=seen.heartbeat_at if seen else None,
        last_step_at=seen.last_step_at if seen else None,
        step_interval=seen.step_interval if seen else None,
        ending=end, alive=seen.alive if seen else None,
    )  # fmt: skip


def job_of(run: RunInfo, runs: Iterable[RunInfo]) -> Job:
    """The job a run belongs to (itself alone when it is not part of a distributed job)."""
    others = [r for r in runs if r.run_dir != run.run_dir]
    for job in group_jobs([*others, run]):
        if any(r.run_dir == run.run_dir for r in job.runs):
            return job
    raise AssertionError("group_jobs dropped a run")  # pragma: no cover


# ------------------------------------------------------------------------------------------------
# Per-rank summaries (monitor side)


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


class RankState:
    """Running facts about one rank's records, updated with each new batch (O(new rows))."""

    def __init__(self) -> None:
        self.step: int | None = None
        self.loss = math.nan
        self.grad_norm = math.nan
        self.step_times: list[float] = []
        self.loss_seen = False
        self.first: dict[str, int] = {}
        #: steps not measured (``layer_sums`` 0) whose layer rows may still come; pruned as they do
        self._unmeasured = np.zeros(0, dtype=np.int64)

    def update(self, scalars: np.ndarray, layers: np.ndarray) -> None:
        if len(scalars):
            steps = scalars["step"]
            loss = scalars["loss"].astype(np.float64)
            self.step = int(steps[-1])
            self.loss = float(loss[-1])
            gn = scalars["grad_norm"]
            measured = np.flatnonzero(~np.isnan(gn))  # the cost budget may skip some steps
            if len(measured):
                self.grad_norm = float(gn[measured[-1]])
            st = scalars["step_time"][-20:]
            self.step_times = (
                self.step_times + [float(x) for x in st if np.isfinite(x) and x > 0]
            )[-20:]
            bad_loss = np.isinf(loss)
            finite = np.isfinite(loss)
            before = np.maximum.accumulate(finite) | self.loss_seen
            bad_loss |= np.isnan(loss) & before
            self.loss_seen = self.loss_seen or bool(finite.any())
            self._first("loss", steps, bad_loss)
            # 1.0 only when a measured gradient held NaN/Inf; NaN there means "not measured"
            self._first("gradients", steps, scalars["nonfinite_grads"] == 1.0)
            # steps whose layer output sums the cost budget left out but that get a layer row
            # (their stats were sampled, or a gradient went bad)
            rowed = (scalars["layer_stats"] == 1.0) | (scalars["nonfinite_grads"] == 1.0)
            skipped = steps[~sums_measured(scalars) & rowed]
            if len(skipped):
                self._unmeasured = np.union1d(self._unmeasured, skipped.astype(np.int64))
        if len(layers) and "act_sum" in (layers.dtype.names or ()):
            act = layers["act_sum"].reshape(len(layers), -1)
            if act.shape[1]:
                lsteps = layers["step"].astype(np.int64)
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
    def steps_per_s(self) -> float | None:
        if not self.step_times:
            return None
        med = float(np.median(self.step_times))
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

    def __init__(self, job: Job, *, hung_min: float | None = None) -> None:
        self.job = job
        self._hung_min = hung_min
        self._sources: dict[int, RunSource | None] = {}
        self._states: dict[int, RankState] = {r.rank: RankState() for r in job.runs}
        self._run_state: dict[int, str] = {}
        self._findings: list[dict[str, Any]] = []
        #: ranks seen stopped while every other rank still lived: the first, for certain, even
        #: when the files alone could not order their deaths any more
        self._first_seen: tuple[int, ...] = ()

    def _source(self, info: RunInfo) -> RunSource | None:
        src = self._sources.get(info.rank)
        if src is None:
            from nnwatch.sources.base import SourceError
            from nnwatch.sources.live import LiveSource

            kwargs: dict[str, Any] = {} if self._hung_min is None else {"hung_min": self._hung_min}
            try:
                src = LiveSource(info.run_dir, ring=info.ring or None, **kwargs)
            except SourceError:
                return None  # before its first step: no meta.json yet
            self._sources[info.rank] = src
        return src

    def poll(self) -> JobView:
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
                if ev.get("kind") in CROSS_RANK_KINDS:
                    self._findings.append({**ev, "reported_by": info.rank})
        return build_view(
            self.job, self._states, self._run_state, self._findings, self._judge_stops()
        )

    def _judge_stops(self) -> JobStops:
        """Which rank stopped first, and which one the others wait for, judged afresh."""
        from nnwatch.channel.registry import refresh

        runs = []
        for info in self.job.runs:
            try:
                runs.append(refresh(info, hung_min=self._hung_min))
            except Exception:  # noqa: BLE001 - an unreadable rank is judged as it was
                runs.append(info)
        stops = judge_stops(runs, known_first=self._first_seen)
        if not self._first_seen:
            self._first_seen = certain_first(runs, stops)
        return stops

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
) -> JobView:
    """Rows plus what stands out: the NaN origin (earliest forward NaN), the stragglers, and
    (``stops``, from :func:`nnwatch.channel.job_health.judge_job`) the rank that stopped first or
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
    stragglers = tuple(i.rank for i, *_, b in raw if b >= STRAGGLER_STEPS)
    rows = []
    for info, st, state, first, what, fwd, behind in raw:
        status, note = state, ""
        told = stops.ranks.get(info.rank)
        if told is not None:
            status, note = told.status, told.words
        elif state in ("crashed", "lost", "hung"):
            status = state
        elif first is not None:
            status = "nan"
            note = f"non-finite {what} since step {first}"
            if info.rank in origin and len(origin) < len(job.runs):
                note += " (first rank to go non-finite)"
            elif what == "gradients" and fwd is None:
                note += " (reached this rank through the gradient all-reduce)"
        elif behind >= STRAGGLER_STEPS:
            status, note = "behind", f"{behind} steps behind the leading rank"
        rows.append(
            RankSummary(
                rank=info.rank,
                host=info.host,
                pid=info.pid,
                run_dir=info.run_dir,
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
            )  # fmt: skip
        )
    return JobView(job, tuple(rows), origin, stragglers, tuple(findings), stops)


def summarize_runs(job: Job) -> JobView:
    """A one-off view of a job read from its run logs (finished or crashed jobs, scripts, tests)."""
    from nnwatch.runlog import RunLogError, load_run

    states: dict[int, RankState] = {}
    run_state: dict[int, str] = {}
    findings: list[dict[str, Any]] = []
    from nnwatch.channel.registry import refresh

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
            {**e, "reported_by": info.rank} for e in run.events if e.get("kind") in CROSS_RANK_KINDS
        ]
    stops = judge_stops([refresh(info) for info in job.runs])
    return build_view(job, states, run_state, findings, stops)


def judge_stops(runs: list[RunInfo], *, known_first: tuple[int, ...] = ()) -> JobStops:
    """:func:`~nnwatch.channel.job_health.judge_job` for the ranks of one job, recording in the
    first rank's run directory when this reader sees it stopped while the others still live (so
    that later readers know, even when the files alone could not order their deaths)."""
    from nnwatch.channel.registry import note_first_stop

    stops = judge_job(runs, known_first=known_first)
    certain = certain_first(runs, stops)
    for info in runs:
        if info.rank in certain and info.seen_first_at is None:
            others = [r.rank for r in runs if r.rank not in certain]
            note_first_stop(info.run_dir, info.rank, others, stops.first_how)
    return stops
