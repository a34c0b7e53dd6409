"""The durable run log: every step record, appended off the training thread, loadable as arrays.

Layout in the run directory:

- ``meta.json``   the run's :class:`~nnwatch.store.schema.RunMeta` (names, sizes, versions)
- ``scalars.bin`` a 64-byte header, then one fixed-size row per step (``schema.scalar_dtype()``)
- ``layers.bin``  the same header, then one row per step whose per-layer stats were sampled or that
                  held a non-finite value (``schema.layer_row_dtype()``)
- ``scalars.crc``, ``layers.crc`` one 16-byte checksum entry per block of rows the writer
                  appended (u64 first row, u32 rows, u32 CRC32 of their bytes); format 2 only
- ``events.jsonl`` findings, snapshots and commands, one JSON object per line
- ``end.json``    written at a clean close; its absence with a dead pid means the run crashed.
                  Its space is reserved when the run starts (``.end.json.reserve``), so that a
                  disk that fills up during training cannot turn a clean end into "crashed".

Format 2 (magic ``NNWLOG2``) adds the checksums; format 1 logs (``NNWLOG1``) are still read,
without them. The checksums sit beside the rows rather than inside them so that numpy still maps
the rows as they are; a block whose bytes changed on disk is left out with one warning naming its
steps, and rows written after the last checksum (a ``kill -9`` between the two writes) are kept.

Fixed-size binary rows were chosen over JSON lines or SQLite because numpy maps them without
parsing (10 million steps open in milliseconds), a reader can follow the file while it grows, and
a ``kill -9`` can only cut the last row short, which the loader then ignores.
"""

from __future__ import annotations

import functools
import json
import logging
import os
import struct
import threading
import time
import zlib
from collections import deque
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from nnwatch.store.schema import GRAD_LAYER_FIELD, RunMeta, RunSchema, sums_measured
from nnwatch.store.summary import RunSummary, last_finite

log = logging.getLogger("nnwatch")

MAGIC_V1 = b"NNWLOG1\0"
MAGIC = b"NNWLOG2\0"  # format 2: rows plus a checksum file beside them
HEADER_SIZE = 64
_HEADER = struct.Struct("<8sII")  # magic, row size, kind (0 scalars, 1 layers)
_BLOCK = struct.Struct("<QII")  # checksum entry: first row, rows, CRC32
KIND_SCALARS, KIND_LAYERS = 0, 1
SCALARS_FILE, LAYERS_FILE, META_FILE = "scalars.bin", "layers.bin", "meta.json"
EVENTS_FILE, END_FILE = "events.jsonl", "end.json"
END_RESERVE_FILE = ".end.json.reserve"
#: Bytes kept for ``end.json`` from the start of the run (an exception's message is cut to fit).
END_RESERVE = 16 * 1024


class RunLogError(RuntimeError):
    """A run directory cannot be read; the message names the file and what to do."""


def _header(row_size: int, kind: int) -> bytes:
    return _HEADER.pack(MAGIC, row_size, kind).ljust(HEADER_SIZE, b"\0")


def crc_path(path: Path) -> Path:
    """The checksum file beside a row file: ``scalars.bin`` -> ``scalars.crc``."""
    return path.with_suffix(".crc")


