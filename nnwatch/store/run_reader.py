"""Reading a run back: ``load_run()`` maps the log's rows as numpy arrays, checked block by block.

The layout is described in :mod:`nnwatch.store.runlog` (the writer). A reader never trusts what it
maps: rows whose checksum block does not match are left out with a warning naming their steps, a
row cut short by a ``kill -9`` is ignored, and a crashed run's last steps are taken from its ring.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from nnwatch.store.clean_text import loads
from nnwatch.store.copy_note import read_copy_note
from nnwatch.store.disk_errors import describe_os_error
from nnwatch.store.event_appender import EVENTS_FILE
from nnwatch.store.events import Event, FindingEvent
from nnwatch.store.log_verify import _checksummed, _failed_checksums, _header_mismatch, _zero_tail
from nnwatch.store.record_split import split_records
from nnwatch.store.ring_layout import ring_path
from nnwatch.store.runlog import (
    FILE_HEADER,
    HEADER_SIZE,
    KIND_LAYERS,
    KIND_SCALARS,
    LAYERS_FILE,
    MAGIC,
    MAGIC_V1,
    META_FILE,
    SCALARS_FILE,
    RowAppender,
    RunLogError,
)
from nnwatch.store.safe_read import held_size, iter_lines, open_regular, read_small_file
from nnwatch.store.schema import PARAM_LAYER_FIELDS, FieldName, RunMeta
from nnwatch.store.summary import RunSummary, last_finite

log = logging.getLogger("nnwatch")


@dataclass
class Run:
    """A run's whole history. ``run["loss"]`` is the loss of every step as a numpy array."""

    run_dir: Path
    meta: RunMeta
    scalars: np.ndarray
    layers: np.ndarray
    #: typed events (:mod:`nnwatch.store.events`), each also readable as its line's dict
    events: list[Event] = field(default_factory=list)
    status: str = "finished"
    end: dict[str, Any] = field(default_factory=dict)
    warnings: list[str] = field(default_factory=list)
    #: a copy pulled from another host (``copied.json``): where from, and what it said there
    copy: dict[str, Any] | None = None

    def __getitem__(self, name: str) -> np.ndarray:
        if name in (self.scalars.dtype.names or ()):
            return self.scalars[name]
        raise KeyError(
            f"{name!r} is not a per-step metric; choose from {', '.join(self.scalars.dtype.names or ())}"
        )

    def __len__(self) -> int:
        return len(self.scalars)

    def summary(self) -> RunSummary:
        """Name, status, steps, the last loss and grad norm, the findings: what a notebook shows."""
        findings: list[Mapping[str, Any]] = [
            {k: e.get(k) for k in ("kind", "severity", "step", "summary", "remedy")}
            for e in self.findings if e.get("type") == "finding"  # typed lines, as it always listed
        ]
        return RunSummary(
            name=self.meta.name, status=self.status, steps=len(self),
            loss=last_finite(self.scalars[FieldName.LOSS]) if len(self) else None,
            grad_norm=last_finite(self.scalars[FieldName.GRAD_NORM]) if len(self) else None,
            run_dir=str(self.run_dir), findings=findings,
        )

    def __repr__(self) -> str:
        return self.summary().text()

    def _repr_html_(self) -> str:
        return self.summary().html()

    def plot(self, metrics: tuple[str, ...] = (FieldName.LOSS, FieldName.GRAD_NORM), ax: Any = None) -> Any:
        """The run's series with matplotlib (installed separately), one panel per metric.

        Unmeasured steps (NaN) are gaps; the grad norm is on a log axis. Returns the figure.
        """
        try:
            import matplotlib.pyplot as plt
        except ImportError as exc:
            raise RuntimeError("run.plot() needs matplotlib: pip install matplotlib") from exc
        if ax is None:
            fig, grid = plt.subplots(len(metrics), 1, sharex=True, squeeze=False,
                                     figsize=(8, 2.2 * len(metrics)))
            axes: list[Any] = list(grid[:, 0])
        else:
            axes = list(ax) if isinstance(ax, (list, tuple)) else [ax]
            fig = axes[0].figure
        for a, name in zip(axes, metrics, strict=False):
            values = self[name]
            values = values[:, 0] if values.ndim == 2 else values
            a.plot(self.steps, values, lw=0.8)
            a.set_ylabel(name)
            if name.startswith(FieldName.GRAD_NORM):
                a.set_yscale("log")
        axes[-1].set_xlabel("step")
        fig.suptitle(f"{self.meta.name} ({self.status})")
        return fig

    @property
    def steps(self) -> np.ndarray:
        return self.scalars[FieldName.STEP]

    @property
    def layer_names(self) -> tuple[str, ...]:
        return self.meta.schema.layer_names

    def layer_stat(self, stat: str, layer: str) -> tuple[np.ndarray, np.ndarray]:
        """(steps, values) of one per-layer stat (``act_zero``, ``grad_layer``, ``update_layer``,
        ...) for one layer."""
        names = self.meta.schema.param_layer_names if stat in PARAM_LAYER_FIELDS else self.layer_names
        if layer not in names:
            raise KeyError(f"no layer {layer!r}; layers are: {', '.join(names)}")
        if stat not in (self.layers.dtype.names or ()):
            raise KeyError(f"{stat!r} is not recorded in this run (schema {self.meta.schema.version})")
        i = names.index(layer)
        return self.layers[FieldName.STEP], self.layers[stat][:, i]

    def update_ratio(self, layer: str) -> tuple[np.ndarray, np.ndarray]:
        """(steps, update norm / weight norm) of one parameter-owning layer, on measured updates:
        about 1e-3 is the classic healthy band (NaN where the layer was not updated)."""
        steps, update = self.layer_stat(FieldName.UPDATE_LAYER, layer)
        _, weight = self.layer_stat(FieldName.WEIGHT_LAYER, layer)
        with np.errstate(divide="ignore", invalid="ignore"):
            return steps, update.astype(np.float64) / weight.astype(np.float64)

    @property
    def findings(self) -> list[FindingEvent]:
        """The detectors' findings as written (``e.finding`` is the :class:`Finding`)."""
        return [e for e in self.events if isinstance(e, FindingEvent)]


