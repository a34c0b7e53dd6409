"""The durable run log: every step record, appended off the training thread, loadable as arrays.

Layout in the run directory:

- ``meta.json``   the run's :class:`~nnwatch.store.schema.RunMeta` (names, sizes, versions)
- ``scalars.bin`` a 64-byte header, then one fixed-size row per step (``schema.scalar_dtype()``)
- ``layers.bin``  the same header, then one row per step whose per-layer stats were sampled or that
                  held a non-finite value (``schema.layer_row_dtype()``)
- ``scalars.crc``, ``layers.crc`` one 16-byte checksum entry per block of rows the writer
                  appended (u64 first row, u32 rows, u32 CRC32 of their bytes); format 2 only
- ``events.jsonl`` findings, snapshots and commands, one JSON object per line (the types are in
                  :mod:`nnwatch.store.events`), appended by the writer's
                  :class:`~nnwatch.store.event_appender.EventAppender`
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

import contextlib
import json
import logging
import math
import os
import struct
import threading
import time
import zlib
from collections import deque
from pathlib import Path
from typing import Any

import numpy as np

from nnwatch.store.disk_errors import describe_os_error
from nnwatch.store.event_appender import EventAppender, json_default
from nnwatch.store.events import LogFailed
from nnwatch.store.paths import (
    check_own_dir,
    create_exclusive,
    open_for_append,
    rename_file,
    unlink_file,
    write_private_file,
)
from nnwatch.store.record_split import split_records
from nnwatch.store.safe_read import held_size, open_regular
from nnwatch.store.schema import RunMeta

#: Weight of one drain in the writer's recent CPU per record.
_RECENT = 0.3

log = logging.getLogger("nnwatch")

MAGIC_V1 = b"NNWLOG1\0"
MAGIC = b"NNWLOG2\0"  # format 2: rows plus a checksum file beside them
HEADER_SIZE = 64
FILE_HEADER = struct.Struct("<8sII")  # magic, row size, kind (0 scalars, 1 layers)
CRC_ENTRY = struct.Struct("<QII")  # checksum entry: first row, rows, CRC32
KIND_SCALARS, KIND_LAYERS = 0, 1
SCALARS_FILE, LAYERS_FILE, META_FILE = "scalars.bin", "layers.bin", "meta.json"
END_FILE = "end.json"
END_RESERVE_FILE = ".end.json.reserve"
#: Bytes kept for ``end.json`` from the start of the run (an exception's message is cut to fit).
END_RESERVE = 16 * 1024


class RunLogError(RuntimeError):
    """A run directory cannot be read; the message names the file and what to do."""


def _header(row_size: int, kind: int) -> bytes:
    return FILE_HEADER.pack(MAGIC, row_size, kind).ljust(HEADER_SIZE, b"\0")


def map_log_rows(path: Path, dtype: np.dtype) -> np.ndarray:
    """The rows of one run-log file (``scalars.bin``, ``layers.bin``), memory-mapped as they are,
    without reading them or their checksums (a 10M-step log opens in milliseconds): empty when
    the file is missing or does not start with a run-log header. ``load_run`` is the checked read.
    """
    try:  # never a link or a FIFO; a hole at the end holds no rows
        fh = os.fdopen(open_regular(path), "rb")
    except OSError:
        return np.zeros(0, dtype)
    with fh:
        n = max(0, held_size(fh.fileno()) - HEADER_SIZE) // dtype.itemsize
        if n == 0 or fh.read(len(MAGIC))[:6] != MAGIC[:6]:  # "NNWLOG", whichever version
            return np.zeros(0, dtype)
        return np.memmap(fh, dtype=dtype, mode="r", offset=HEADER_SIZE, shape=(n,))


def crc_path(path: Path) -> Path:
    """The checksum file beside a row file: ``scalars.bin`` -> ``scalars.crc``."""
    return path.with_suffix(".crc")


class RowAppender:
    """Appends fixed-size rows to one log file, and a checksum entry per block to the file beside
    it. Every file is opened without following symlinks and must be a regular file of ours."""

    def __init__(self, path: Path, row_size: int, kind: int) -> None:
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
                head = read_head(path)
                checked = head == MAGIC
                if head not in (MAGIC, MAGIC_V1):
                    raise RunLogError(f"{path} is not an nnwatch log; not appending to it")
            self.rows, partial = divmod(max(0, size - HEADER_SIZE), row_size)
            if partial:  # a killed writer's cut row: new rows must start on a row boundary
                os.ftruncate(self.fd, HEADER_SIZE + self.rows * row_size)
            if checked:
                self.crc_fd = open_for_append(crc_path(path))
                cut = os.fstat(self.crc_fd).st_size % CRC_ENTRY.size
                if cut:
                    os.ftruncate(self.crc_fd, os.fstat(self.crc_fd).st_size - cut)
        except BaseException:
            with contextlib.suppress(Exception):  # never in place of what is propagating
                self.close()
            raise

    def append(self, data: bytes) -> None:
        """Append whole rows and their checksum entry. On a write error (a full disk) the
        exception carries, as ``rows_landed``, how many of these rows are whole in the file: a
        disk can fill in the middle of a block, or between the rows and their checksum, and the
        run's ``lost_records`` must count only the rows that are really missing."""
        n = len(data) // self.row_size
        if not n:
            return
        first = self.rows
        try:
            _write_all(self.fd, data)
        except OSError as exc:
            try:
                size = os.fstat(self.fd).st_size
                whole = max(0, (size - HEADER_SIZE) // self.row_size - first)
            except OSError:
                whole = 0
            self.rows = first + min(n, whole)
            exc.rows_landed = min(n, whole)  # type: ignore[attr-defined]
            raise
        self.rows = first + n
        if self.crc_fd >= 0:
            try:
                _write_all(self.crc_fd, CRC_ENTRY.pack(first, n, zlib.crc32(data)))
            except OSError as exc:
                exc.rows_landed = n  # type: ignore[attr-defined]  # the rows are in, unchecked
                raise

    def close(self) -> None:
        for fd in (self.fd, self.crc_fd):
            if fd >= 0:
                try:
                    os.close(fd)
                except OSError:
                    pass
        self.fd = self.crc_fd = -1


def read_head(path: Path) -> bytes:
    fd = open_regular(path)
    try:
        return os.pread(fd, 8, 0)
    finally:
        os.close(fd)


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
        #: the writer's CPU seconds (log, overview, detectors while in this thread) and the
        #: records they took: it shares the trainer's GIL and cores, so the probe's cost budget
        #: counts it as part of every step (see ``cpu_per_record``)
        self.cpu_seconds = 0.0
        self.cpu_records = 0
        #: the same per record, as a running average over the recent drains: what a record
        #: costs now (the detectors may have moved to their own process since the first ones)
        self.recent_cpu_per_record = math.nan
        self.error: str | None = None
        self.on_error: list[Any] = []
        #: Called in the writer thread with each batch of new records (a structured array);
        #: the detectors live here, off the training thread.
        self.observers: list[Any] = []
        check_own_dir(self.run_dir)
        write_private_file(self.run_dir / META_FILE, meta.to_json().encode())
        self._scalars = RowAppender(self.run_dir / SCALARS_FILE, self._scalar_size, KIND_SCALARS)
        self._layers = RowAppender(
            self.run_dir / LAYERS_FILE, self._layer_row_dtype.itemsize, KIND_LAYERS
        )
        self._fd_s, self._fd_l = self._scalars.fd, self._layers.fd
        #: ``events.jsonl``: findings, commands and the run's end are appended there, from any
        #: thread; a failed append is this log's failure too
        self.events = EventAppender(self.run_dir, self._fail)
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
        self._scalars.close()
        self._layers.close()
        self.events.close()
        self._fd_s = self._fd_l = -1
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

    def cpu_per_record(self) -> float:
        """The writer's CPU seconds per record so far (0.0 before its first drain)."""
        return self.cpu_seconds / self.cpu_records if self.cpu_records else 0.0

    def recent_cpu(self) -> float:
        """The writer's CPU seconds per record over the recent drains (0.0 before the first)."""
        value = self.recent_cpu_per_record
        return value if value == value else 0.0

    def _drain(self) -> None:
        started = time.thread_time()
        before = self.cpu_records
        try:
            self._drain_pending()
        finally:
            spent = time.thread_time() - started
            self.cpu_seconds += spent
            took = self.cpu_records - before
            if took:
                per, avg = spent / took, self.recent_cpu_per_record
                self.recent_cpu_per_record = per if avg != avg else avg + _RECENT * (per - avg)

    def _drain_pending(self) -> None:
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
        self.cpu_records += len(rows)
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
        landed = 0
        try:
            self._scalars.append(scalars.tobytes())
            landed = len(rows)
            if len(layer_rows):
                self._layers.append(layer_rows.tobytes())
            self.written += len(rows)
        except OSError as exc:
            # a record is lost when its step row is not in scalars.bin; rows that landed before
            # the disk filled (or whose layer row or checksum did not fit) are in the log
            if not landed:
                landed = int(getattr(exc, "rows_landed", 0))
            self.written += landed
            self.lost += len(rows) - landed
            self._fail(
                f"cannot append to the run log in {self.run_dir}: "
                f"{describe_os_error(exc, self.run_dir)}"
            )

    def _fail(self, message: str) -> None:
        if self.error is None:
            self.error = message
            log.error("nnwatch: %s; training goes on, but this run's history stops here", message)
            # an event line is small: on a disk that just filled it may still fit (if not, the
            # appender reports it here again, and the first failure stands)
            self.events.event(LogFailed(error=message))
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
            unlink_file(path)
        except OSError:
            pass
        return -1


def _write_end(run_dir: Path, end: dict[str, Any], reserve_fd: int) -> None:
    """Write ``end.json``: into the reserved file, cut to size and renamed into place (no new
    space needed), else as a plain atomic write. A failure is logged, never raised."""
    data = json.dumps(end, default=json_default).encode()
    if len(data) > END_RESERVE:
        short = {k: (v[:200] if isinstance(v, str) else v) for k, v in end.items()}
        data = json.dumps(short, default=json_default).encode()
    if len(data) > END_RESERVE:
        keep = ("status", "steps", "ended", "lost_records", "reason")
        data = json.dumps({k: end[k] for k in keep if k in end}, default=json_default).encode()
    reserve = run_dir / END_RESERVE_FILE
    if reserve_fd >= 0:
        try:
            os.pwrite(reserve_fd, data, 0)
            os.ftruncate(reserve_fd, len(data))
            os.close(reserve_fd)
            reserve_fd = -1
            rename_file(reserve, run_dir / END_FILE)  # through the pinned run directory
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
            unlink_file(reserve)
        except OSError:
            pass