class RowAppender:
    """Appends fixed-size rows to one log file, and a checksum entry per block to the file beside
    it. Every file is opened without following symlinks and must be a regular file of ours."""

    def __init__(self, path: Path, row_size: int, kind: int) -> None:
        from nnwatch.store.paths import open_for_append

        self.path = path
        self.row_size = row_size
        self.fd = open_for_append(path)
        self.crc_fd = -1
        try:
            size = os.fstat(self.fd).st_size
            if size == 0:
                _write_all(self.fd, _header(row_size, kind))
                size = HEADER_SIZE
                checked = True
            else:
                head = _read_head(path)
                checked = head == MAGIC
                if head not in (MAGIC, MAGIC_V1):
                    raise RunLogError(f"{path} is not an nnwatch log; not appending to it")
            self.rows, partial = divmod(max(0, size - HEADER_SIZE), row_size)
            if partial:  # a killed writer's cut row: new rows must start on a row boundary
                os.ftruncate(self.fd, HEADER_SIZE + self.rows * row_size)
            if checked:
                self.crc_fd = open_for_append(crc_path(path))
                cut = os.fstat(self.crc_fd).st_size % _BLOCK.size
                if cut:
                    os.ftruncate(self.crc_fd, os.fstat(self.crc_fd).st_size - cut)
        except BaseException:
            self.close()
            raise

    def append(self, data: bytes) -> None:
        n = len(data) // self.row_size
        if not n:
            return
        _write_all(self.fd, data)
        first, self.rows = self.rows, self.rows + n
        if self.crc_fd >= 0:
            _write_all(self.crc_fd, _BLOCK.pack(first, n, zlib.crc32(data)))

    def close(self) -> None:
        for fd in (self.fd, self.crc_fd):
            if fd >= 0:
                try:
                    os.close(fd)
                except OSError:
                    pass
        self.fd = self.crc_fd = -1


def _read_head(path: Path) -> bytes:
    from nnwatch.store.paths import open_regular

    fd = open_regular(path)
    try:
        return os.pread(fd, 8, 0)
    finally:
        os.close(fd)


@functools.lru_cache(maxsize=16)
def schema_dtypes(schema: RunSchema) -> tuple[np.dtype, np.dtype]:
    """(scalar row, layer row) dtypes; building them costs more than a live poll, so once a run."""
    return schema.scalar_dtype(), schema.layer_row_dtype()


def split_records(rows: np.ndarray, schema: RunSchema) -> tuple[np.ndarray, np.ndarray]:
    """Full step records -> (scalar rows, layer rows), as the log stores them.

    A layer row is kept for steps whose per-layer stats were sampled, and for any step that held
    a non-finite value, so that the origin of a NaN survives in the history. The live monitor
    splits ring records with this same function.
    """
    n = len(rows)
    scalar_dtype, row_dtype = schema_dtypes(schema)
    rows = np.ascontiguousarray(rows)
    raw = rows.view(np.uint8).reshape(n, schema.record_size)
    scalars = np.empty(n, dtype=scalar_dtype)
    scalars.view(np.uint8).reshape(n, -1)[:] = raw[:, : schema.scalar_size]
    keep = (
        (rows["layer_stats"] == 1.0)
        | (rows["nonfinite_grads"] == 1.0)
        | (~np.isfinite(rows["act_sum"]).all(axis=1) & sums_measured(rows))
    )
    layers = np.empty(int(keep.sum()), dtype=row_dtype)
    if len(layers):
        layers.view(np.uint8).reshape(len(layers), -1)[:, 8:] = raw[keep, schema.scalar_size :]
        layers["step"] = rows["step"][keep].astype(np.int64)
    return scalars, layers