def _map_rows(
    path: Path, dtype: np.dtype, kind: int, warnings: list[str], *, ended: bool = True
) -> np.ndarray:
    """The rows of one log file, memory-mapped; rows whose checksum fails are left out (one
    warning names their steps), and a partial last row (a killed writer) is ignored."""
    try:
        fd = open_regular(path)
    except FileNotFoundError:
        warnings.append(f"{path.name} is missing")
        return np.zeros(0, dtype=dtype)
    except OSError as exc:
        raise RunLogError(f"{path} cannot be read: {exc.strerror or exc}") from exc
    with os.fdopen(fd, "rb") as fh:
        on_disk = os.fstat(fh.fileno()).st_size
        size = held_size(fh.fileno(), on_disk)  # a hole at the end holds no rows
        if size < HEADER_SIZE:
            if size:
                warnings.append(f"{path.name} is shorter than its header ({size} bytes)")
            return np.zeros(0, dtype=dtype)
        magic, row_size, file_kind = FILE_HEADER.unpack(fh.read(FILE_HEADER.size))
        if magic not in (MAGIC, MAGIC_V1):
            raise RunLogError(f"{path} is not an nnwatch log (bad magic {magic!r}); it may be corrupt")
        if row_size != dtype.itemsize or file_kind != kind:
            raise RunLogError(_header_mismatch(path, size, row_size, file_kind, dtype.itemsize))
        n, extra = divmod(size - HEADER_SIZE, row_size)
        if extra and size == on_disk:
            warnings.append(
                f"{path.name}: ignored a partial last row ({extra} bytes: its write was cut short, "
                "by a writer that was killed or a disk that filled up)"
            )
        if n == 0:
            return np.zeros(0, dtype=dtype)
        rows: np.ndarray = np.memmap(fh, dtype=dtype, mode="r", offset=HEADER_SIZE, shape=(n,))
    covered = _checksummed(path) if magic == MAGIC else 0  # rows a checksum vouches for stay
    zeros = min(_zero_tail(rows), max(0, len(rows) - covered))
    if zeros or size < on_disk:
        rows = rows[: len(rows) - zeros]
        left = on_disk - HEADER_SIZE - len(rows) * row_size
        warnings.append(
            f"{path.name}: left out its last {left} bytes, zeros never written as rows (the file "
            "was extended past its last row, as a crash or a copy can leave it)"
        )
    if magic == MAGIC:
        bad = _failed_checksums(path, rows, warnings, ended=ended)
        if bad is not None:
            steps = np.asarray(rows[FieldName.STEP][bad], dtype=np.float64)
            span = f"steps {steps.min():.0f}-{steps.max():.0f}" if np.isfinite(steps).all() else "rows"
            warnings.append(
                f"{path.name}: {int(bad.sum())} row(s) ({span}) failed their checksum (the file "
                "was damaged on disk) and were left out"
            )
            rows = np.asarray(rows[~bad])
    return rows


