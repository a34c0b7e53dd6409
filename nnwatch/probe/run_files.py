"""The run's directory, what the probe writes into it, and where each record goes from there.

The directory is made when the watch starts (an explicit ``run_dir``, never reused for a second
run, or a fresh one under the private root); the run's metadata (:class:`~nnwatch.store.schema.RunMeta`)
is fixed at the first step, when the layer order is known, and the run log opens with it,
followed by the live channel (ring file and command socket in the same directory), the detectors
and the TensorBoard export, which read what the log drains. The last records are also kept in
memory, raw, for snapshots and detectors.
"""

from __future__ import annotations

import contextlib
import os
import socket
import sys
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

import numpy as np
import torch

from nnwatch._version import __version__
from nnwatch.store.events import Event
from nnwatch.store.identity import pid_namespace
from nnwatch.store.jobs import job_extra
from nnwatch.store.overview import OverviewWriter
from nnwatch.store.paths import (
    RunDirError,
    default_root,
    ensure_private_dir,
    make_run_dir,
    pin_dir,
    unpin_dir,
)
from nnwatch.store.runlog import RunLogWriter
from nnwatch.store.safe_read import read_small_file
from nnwatch.store.schema import FieldName, RunMeta, RunSchema
from nnwatch.store.summary import RunSummary, last_finite

if TYPE_CHECKING:
    from nnwatch.channel.endpoint import RunEndpoint
    from nnwatch.diagnosis.live import Diagnosis
    from nnwatch.export.tensorboard import LiveExport
    from nnwatch.probe.mate_watch import MateWatch
    from nnwatch.store.finding import Finding

RECENT_STEPS = 500  # records kept in memory for snapshots


@dataclass(frozen=True)
class RankInfo:
    rank: int = 0
    local_rank: int = 0
    world_size: int = 1

    @classmethod
    def detect(cls) -> RankInfo:
        """From torch.distributed when it is initialised, else from the launcher's variables."""
        try:
            import torch.distributed as dist

            if dist.is_available() and dist.is_initialized():
                return cls(
                    dist.get_rank(),
                    int(os.environ.get("LOCAL_RANK", dist.get_rank())),
                    dist.get_world_size(),
                )
        except Exception:  # noqa: BLE001 - a broken process group must not stop the probe
            pass
        env = os.environ
        return cls(
            int(env.get("RANK", 0)), int(env.get("LOCAL_RANK", 0)), int(env.get("WORLD_SIZE", 1))
        )


def gpu_uuids(device: torch.device) -> list[str]:
    """The UUID of the run's GPU, so a monitor can match it in NVML whatever the index order."""
    if device.type != "cuda":
        return []
    try:
        return [str(torch.cuda.get_device_properties(device).uuid)]
    except Exception:  # noqa: BLE001 - a driver hiccup must not stop the run
        return []


def choose_run_dir(
    run_dir: str | os.PathLike[str] | None,
    name: str,
    started: float,
    rank: RankInfo,
    warn: Callable[[str, str], None],
    *,
    append: bool = False,
) -> Path:
    """Make the run's directory: ``run_dir`` (or a fresh sibling when it holds a run), else a
    new one under the private root named after the run, its start time, pid and rank.

    In a job of several ranks every rank is given the same ``run_dir`` (one script for all), and
    none has written its ``meta.json`` yet when they choose: each rank gets ``<run_dir>-r<rank>``,
    as the default directories are named, so that no two logs land in one directory.

    ``append``: ``run_dir`` is the run this watch continues (``resume=True``): its log will be
    appended to (see :func:`same_layout`).
    """
    if run_dir is not None:
        path = Path(run_dir).expanduser()
        if rank.world_size > 1 and not append:
            path = path.parent / f"{path.name}-r{rank.rank}"
            warn("run-dir-rank", f"rank {rank.rank} of {rank.world_size} writes to {path}")
        if append and (path / "meta.json").exists():
            return make_run_dir(path)  # still ours, still not a symlink
        if (path / "meta.json").exists():  # an earlier run's directory: never mix two logs
            n = 2
            while (path.parent / f"{path.name}-{n}").exists():
                n += 1
            fresh = path.parent / f"{path.name}-{n}"
            warn("run-dir-reused", f"{path} already holds a run; this one is written to {fresh} instead")
            path = fresh
        return make_run_dir(path)  # never another user's directory, never a symlink
    root = ensure_private_dir(default_root())
    runs = ensure_private_dir(root / "runs")
    safe = "".join(c if c.isalnum() or c in "-_." else "-" for c in name)[:40] or "run"
    stamp = time.strftime("%Y%m%d-%H%M%S", time.localtime(started))
    suffix = f"-r{rank.rank}" if rank.world_size > 1 else ""
    base = f"{safe}-{stamp}-{os.getpid()}{suffix}"
    for n in range(1000):  # two watches of one name in the same second get -2, -3, ...
        path = runs / (base if n == 0 else f"{base}-{n + 1}")
        try:
            path.mkdir(mode=0o700)
            return path
        except FileExistsError:
            continue
    raise RunDirError(f"could not create a fresh run directory under {runs}")


