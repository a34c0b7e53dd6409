"""Which runs are ranks of one distributed job: the identity each rank records, and the grouping.

Every rank of a ``torch.distributed`` job writes its own run (ring, log, registry entry; its run
directory ends in ``-r<rank>``). The probe records the job's identity in ``meta.json``
(``extra["job"]``, from :func:`job_extra`), and :func:`group_jobs` puts the runs that share it
together. The identity is ``TORCHELASTIC_RUN_ID`` when the launcher set one (torchrun does), else
the master address and port; since a port is reused by later jobs, runs that share an address are
also split by start time and by rank (a job holds each rank once). A loopback master address
(``localhost``) is qualified by the host, since it names a different machine on each node.
"""

from __future__ import annotations

import os
import socket
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from nnwatch.store.clean_text import loads
from nnwatch.store.exit_note import read_exit_note
from nnwatch.store.health import read_end
from nnwatch.store.registry import RunInfo, inspect_dir
from nnwatch.store.ring_layout import ring_path
from nnwatch.store.runlog import RunLogError
from nnwatch.store.safe_read import read_small_file
from nnwatch.store.schema import FieldName, RunMeta

#: Runs that share a master address but started further apart than this are different jobs.
JOIN_WINDOW_S = 600.0
LOOPBACK = frozenset({"localhost", "127.0.0.1", "::1", "0.0.0.0", "127.0.1.1"})

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
        meta = loads(read_small_file(path))
        job = (meta.get("extra") or {}).get("job")
    except (OSError, ValueError, AttributeError, RecursionError):
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

    run_dir = Path(run_dir).expanduser()
    try:
        meta = RunMeta.from_json(read_small_file(run_dir / "meta.json"))
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
        ending=end or read_exit_note(run_dir), alive=seen.alive if seen else None,
    )  # fmt: skip


def job_of(run: RunInfo, runs: Iterable[RunInfo]) -> Job:
    """The job a run belongs to (itself alone when it is not part of a distributed job)."""
    others = [r for r in runs if r.run_dir != run.run_dir]
    for job in group_jobs([*others, run]):
        if any(r.run_dir == run.run_dir for r in job.runs):
            return job
    raise AssertionError("group_jobs dropped a run")  # pragma: no cover




# ------------------------------------------------------------------------------------------------
# The job summary (rank 0's table of every rank, from nnwatch.probe.job_summary)

#: Rank 0 writes it into its run directory when ``watch(job_summary_every=N)`` is on.
JOB_SUMMARY_FILE = "job.json"
#: One row per rank, float64 each, in this order (the collective's layout).
JOB_SUMMARY_FIELDS = (
    FieldName.STEP, FieldName.LOSS, FieldName.GRAD_NORM, FieldName.STEP_TIME, "nonfinite", "first_nonfinite", "memory", FieldName.TIME,
)  # fmt: skip


def read_job_summary(run_dir: str | os.PathLike[str]) -> dict[str, Any] | None:
    """Rank 0's ``job.json``: every rank's latest summary row and liveness, or None when the run
    has none (the job summary is off, or this is not rank 0)."""
    path = Path(run_dir) / JOB_SUMMARY_FILE
    try:
        doc = loads(read_small_file(path))
    except (OSError, ValueError, RecursionError):
        return None
    if not isinstance(doc, dict) or not isinstance(doc.get("ranks"), list):
        return None
    return doc