def iter_events(path: Path, warnings: list[str] | None = None) -> Iterator[dict[str, Any]]:
    """The lines of ``events.jsonl`` as JSON objects, skipping (and counting) lines that are not;
    :func:`read_events` types them."""
    if not os.path.lexists(path):
        return
    bad = 0
    try:  # never a link, never a FIFO; as far as the file holds data; no line without end
        for raw in iter_lines(path):
            if raw is None:  # a line too long to be ours
                bad += 1
                continue
            try:
                ev = loads(raw)
            except (ValueError, RecursionError):  # a line nested past the parser's depth too
                bad += 1
                continue
            if isinstance(ev, dict):
                yield ev
            else:
                bad += 1
    except OSError as exc:
        if warnings is not None:
            warnings.append(f"{path.name} cannot be read ({exc.strerror or exc}); no events")
    if bad and warnings is not None:
        warnings.append(f"{path.name}: skipped {bad} unreadable line(s)")


def read_events(path: Path, warnings: list[str] | None = None) -> list[Event]:
    """The events of ``events.jsonl``, typed (a line of an unknown type is an ``OtherEvent``)."""
    return [Event.from_json(d) for d in iter_events(path, warnings)]


def _pid_alive(pid: int, started: float) -> bool:
    try:
        import psutil

        proc = psutil.Process(pid)
        # the run started after its process did; a younger process reuses the pid
        return bool(proc.create_time() <= started + 1.0)
    except Exception:  # noqa: BLE001 - psutil raises several kinds for "gone"
        return False


def _writer_alive(run_dir: Path, meta: RunMeta) -> bool:
    """Whether the run's process still runs: by its pid when that can be checked from here, else
    (a trainer in another PID namespace) by a fresh heartbeat in its ring."""
    from nnwatch.store.identity import pid_checkable  # lazy: pulls psutil into ls start-up

    if pid_checkable(None, (meta.extra or {}).get("pid_ns")):
        return _pid_alive(meta.pid, meta.started)
    try:
        from nnwatch.store.health import HEARTBEAT_STALE  # lazy: as above
        from nnwatch.store.ring_layout import ENDED, RingError  # lazy: guarded, optional
        from nnwatch.store.ring_reader import RingReader  # lazy: guarded, optional

        with RingReader(ring_path(run_dir, meta.rank), start="latest") as reader:
            state = reader.state()
    except (ImportError, RingError, OSError, ValueError):
        return False
    return state.status not in ENDED and state.heartbeat_age() <= HEARTBEAT_STALE