class RunLogWriter:
    """Appends step records from a background thread so the training thread only enqueues.

    The training thread appends each record to a deque (no lock, no wake-up but the one below);
    the writer thread drains it every ``interval`` seconds (0.25 by default) and writes the batch
    with vectorized numpy. Waking the writer per record measured as GIL contention in the training
    thread, and each drain has a fixed cost (about 0.5 ms of CPU here, taken from the training's
    cores), so the batches are made long (writer CPU on a 50 ms CNN step with stats every step:
    0.7% at 0.1 s, 0.4% at 0.25 s). Durability against ``kill -9`` comes from the ring file
    instead: it lives in the same directory, and :func:`load_run` appends the ring's newer records
    to what the log holds. That needs the log to lag the ring by less than the ring holds: a loop
    fast enough to fill ``wake_at`` records (a quarter of the ring) within one interval wakes the
    writer early. A full disk or any write error is reported once through ``on_error`` and turns
    the writer into a counter of lost records: training goes on.
    """

    def __init__(
        self, run_dir: Path, meta: RunMeta, *, interval: float = 0.25, max_pending: int = 65536
    ) -> None:
        self.run_dir = Path(run_dir)
        self.meta = meta
        schema = meta.schema
        self._record_dtype = schema.record_dtype()
        self._record_size = schema.record_size
        self._scalar_size = schema.scalar_size
        self._layer_row_dtype = schema.layer_row_dtype()
        self._pending: deque[bytes] = deque()
        self._max_pending = max_pending
        self._interval = interval
        #: queue length at which the training thread wakes the writer before its interval is up
        self.wake_at = max_pending // 4
        self._stop = threading.Event()
        self._wake = threading.Event()
        self.written = 0
        self.lost = 0
        self.error: str | None = None
        self._events_lock = threading.Lock()
        self.on_error: list[Any] = []
        #: Called in the writer thread with each batch of new records (a structured array);
        #: the detectors live here, off the training thread.
        self.observers: list[Any] = []
        from nnwatch.store.paths import check_own_dir, open_for_append, write_private_file

        check_own_dir(self.run_dir)
        write_private_file(self.run_dir / META_FILE, meta.to_json().encode())
        self._scalars = RowAppender(self.run_dir / SCALARS_FILE, self._scalar_size, KIND_SCALARS)
        self._layers = RowAppender(
            self.run_dir / LAYERS_FILE, self._layer_row_dtype.itemsize, KIND_LAYERS
        )
        self._fd_s, self._fd_l = self._scalars.fd, self._layers.fd
        self._fd_e = open_for_append(self.run_dir / EVENTS_FILE)
        self._end_reserve = _reserve_end(self.run_dir)
        self._thread = threading.Thread(target=self._run, name="nnwatch-log", daemon=True)
        self._thread.start()

    # -- training thread -------------------------------------------------------------------------
    def put(self, record: bytes) -> None:
        """Queue one whole record (a private copy). O(1); drops and counts when hopelessly behind.

        Records keep coming after the log failed (a full disk): they are not written, but the
        observers (the detectors) still get them, so that a full disk never switches them off.
        """
        pending = self._pending
        n = len(pending)
        if n >= self._max_pending:
            self.lost += 1
            return
        pending.append(record)
        if n + 1 == self.wake_at:
            self._wake.set()

    def keep_within(self, ring_slots: int) -> None:
        """Wake early enough that the log never lags the ring beside it by a whole ring."""
        self.wake_at = max(1, ring_slots // 4)

    # -- any thread ------------------------------------------------------------------------------
    def event(self, event: dict[str, Any]) -> None:
        """Append one event line; events are rare, so this writes synchronously."""
        event = {"time": time.time(), **event}
        line = (json.dumps(event, default=_json_default, sort_keys=True) + "\n").encode()
        with self._events_lock:
            if self._fd_e < 0:
                return
            try:
                os.write(self._fd_e, line)
            except OSError as exc:
                self._fail(f"cannot append to {EVENTS_FILE}: {exc.strerror or exc}")

    def close(
        self, status: str = "finished", steps: int | None = None, details: dict[str, Any] | None = None
    ) -> None:
        """Flush every queued record, then write ``end.json``. Safe to call twice."""
        if self._fd_s < 0:
            return
        self._stop.set()
        self._wake.set()
        if self._thread.is_alive():
            self._thread.join(timeout=30)
        if self._thread.is_alive():  # stuck (a hung disk): never write beside it
            self.lost += len(self._pending)
            log.error("nnwatch: the run log writer is stuck; %d record(s) not written", self.lost)
            return
        self._drain()
        with self._events_lock:
            self._scalars.close()
            self._layers.close()
            try:
                os.close(self._fd_e)
            except OSError:
                pass
            self._fd_s = self._fd_l = self._fd_e = -1
        end = {
            **(details or {}), "status": status, "steps": steps, "ended": time.time(),
            "lost_records": self.lost,
        }
        if self.error is not None:
            end["log_error"] = self.error
        _write_end(self.run_dir, end, self._end_reserve)

    # -- writer thread ---------------------------------------------------------------------------
    def _run(self) -> None:
        while True:
            self._wake.wait(self._interval)
            self._wake.clear()
            if self._stop.is_set():
                return  # close() drains what is left, once the thread is gone
            self._drain()

    def _drain(self) -> None:
        records: list[bytes] = []
        pop = self._pending.popleft
        try:
            while True:
                records.append(pop())
        except IndexError:
            pass
        good = [r for r in records if len(r) == self._record_size]
        if len(good) != len(records):
            self.lost += len(records) - len(good)
            log.error("nnwatch: dropped %d malformed record(s)", len(records) - len(good))
        if not good:
            return
        rows = np.frombuffer(b"".join(good), dtype=self._record_dtype)
        self._write(rows)
        for observer in list(self.observers):
            try:
                observer(rows)
            except Exception as exc:  # noqa: BLE001 - a broken detector must not stop the log
                self.observers.remove(observer)
                log.error("nnwatch: a detector failed and was switched off: %r", exc)

    def _write(self, rows: np.ndarray) -> None:
        if self.error is not None:
            self.lost += len(rows)
            return
        scalars, layer_rows = split_records(rows, self.meta.schema)
        try:
            self._scalars.append(scalars.tobytes())
            if len(layer_rows):
                self._layers.append(layer_rows.tobytes())
            self.written += len(rows)
        except OSError as exc:
            self.lost += len(rows)
            from nnwatch.store.paths import describe_os_error

            self._fail(
                f"cannot append to the run log in {self.run_dir}: "
                f"{describe_os_error(exc, self.run_dir)}"
            )

    def _fail(self, message: str) -> None:
        if self.error is None:
            self.error = message
            log.error("nnwatch: %s; training goes on, but this run's history stops here", message)
            line = json.dumps({"time": time.time(), "type": "log_failed", "error": message}) + "\n"
            try:  # an event line is small; on a disk that just filled it may still fit
                os.write(self._fd_e, line.encode())
            except OSError:
                pass
            for cb in self.on_error:
                try:
                    cb(message)
                except Exception:  # noqa: BLE001 - a callback must not kill the writer
                    pass


def _write_all(fd: int, data: bytes) -> None:
    """``os.write`` until all of ``data`` is out: a disk that fills up mid-write first returns a
    short count, and only the next call raises the error that must be reported."""
    view = memoryview(data)
    while view:
        n = os.write(fd, view)
        if n <= 0:
            raise OSError(28, "no space left on device (write returned 0)")
        view = view[n:]


def _reserve_end(run_dir: Path) -> int:
    """Create ``.end.json.reserve`` with its space allocated now, while the disk has room, so
    that ``end.json`` can be written at the end whatever happened to the disk meanwhile. Returns
    its file descriptor, or -1 when it could not be made (``end.json`` is then written plainly)."""
    from nnwatch.store.paths import create_exclusive

    path = run_dir / END_RESERVE_FILE
    try:
        fd = create_exclusive(path)
    except OSError:
        return -1
    try:
        if hasattr(os, "posix_fallocate"):
            os.posix_fallocate(fd, 0, END_RESERVE)
        os.pwrite(fd, b" " * END_RESERVE, 0)  # tmpfs allocates on write; make it hold pages
        return fd
    except OSError:
        os.close(fd)
        try:
            os.unlink(path)
        except OSError:
            pass
        return -1


def _write_end(run_dir: Path, end: dict[str, Any], reserve_fd: int) -> None:
    """Write ``end.json``: into the reserved file, cut to size and renamed into place (no new
    space needed), else as a plain atomic write. A failure is logged, never raised."""
    from nnwatch.store.paths import describe_os_error, write_private_file

    data = json.dumps(end, default=_json_default).encode()
    if len(data) > END_RESERVE:
        short = {k: (v[:200] if isinstance(v, str) else v) for k, v in end.items()}
        data = json.dumps(short, default=_json_default).encode()
    if len(data) > END_RESERVE:
        keep = ("status", "steps", "ended", "lost_records", "reason")
        data = json.dumps({k: end[k] for k in keep if k in end}, default=_json_default).encode()
    reserve = run_dir / END_RESERVE_FILE
    if reserve_fd >= 0:
        try:
            os.pwrite(reserve_fd, data, 0)
            os.ftruncate(reserve_fd, len(data))
            os.close(reserve_fd)
            reserve_fd = -1
            os.replace(reserve, run_dir / END_FILE)
            return
        except OSError as exc:
            log.debug("nnwatch: the reserved end.json could not be used: %s", exc)
            if reserve_fd >= 0:
                os.close(reserve_fd)
    try:
        write_private_file(run_dir / END_FILE, data)
    except OSError as exc:
        log.warning(
            "nnwatch: could not write %s: %s", run_dir / END_FILE, describe_os_error(exc, run_dir)
        )
    finally:
        try:
            os.unlink(reserve)
        except OSError:
            pass


def _json_default(obj: Any) -> Any:
    if isinstance(obj, np.generic):
        return obj.item()
    if isinstance(obj, np.ndarray):
        return obj.tolist()
    if isinstance(obj, Path):
        return str(obj)
    return str(obj)


# ------------------------------------------------------------------------------------------------
# Reading


@dataclass
class Run:
    """A run's whole history. ``run["loss"]`` is the loss of every step as a numpy array."""

    run_dir: Path
    meta: RunMeta
    scalars: np.ndarray
    layers: np.ndarray
    events: list[dict[str, Any]] = field(default_factory=list)
    status: str = "finished"
    end: dict[str, Any] = field(default_factory=dict)
    warnings: list[str] = field(default_factory=list)

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
            for e in self.events if e.get("type") == "finding"
        ]
        return RunSummary(
            name=self.meta.name, status=self.status, steps=len(self),
            loss=last_finite(self.scalars["loss"]) if len(self) else None,
            grad_norm=last_finite(self.scalars["grad_norm"]) if len(self) else None,
            run_dir=str(self.run_dir), findings=findings,
        )

    def __repr__(self) -> str:
        return self.summary().text()

    def _repr_html_(self) -> str:
        return self.summary().html()

    def plot(self, metrics: tuple[str, ...] = ("loss", "grad_norm"), ax: Any = None) -> Any:
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
            if name.startswith("grad_norm"):
                a.set_yscale("log")
        axes[-1].set_xlabel("step")
        fig.suptitle(f"{self.meta.name} ({self.status})")
        return fig

    @property
    def steps(self) -> np.ndarray:
        return self.scalars["step"]

    @property
    def layer_names(self) -> tuple[str, ...]:
        return self.meta.schema.layer_names

    def layer_stat(self, stat: str, layer: str) -> tuple[np.ndarray, np.ndarray]:
        """(steps, values) of one per-layer stat (``act_zero``, ``grad_layer``, ...) for one layer."""
        names = self.meta.schema.param_layer_names if stat == GRAD_LAYER_FIELD else self.layer_names
        if layer not in names:
            raise KeyError(f"no layer {layer!r}; layers are: {', '.join(names)}")
        i = names.index(layer)
        return self.layers["step"], self.layers[stat][:, i]

    @property
    def findings(self) -> list[dict[str, Any]]:
        return [e for e in self.events if e.get("type", "finding") == "finding" and "kind" in e]