def same_layout(run_dir: Path, schema: RunSchema) -> bool:
    """Whether the run in ``run_dir`` records rows of exactly ``schema``'s layout."""
    try:
        earlier = RunMeta.from_json(read_small_file(Path(run_dir) / "meta.json"))
    except (OSError, ValueError, KeyError, TypeError):
        return False
    return earlier.schema == schema


def build_meta(
    *,
    name: str,
    schema: RunSchema,
    started: float,
    device: torch.device,
    num_classes: int | None,
    rank: RankInfo,
    extra: dict[str, Any],
) -> RunMeta:
    """The run's metadata, at its first step (the schema's layer order is known then)."""
    return RunMeta(
        name=name,
        schema=schema,
        pid=os.getpid(),
        host=socket.gethostname(),
        started=started,
        device=str(device),
        num_classes=num_classes,
        rank=rank.rank,
        local_rank=rank.local_rank,
        world_size=rank.world_size,
        nnwatch_version=__version__,
        torch_version=torch.__version__,
        extra={
            "argv": list(sys.argv),
            "executable": sys.executable,  # how `nnwatch HOST` finds nnwatch there over ssh
            "cwd": os.getcwd(),
            **extra,
            "gpu_uuids": gpu_uuids(device),
            **job_extra(),
            "pid_ns": pid_namespace(),  # the pid above is only checked from the same namespace
        },
    )


def optimizer_has_state(optimizer: Any) -> bool:
    """Whether an optimizer has stepped before (Adam's moments, SGD's momentum buffers).

    Plain SGD keeps no state, so a resumed plain-SGD run is not recognised: a hint, not a proof.
    """
    try:
        return any(bool(v) for v in optimizer.state.values()) if optimizer is not None else False
    except Exception:  # noqa: BLE001 - an optimizer-like object without the usual state dict
        return False


def optimizer_step(optimizer: Any) -> int:
    """How many steps an optimizer has taken (Adam's and most others' per-parameter ``step``).

    Read once, when the watch starts; 0 for a fresh optimizer or one that keeps no count.
    """
    try:
        counts = [
            int(state["step"]) for state in optimizer.state.values()
            if isinstance(state, dict) and "step" in state
        ] if optimizer is not None else []
    except Exception:  # noqa: BLE001 - an optimizer-like object with its own bookkeeping
        return 0
    return max(counts, default=0)


EARLY_EVENTS = 64  # events kept from before the run log starts (the first step's)


#: One place a finished step record goes, on the training thread: the in-memory tail, the run log
#: (whose writer thread feeds its observers: the overview, the detectors, the exporters), the ring.
RecordSink = Callable[[bytes], None]