def load_run(run_dir: str | os.PathLike[str]) -> Run:
    """Load a run directory, finished, crashed or still running, as numpy arrays (memory-mapped)."""
    run_dir = Path(run_dir).expanduser()
    if not run_dir.is_dir():
        raise RunLogError(f"{run_dir} is not a directory; pass the run directory that watch() printed")
    meta_path = run_dir / META_FILE
    if not meta_path.exists():
        raise RunLogError(
            f"{run_dir} has no {META_FILE}: it is not an nnwatch run, or the run never finished a step"
        )
    try:
        meta = RunMeta.from_json(read_small_file(meta_path))
    except OSError as exc:
        raise RunLogError(f"{meta_path} cannot be read: {exc.strerror or exc}") from exc
    except (ValueError, KeyError, TypeError) as exc:
        raise RunLogError(f"{meta_path} is corrupt ({exc}); the run cannot be decoded") from exc
    warnings: list[str] = []
    schema = meta.schema
    from nnwatch.store.health import ended_as, read_end  # lazy: pulls psutil into ls start-up

    end: dict[str, Any] = read_end(run_dir) or {}
    copy = read_copy_note(run_dir)
    if end:
        if end.get("damaged"):
            warnings.append(f"{end['damaged']}; the run is taken as ended ({end['status']})")
        status = ended_as(end.get("status"))
    elif copy is not None:  # no process here wrote it: its pid means nothing on this machine
        status = "copied"
    elif _writer_alive(run_dir, meta):
        status = "running"
    else:  # no end.json: a full disk at the end may have stopped it; the ring may still tell
        status = _ring_status(run_dir, meta) or "crashed"
    ended = status != "running"  # a live writer's newest rows may not have their checksum yet
    scalars = _map_rows(run_dir / SCALARS_FILE, schema.scalar_dtype(), KIND_SCALARS, warnings, ended=ended)
    layers = _map_rows(run_dir / LAYERS_FILE, schema.layer_row_dtype(), KIND_LAYERS, warnings, ended=ended)
    events = read_events(run_dir / EVENTS_FILE, warnings)
    if status != "running":
        scalars, layers = _merge_ring_tail(run_dir, meta, scalars, layers, warnings)
    return Run(run_dir, meta, scalars, layers, events, status, end, warnings, copy)


def _ring_unreadable(path: Path, meta: RunMeta) -> str:
    """Why the ring at ``path`` cannot be folded into the log ("" when it can): a newer format,
    a damaged header, records of another layout."""
    from nnwatch.store.ring_layout import RingError  # lazy: guarded, optional
    from nnwatch.store.ring_reader import RingReader  # lazy: guarded, optional

    try:
        with RingReader(path, start="oldest") as reader:
            reader.state()
            if reader.dtype != meta.schema.record_dtype():
                return "its records do not have the layout meta.json describes"
    except (RingError, OSError, ValueError) as exc:
        return f"it cannot be read ({exc})"
    return ""


def _ring_status(run_dir: Path, meta: RunMeta) -> str | None:
    """"finished" or "crashed" as the ring header says, when the run ended without ``end.json``."""
    try:
        from nnwatch.store.ring_layout import RingError, ring_path  # lazy: guarded, optional
        from nnwatch.store.ring_reader import RingReader  # lazy: guarded, optional
    except ImportError:
        return None
    try:
        with RingReader(ring_path(run_dir, meta.rank), start="latest") as reader:
            said = reader.state().status
    except (RingError, OSError, ValueError):
        return None
    return {"finished": "finished", "stopped": "interrupted", "crashed": "crashed"}.get(said)