def _map_rows(path: Path, dtype: np.dtype, kind: int, warnings: list[str]) -> np.ndarray:
    """The rows of one log file, memory-mapped; rows whose checksum fails are left out (one
    warning names their steps), and a partial last row (a killed writer) is ignored."""
    from nnwatch.store.paths import open_regular

    try:
        fd = open_regular(path)
    except FileNotFoundError:
        warnings.append(f"{path.name} is missing")
        return np.zeros(0, dtype=dtype)
    except OSError as exc:
        raise RunLogError(f"{path} cannot be read: {exc.strerror or exc}") from exc
    with os.fdopen(fd, "rb") as fh:
        size = os.fstat(fh.fileno()).st_size
        if size < HEADER_SIZE:
            if size:
                warnings.append(f"{path.name} is shorter than its header ({size} bytes)")
            return np.zeros(0, dtype=dtype)
        magic, row_size, file_kind = _HEADER.unpack(fh.read(_HEADER.size))
        if magic not in (MAGIC, MAGIC_V1):
            raise RunLogError(f"{path} is not an nnwatch log (bad magic {magic!r}); it may be corrupt")
        if row_size != dtype.itemsize or file_kind != kind:
            raise RunLogError(
                f"{path} holds rows of {row_size} bytes but meta.json describes {dtype.itemsize}; "
                "the run directory mixes files from different runs"
            )
        n, extra = divmod(size - HEADER_SIZE, row_size)
        if extra:
            warnings.append(f"{path.name}: ignored a partial last row ({extra} bytes; the run was killed)")
        if n == 0:
            return np.zeros(0, dtype=dtype)
        rows: np.ndarray = np.memmap(fh, dtype=dtype, mode="r", offset=HEADER_SIZE, shape=(n,))
    if magic == MAGIC:
        bad = _failed_checksums(path, rows, warnings)
        if bad is not None:
            steps = np.asarray(rows["step"][bad], dtype=np.float64)
            span = f"steps {steps.min():.0f}-{steps.max():.0f}" if np.isfinite(steps).all() else "rows"
            warnings.append(
                f"{path.name}: {int(bad.sum())} row(s) ({span}) failed their checksum (the file "
                "was damaged on disk) and were left out"
            )
            rows = np.asarray(rows[~bad])
    return rows