class RunFiles:
    """Owns the run directory and the record sinks: one :meth:`publish` feeds each record to
    every sink (the in-memory tail, the run log, the live channel's ring); the log's writer thread
    feeds its observers (overview, detectors, TensorBoard) in turn. Ends them in order."""

    def __init__(self) -> None:
        self.dir = Path()
        #: the run directory, opened once at the first step: every file is written through it
        self._pin: str | None = None
        #: where each record goes, in order (filled at the first step)
        self.sinks: list[RecordSink] = []
        self.log: RunLogWriter | None = None
        self.recent: deque[bytes] | None = None  # the last records, raw, for snapshots
        self.channel: RunEndpoint | None = None  # the ring file and command socket
        self.diagnosis: Diagnosis | None = None  # the detectors (an observer of the log)
        self.exporter: LiveExport | None = None  # the live TensorBoard export (an observer too)
        self.mates: MateWatch | None = None  # this node's other ranks, watched for a silent death
        #: events of the first step that came before its record started the log (a finding the
        #: probe makes during step 0), written when the outputs start; None after
        self.early: list[Event] | None = []

    def start(
        self, meta: RunMeta, on_error: Callable[[str], None], *, append: bool, warn: Callable[[str, str], None]
    ) -> None:
        """At the first step: go on in the run being resumed (``append``) when its records have
        this layout, else in a fresh sibling directory (never two layouts in one log); then
        open the log. Raises OSError (or RunDirError) when the directory cannot be written."""
        if append and same_layout(self.dir, meta.schema):
            (self.dir / "end.json").unlink(missing_ok=True)  # the run goes on
        elif append:
            # the earlier run has other layers or LR groups: a fresh sibling directory instead
            rank = RankInfo(meta.rank, meta.local_rank, meta.world_size)
            self.dir = choose_run_dir(self.dir, meta.name, meta.started, rank, warn)
        self.open(meta, on_error)

    def open(self, meta: RunMeta, on_error: Callable[[str], None]) -> None:
        """Start the run log (at the first step). Raises OSError when it cannot be written."""
        self.recent = deque(maxlen=RECENT_STEPS)
        self._pin = pin_dir(self.dir)  # never re-resolved: a swapped symlink redirects nothing
        try:
            self.log = RunLogWriter(self.dir, meta)
        except BaseException:
            with contextlib.suppress(Exception):  # never in place of what is propagating
                unpin_dir(self._pin)
            self._pin = None
            raise
        self.log.on_error.append(on_error)
        self.sinks += [self.recent.append, self.log.put]
        try:  # multi-resolution summaries beside the log, for remote monitors (overview.bin)
            self.log.observers.append(OverviewWriter(self.dir, meta.schema.scalar_dtype(), self.log))
        except Exception:  # noqa: BLE001 - monitors then build them from the log
            pass

    def add_channel(self, channel: RunEndpoint | None) -> None:
        """The live channel (a :class:`~nnwatch.channel.endpoint.RunEndpoint`, or None when it
        could not start): the log keeps what the ring holds, and a failed log shows in the ring
        header, so monitors say why history stopped."""
        self.channel = channel
        if channel is not None:
            self.sinks.append(channel.ring.publish)  # the ring's own method: one call a record
            if self.log is not None:
                self.log.keep_within(channel.ring.slots)
                self.log.on_error.append(channel.ring.set_log_error)

    def flush_early(self) -> None:
        """The outputs started: write the events that came before the log."""
        early, self.early = self.early, None
        for event in early or ():
            self.event(event)

    def publish(self, data: bytes) -> None:
        """One finished step record, to every sink."""
        for sink in self.sinks:
            sink(data)

    def event(self, event: Event) -> None:
        early = self.early
        if early is not None and self.log is None:
            if len(early) < EARLY_EVENTS:
                early.append(event)
            return
        if self.log is not None:
            self.log.events.event(event)  # monitors read events from events.jsonl

    def close(self, status: str, step: int, ending: dict[str, Any]) -> None:
        """After the last records were flushed: detectors, log (``end.json``), export, channel."""
        if self.diagnosis is not None:
            self.diagnosis.close()
        if self.mates is not None:
            self.mates.close()
        run_log = self.log
        if run_log is not None:
            run_log.close(status, step, ending)
        if self.exporter is not None:
            self.exporter.close()  # after the log's last drain reached it
        if self.channel is not None:
            # Once the log holds every record the ring is only a 16 MiB copy in RAM (/dev/shm):
            # remove it. Keep it when the log failed, since it may hold steps the log lacks.
            self.channel.close(
                "stopped" if status == "interrupted" else status,
                remove_ring=run_log is not None and run_log.error is None,
            )
        if self._pin is not None:
            unpin_dir(self._pin)
            self._pin = None

    def summary(
        self, name: str, status: str, steps: int, schema: RunSchema, findings: list[Finding]
    ) -> RunSummary:
        """The run in a few lines (a notebook's view): the last loss and grad norm from the tail."""
        rows = self.recent_records(schema)
        names = rows.dtype.names or () if len(rows) else ()
        return RunSummary(
            name=name, status=status, steps=steps,
            loss=last_finite(rows["loss"]) if "loss" in names else None,
            grad_norm=last_finite(rows[FieldName.GRAD_NORM]) if FieldName.GRAD_NORM in names else None,
            run_dir=str(self.dir),
            findings=[f.to_dict() for f in findings],
        )

    def recent_records(self, schema: RunSchema) -> np.ndarray:
        """Up to the last 500 step records, oldest first."""
        if not self.recent:
            return np.zeros(0)
        raw = b"".join(self.recent.copy())  # deque.copy() is atomic under the GIL
        rows = np.frombuffer(raw, dtype=schema.record_dtype()).copy()
        rows = rows[np.isfinite(rows["step"])]
        return cast("np.ndarray", rows[np.argsort(rows["step"], kind="stable")])