def _merge_ring_tail(
    run_dir: Path, meta: RunMeta, scalars: np.ndarray, layers: np.ndarray, warnings: list[str]
) -> tuple[np.ndarray, np.ndarray]:
    """Append the records that reached the ring but not the log (the writer thread drains the
    log every ~100 ms, so a ``kill -9`` leaves the newest steps only in the ring file)."""
    try:
        from nnwatch.store.ring_layout import RingError, ring_path  # lazy: guarded, optional
        from nnwatch.store.ring_reader import RingReader  # lazy: guarded, optional
    except ImportError:  # a build without the live channel has no ring to merge
        return scalars, layers

    path = ring_path(run_dir, meta.rank)
    if not path.exists():
        return scalars, layers
    try:
        with RingReader(path, start="oldest") as reader:
            records = reader.read()
    except (RingError, OSError, ValueError) as exc:
        warnings.append(f"could not read the ring file for the last steps: {exc}")
        return scalars, layers
    if reader.torn:
        warnings.append(
            f"{reader.torn} record(s) in the ring file failed their checksum and were skipped"
        )
    if reader.dtype != meta.schema.record_dtype() or not len(records):
        return scalars, layers
    finite = np.isfinite(records[FieldName.STEP])
    if not finite.all():
        warnings.append(f"skipped {int((~finite).sum())} ring record(s) without a step number")
        records = records[finite]
    last = float(scalars[FieldName.STEP][-1]) if len(scalars) and np.isfinite(scalars[FieldName.STEP][-1]) else -1.0
    tail = records[records[FieldName.STEP] > last]
    if not len(tail):
        return scalars, layers
    more_s, more_l = split_records(np.ascontiguousarray(tail), meta.schema)
    warnings.append(f"recovered the last {len(tail)} step(s) from the ring file")
    return np.concatenate([scalars, more_s]), np.concatenate([layers, more_l])


def fold_ring_into_log(run_dir: str | os.PathLike[str]) -> tuple[int, str]:
    """For a run whose process is gone: append the steps that only its ring file holds to the
    log, then remove the ring (16 MiB of RAM on /dev/shm). Returns (steps recovered, what was
    done, in words). The ring is kept when the log could not take its steps (a full disk)."""
    run_dir = Path(run_dir)
    run = load_run(run_dir)  # raises RunLogError for what is not a readable run
    if run.status == "running":
        return 0, "still running"
    path = ring_path(run_dir, run.meta.rank)
    if not os.path.lexists(path):
        return 0, "no ring file"
    unreadable = _ring_unreadable(path, run.meta)
    if unreadable:  # its steps may be the only copy: never remove what could not be read
        return 0, f"kept the ring: {unreadable}; no step was moved"
    on_disk = len(_map_rows(run_dir / SCALARS_FILE, run.meta.schema.scalar_dtype(), KIND_SCALARS, []))
    extra = run.scalars[on_disk:] if len(run.scalars) > on_disk else run.scalars[:0]
    extra_l = np.zeros(0, run.layers.dtype)
    if len(extra):
        first = extra[FieldName.STEP][0]
        extra_l = run.layers[np.asarray(run.layers[FieldName.STEP]) >= first]
        try:
            appenders = [
                RowAppender(run_dir / SCALARS_FILE, run.meta.schema.scalar_size, KIND_SCALARS),
                RowAppender(run_dir / LAYERS_FILE, run.layers.dtype.itemsize, KIND_LAYERS),
            ]
        except (OSError, RunLogError) as exc:
            return 0, f"kept the ring: the log cannot take its steps ({describe_os_error(exc, run_dir)})"
        try:
            appenders[0].append(np.ascontiguousarray(extra).tobytes())
            if len(extra_l):
                appenders[1].append(np.ascontiguousarray(extra_l).tobytes())
        except OSError as exc:
            return 0, f"kept the ring: the log cannot take its steps ({describe_os_error(exc, run_dir)})"
        finally:
            for a in appenders:
                a.close()
    try:
        os.unlink(path)
    except OSError as exc:
        return len(extra), f"could not remove the ring: {exc.strerror or exc}"
    return len(extra), f"moved {len(extra)} step(s) from the ring into the log and removed the ring"