def _failed_checksums(path: Path, rows: np.ndarray, warnings: list[str]) -> np.ndarray | None:
    """A mask of the rows whose block checksum fails, or None when every checked block is good."""
    from nnwatch.store.paths import read_small_file

    try:
        table = read_small_file(crc_path(path), limit=1 << 31)
    except FileNotFoundError:
        warnings.append(f"{path.name}: its checksums ({crc_path(path).name}) are missing; rows not verified")
        return None
    except OSError as exc:
        warnings.append(f"{crc_path(path).name} cannot be read ({exc.strerror or exc}); rows not verified")
        return None
    raw = rows.view(np.uint8).reshape(-1) if rows.flags.c_contiguous else np.ascontiguousarray(rows).view(np.uint8)
    row_size = rows.dtype.itemsize
    n = len(rows)
    bad: np.ndarray | None = None
    expected = 0
    for first, count, crc in _BLOCK.iter_unpack(table[: len(table) - len(table) % _BLOCK.size]):
        if first != expected or count == 0 or first + count > n:
            if first + count > n and first == expected:
                break  # the rows of the last block were cut short (a killed writer)
            warnings.append(f"{crc_path(path).name} is inconsistent with {path.name}; later rows not verified")
            break
        chunk = raw[first * row_size : (first + count) * row_size]
        if zlib.crc32(chunk.data) != crc:  # the mapped bytes, not a copy
            if bad is None:
                bad = np.zeros(n, dtype=bool)
            bad[first : first + count] = True
        expected = first + count
    return bad


def iter_events(path: Path, warnings: list[str] | None = None) -> Iterator[dict[str, Any]]:
    """Events from ``events.jsonl``, skipping (and counting) lines that are not valid JSON objects."""
    if not path.exists():
        return
    bad = 0
    with open(path, "rb") as fh:
        for raw in fh:
            try:
                ev = json.loads(raw)
            except ValueError:
                bad += 1
                continue
            if isinstance(ev, dict):
                yield ev
            else:
                bad += 1
    if bad and warnings is not None:
        warnings.append(f"{path.name}: skipped {bad} unreadable line(s)")


def _pid_alive(pid: int, started: float) -> bool:
    try:
        import psutil

        proc = psutil.Process(pid)
        # the run started after its process did; a younger process reuses the pid
        return proc.create_time() <= started + 1.0
    except Exception:  # noqa: BLE001 - psutil raises several kinds for "gone"
        return False


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
    from nnwatch.store.paths import read_small_file

    try:
        meta = RunMeta.from_json(read_small_file(meta_path))
    except OSError as exc:
        raise RunLogError(f"{meta_path} cannot be read: {exc.strerror or exc}") from exc
    except (ValueError, KeyError, TypeError) as exc:
        raise RunLogError(f"{meta_path} is corrupt ({exc}); the run cannot be decoded") from exc
    warnings: list[str] = []
    schema = meta.schema
    scalars = _map_rows(run_dir / SCALARS_FILE, schema.scalar_dtype(), KIND_SCALARS, warnings)
    layers = _map_rows(run_dir / LAYERS_FILE, schema.layer_row_dtype(), KIND_LAYERS, warnings)
    events = list(iter_events(run_dir / EVENTS_FILE, warnings))
    end: dict[str, Any] = {}
    end_path = run_dir / END_FILE
    if os.path.lexists(end_path):
        from nnwatch.store.health import clean_end

        try:
            cleaned = clean_end(json.loads(read_small_file(end_path, limit=1 << 20)))
        except (OSError, ValueError, RecursionError):
            cleaned = None
        if cleaned is None:
            warnings.append(f"{END_FILE} is corrupt; the run is taken as ended")
        end = cleaned or {}
        status = str(end.get("status", "finished"))
    elif _pid_alive(meta.pid, meta.started):
        status = "running"
    else:  # no end.json: a full disk at the end may have stopped it; the ring may still tell
        status = _ring_status(run_dir, meta) or "crashed"
    if status != "running":
        scalars, layers = _merge_ring_tail(run_dir, meta, scalars, layers, warnings)
    return Run(run_dir, meta, scalars, layers, events, status, end, warnings)


def _ring_status(run_dir: Path, meta: RunMeta) -> str | None:
    """"finished" or "crashed" as the ring header says, when the run ended without ``end.json``."""
    try:
        from nnwatch.store.ring import RingError, RingReader, ring_path
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
        from nnwatch.store.ring import RingError, RingReader, ring_path
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
    finite = np.isfinite(records["step"])
    if not finite.all():
        warnings.append(f"skipped {int((~finite).sum())} ring record(s) without a step number")
        records = records[finite]
    last = float(scalars["step"][-1]) if len(scalars) and np.isfinite(scalars["step"][-1]) else -1.0
    tail = records[records["step"] > last]
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
    from nnwatch.store.paths import describe_os_error
    from nnwatch.store.ring import ring_path

    path = ring_path(run_dir, run.meta.rank)
    if not os.path.lexists(path):
        return 0, "no ring file"
    on_disk = len(_map_rows(run_dir / SCALARS_FILE, run.meta.schema.scalar_dtype(), KIND_SCALARS, []))
    extra = run.scalars[on_disk:] if len(run.scalars) > on_disk else run.scalars[:0]
    extra_l = np.zeros(0, run.layers.dtype)
    if len(extra):
        first = extra["step"][0]
        extra_l = run.layers[np.asarray(run.layers["step"]) >= first]
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
