"""The ring file: one memory-mapped file per rank, written only by the training thread, read by
any number of monitors that come and go.

Why a ring in a plain file: the trainer must never wait for a reader. Publishing is a memcpy into
shared memory plus a few header stores, so a reader that is slow, frozen (SIGSTOP) or killed costs
the trainer nothing; the reader only loses the oldest slots, and it counts them. Plain ``mmap`` on
a file the run owns, not ``multiprocessing.shared_memory``: before Python 3.13 a reader's resource
tracker may delete the producer's segment when the reader exits (CPython gh-82300).

Why sequence numbers *and* a checksum: Python has no memory fences and aarch64 hosts reorder
stores, so a reader can see a slot's "done" sequence number before the payload bytes. Each slot is
written as: sequence ``2n+1`` (odd: writing), payload, then CRC32 (seeded with ``n``) plus sequence
``2n+2`` (even: done), and only then the header's write position. A reader copies a slot, checks
that the sequence was ``2n+2`` before and after the copy, and that the CRC matches; anything else
is a *torn* slot, counted and never returned as data.

File layout (little-endian; the writer stores words natively, so it refuses big-endian hosts)::

    0     header (fixed fields, see _HDR_* below)
    256   meta JSON (the run's RunMeta), so a reader can decode records with nothing else
    S     slots, S = header + meta rounded up to 4096; each slot is
              u64 seq | u32 crc | u32 length | payload (record_size bytes) | padding to 64
"""

from __future__ import annotations

import errno
import logging
import math
import mmap
import os
import stat
import struct
import sys
import threading
import time
import zlib
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import numpy as np

from nnwatch.store.identity import own_start_time
from nnwatch.store.paths import describe_os_error, is_tmpfs
from nnwatch.store.schema import RunMeta

log = logging.getLogger("nnwatch")

MAGIC = b"NNWRING\x01"
VERSION = 1
META_OFFSET = 256
SLOT_HEADER = 16
SLOT_ALIGN = 64
DEFAULT_RING_BYTES = 16 * 1024 * 1024
MIN_SLOTS = 256

#: The run states the header can hold. "hung" is never written: readers infer it (see health.py).
STATUS_CODES: dict[str, int] = {
    "starting": 0, "running": 1, "paused": 2, "finished": 3, "crashed": 4, "stopped": 5,
}  # fmt: skip
#: Statuses after which the writer publishes nothing more ("stopped": interrupted, ended cleanly).
ENDED = ("finished", "crashed", "stopped")
STATUS_NAMES: dict[int, str] = {v: k for k, v in STATUS_CODES.items()}

# Constant part of the header, written once before the magic: version, slots offset, slot size,
# record size, slots, meta length, pid, process start time, creation time.
_CONST = struct.Struct("<IIIIII qdd")
_CONST_OFF = 8
# Mutable part, one aligned 8-byte word per field. The writer stores each with a single
# memoryview item assignment: ``struct.pack_into`` would first zero the whole range, and a reader
# could catch the zeros (a write position of 0, a heartbeat from 1970).
_W_WRITE_SEQ, _W_HEARTBEAT, _W_LAST_PUBLISH, _W_INTERVAL = 8, 9, 10, 11  # u64, f64, f64, f64
_W_STATUS, _W_STATUS_TIME, _W_ERRORS = 12, 13, 14  # u64, f64, u64
_W_LOG_ERROR = 15  # u64: why the run log stopped (LOG_ERRORS), 0 while it works
_PUBLISH = struct.Struct("<Qddd")  # reader side: write_seq, heartbeat, last publish, interval
_PUBLISH_OFF = 8 * _W_WRITE_SEQ
_HEARTBEAT = struct.Struct("<d")
_HEARTBEAT_OFF = 8 * _W_HEARTBEAT
_STATUS = struct.Struct("<Qd")  # status code, time of the change
_STATUS_OFF = 8 * _W_STATUS
_ERRORS = struct.Struct("<Q")
_ERRORS_OFF = 8 * _W_ERRORS
_LOG_ERROR_OFF = 8 * _W_LOG_ERROR
_U64 = struct.Struct("<Q")
#: A write position beyond this is a corrupt header, not a run (2**48 steps at 1 MHz: 9 years).
MAX_SEQ = 1 << 48
#: Why the run log (or a snapshot) could not be written, as the header stores it for monitors.
LOG_ERRORS: dict[int, str] = {
    1: "the disk is full", 2: "permission denied", 3: "a write error", 4: "the file system is read-only",
}  # fmt: skip
_SLOT_LENGTH = struct.Struct("<I")

#: Weight of the newest interval in the step-interval average: readers use it for "hung" and steps/s.
_EMA = 0.1



def ring_path(run_dir: Path, rank: int = 0) -> Path:
    """The ring file inside a run directory (``ring``, or ``ring-r<rank>`` for ranks above 0)."""
    return Path(run_dir) / ("ring" if int(rank) == 0 else f"ring-r{int(rank)}")

class RingError(RuntimeError):
    """A ring file cannot be used; the message says what is wrong in plain words."""


def _unlink_quietly(path: Path) -> None:
    try:
        os.unlink(path)
    except OSError:
        pass


def log_error_code(message: str) -> int:
    """The header code for a failure message from :func:`nnwatch.store.paths.describe_os_error`."""
    text = message.lower()
    if "disk is full" in text or "no space" in text or "quota" in text:
        return 1
    if "permission" in text:
        return 2
    if "read-only" in text:
        return 4
    return 3


def _slot_size(record_size: int) -> int:
    return -(-(SLOT_HEADER + record_size) // SLOT_ALIGN) * SLOT_ALIGN


def default_slots(record_size: int) -> int:
    """Enough slots for about 16 MiB of records, and never fewer than 256."""
    return max(MIN_SLOTS, DEFAULT_RING_BYTES // _slot_size(record_size))


class RingWriter:
    """The training thread's end of the ring. ``publish`` never blocks and never raises.

    ``record`` passed to ``publish`` should be a C-contiguous memoryview of exactly ``record_size``
    bytes (format ``B``); other buffers are accepted through a slower path. Errors are counted in
    ``errors`` (also stored in the header) and logged once, so training always goes on.
    """

    def __init__(
        self,
        path: Path,
        record_size: int,
        slots: int | None = None,
        *,
        meta_json: str = "",
    ) -> None:
        if record_size <= 0:
            raise ValueError("record_size must be positive")
        if sys.byteorder != "little":
            raise RingError("the ring file is little-endian; this host is big-endian")
        self.path = Path(path)
        self.record_size = int(record_size)
        self.slots = int(slots) if slots else default_slots(self.record_size)
        if self.slots < 2:
            raise ValueError("a ring needs at least 2 slots")
        self.slot_size = _slot_size(self.record_size)
        meta = meta_json.encode()
        self.slots_offset = -(-(META_OFFSET + len(meta)) // 4096) * 4096
        size = self.slots_offset + self.slots * self.slot_size
        self.errors = 0
        self._reported = False
        self._closed = False
        self._n = 0
        self._last_t = 0.0
        self._interval = 0.0
        self._beat_thread: threading.Thread | None = None
        self._beat_stop = threading.Event()

        fd = os.open(
            self.path, os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW | os.O_NONBLOCK, 0o600
        )
        try:
            st = os.fstat(fd)
            if not stat.S_ISREG(st.st_mode) or st.st_uid != os.getuid():
                raise RingError(f"{self.path} is not a regular file of yours; not writing a ring there")
            os.fchmod(fd, 0o600)
            os.ftruncate(fd, size)
            # Reserve the space now: on a full tmpfs (Docker's 64 MiB /dev/shm) touching a page of
            # a sparse file kills the process with SIGBUS; posix_fallocate fails with ENOSPC
            # instead, which the probe reports while training goes on. The half-made file is
            # removed: its zero pages are holes that would kill any *reader* with SIGBUS too.
            if hasattr(os, "posix_fallocate"):
                os.posix_fallocate(fd, 0, size)
            self._mm = mmap.mmap(fd, size, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
        except OSError as exc:
            os.close(fd)
            _unlink_quietly(self.path)
            raise RingError(
                f"cannot create the ring {self.path} ({size // 1024} KiB): "
                f"{describe_os_error(exc, self.path.parent)}"
            ) from exc
        except BaseException:
            os.close(fd)
            _unlink_quietly(self.path)
            raise
        else:
            os.close(fd)
        # Touch every page now, so the first lap of publishes does not pay page faults.
        zeros = np.frombuffer(self._mm, dtype=np.uint8)
        zeros[:] = 0
        del zeros
        now = time.time()
        self.pid = os.getpid()
        self.start_time = own_start_time()
        _CONST.pack_into(
            self._mm, _CONST_OFF, VERSION, self.slots_offset, self.slot_size, self.record_size,
            self.slots, len(meta), self.pid, self.start_time, now,
        )  # fmt: skip
        self._mm[META_OFFSET : META_OFFSET + len(meta)] = meta
        self._mv = memoryview(self._mm)
        # Typed views: item assignment is one aligned store (little-endian hosts only, see top).
        self._hdr_q = self._mv[:META_OFFSET].cast("Q")
        self._hdr_d = self._mv[:META_OFFSET].cast("d")
        self._slot_q = self._mv[self.slots_offset :].cast("Q")
        self._slot_i = self._mv[self.slots_offset :].cast("I")
        self._hdr_d[_W_HEARTBEAT] = now
        self._hdr_q[_W_STATUS] = STATUS_CODES["running"]
        self._hdr_d[_W_STATUS_TIME] = now
        for o in range(self.slots_offset, size, self.slot_size):
            _SLOT_LENGTH.pack_into(self._mm, o + 12, self.record_size)  # constant per slot
        self._mm[0:8] = MAGIC  # last: a reader that sees the magic sees a complete header
        # One payload view per slot, made once, so publish() slices nothing.
        self._payloads = [
            self._mv[o + SLOT_HEADER : o + SLOT_HEADER + self.record_size]
            for o in range(self.slots_offset, size, self.slot_size)
        ]
        words = self.slot_size // 8
        self._seq_word = [i * words for i in range(self.slots)]  # index into _slot_q

    # -- training thread ---------------------------------------------------------------------------
    def publish(self, record: memoryview) -> None:
        """Write one record into the next slot. Training thread only; O(record size), no waiting."""
        try:
            n = self._n
            i = n % self.slots
            q = self._seq_word[i]
            seqs = self._slot_q
            seqs[q] = 2 * n + 1  # odd: being written
            try:
                self._payloads[i][:] = record
            except (ValueError, TypeError):
                record = memoryview(record).cast("B")
                self._payloads[i][:] = record
            self._slot_i[2 * q + 2] = zlib.crc32(record, n & 0xFFFFFFFF)
            seqs[q] = 2 * n + 2  # even: done, after the payload and its checksum
            t = time.time()
            if self._last_t:
                dt = t - self._last_t
                self._interval = (
                    dt if not self._interval else self._interval + _EMA * (dt - self._interval)
                )
            self._last_t = t
            self._n = n + 1
            hdr = self._hdr_d
            hdr[_W_HEARTBEAT] = t
            hdr[_W_LAST_PUBLISH] = t
            hdr[_W_INTERVAL] = self._interval
            self._hdr_q[_W_WRITE_SEQ] = n + 1  # last: the record is now visible to readers
        except Exception as exc:  # noqa: BLE001 - nothing may escape into the training loop
            self._error("publish", exc)

    # -- any thread ------------------------------------------------------------------------------
    def beat(self) -> None:
        """Refresh the heartbeat, so readers can tell a live trainer from a frozen or dead one."""
        try:
            self._hdr_d[_W_HEARTBEAT] = time.time()
        except Exception:  # noqa: BLE001 - closed ring, or a race with close(): nothing to do
            pass

    def set_status(self, status: str) -> None:
        """Record "running", "paused", "finished", "stopped" or "crashed" for readers."""
        code = STATUS_CODES.get(status)
        if code is None:
            raise ValueError(
                f"unknown ring status {status!r}; use one of {', '.join(STATUS_CODES)}"
            )
        try:
            self._hdr_d[_W_STATUS_TIME] = time.time()
            self._hdr_q[_W_STATUS] = code
            self.beat()
        except Exception as exc:  # noqa: BLE001
            self._error("set_status", exc)

    def start_heartbeat(self, interval: float = 1.0) -> None:
        """Beat from a daemon thread every ``interval`` seconds until ``close`` (optional helper)."""
        if self._beat_thread is not None:
            return

        def loop() -> None:
            while not self._beat_stop.wait(interval):
                self.beat()

        self._beat_thread = threading.Thread(target=loop, name="nnwatch-heartbeat", daemon=True)
        self._beat_thread.start()

    def set_log_error(self, message: str) -> None:
        """Tell monitors that the run log (or a snapshot) could not be written, and why: the
        cause is kept as a code in the header (see ``LOG_ERRORS``), read into ``RingState``."""
        code = log_error_code(message)
        try:
            self._hdr_q[_W_LOG_ERROR] = code
            self.beat()
        except Exception:  # noqa: BLE001 - closed ring: nobody is left to tell
            pass

    @property
    def closed(self) -> bool:
        return self._closed

    @property
    def published(self) -> int:
        """How many records were published so far."""
        return self._n

    def close(self, status: str = "finished", *, unlink: bool = False) -> None:
        """Write the final status and unmap. The file stays (readers may still be attached)."""
        if self._closed:
            return
        self._beat_stop.set()
        if self._beat_thread is not None:
            self._beat_thread.join(timeout=2)
        try:
            self.set_status(status)
        finally:
            self._closed = True
            for view in self._payloads:
                view.release()
            self._payloads = []
            for header_view in (self._hdr_q, self._hdr_d, self._slot_q, self._slot_i):
                header_view.release()
            self._mv.release()
            self._mm.close()
            if unlink:
                try:
                    os.unlink(self.path)
                except OSError:
                    pass

    def _error(self, where: str, exc: BaseException) -> None:
        self.errors += 1
        try:
            self._hdr_q[_W_ERRORS] = self.errors
        except Exception:  # noqa: BLE001
            pass
        if not self._reported and not self._closed:
            self._reported = True
            log.warning(
                "nnwatch: the ring %s failed in %s (%s: %s); training goes on, monitors may miss "
                "records. Further errors are counted silently.", self.path, where,
                type(exc).__name__, exc,
            )  # fmt: skip


@dataclass(frozen=True)
class RingState:
    """One reading of the ring header."""

    pid: int
    start_time: float  # the writer process's start time (psutil create_time)
    created: float
    status: str  # as written by the trainer: starting, running, paused, finished, crashed
    status_time: float
    write_seq: int  # records published so far
    heartbeat: float
    last_publish: float  # 0.0 until the first record
    step_interval: float  # moving average of the time between records, 0.0 until known
    errors: int
    slots: int
    record_size: int
    #: Why the run log stopped ("the disk is full", ...), "" while it works.
    log_error: str = ""

    def heartbeat_age(self, now: float | None = None) -> float:
        return max(0.0, (time.time() if now is None else now) - self.heartbeat)

    def last_step_age(self, now: float | None = None) -> float | None:
        if not self.last_publish:
            return None
        return max(0.0, (time.time() if now is None else now) - self.last_publish)


@dataclass(frozen=True)
class RingBatch:
    """What one ``read_batch`` found: good records, their sequence numbers, and what was lost."""

    records: np.ndarray  # structured, meta's record dtype (or raw void records without meta)
    seqs: np.ndarray  # int64 sequence number of each record (0-based publish index)
    dropped: int  # overwritten before this reader got to them (it fell behind)
    torn: int  # caught mid-write or failing the checksum; skipped


class RingReader:
    """Attach to a ring file and read the records published since the last read.

    ``start="oldest"`` first returns whatever the ring still holds (its part of the history), then
    every new record; ``"latest"`` skips to new records; an int starts at that sequence number.
    Attaching or detaching never affects the writer or other readers.
    """

    def __init__(self, path: Path, *, start: Literal["oldest", "latest"] | int = "oldest") -> None:
        self.path = Path(path)
        try:  # non-blocking: a FIFO planted where the ring should be must not hang a reader
            fd = os.open(self.path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
        except FileNotFoundError as exc:
            raise RingError(f"{self.path} does not exist: the run has no ring (yet)") from exc
        except OSError as exc:
            why = "it is a symlink" if exc.errno == errno.ELOOP else (exc.strerror or str(exc))
            raise RingError(f"cannot open the ring {self.path}: {why}") from exc
        try:
            st = os.fstat(fd)
            if not stat.S_ISREG(st.st_mode):
                raise RingError(f"{self.path} is not a regular file, so it is not a ring")
            size = st.st_size
            if size < META_OFFSET:
                raise RingError(f"{self.path} is too short to be a ring file ({size} bytes)")
            # Read the header with pread before mapping anything: a ring whose creation failed on
            # a full tmpfs is all holes, and touching a mapped hole there is a SIGBUS.
            head = os.pread(fd, META_OFFSET, 0)
            if head[0:8] != MAGIC:
                raise RingError(
                    f"{self.path} is not an nnwatch ring (or its writer has not finished creating "
                    "it, or could not: a full disk leaves an empty ring)"
                )
            if st.st_blocks * 512 < size and is_tmpfs(self.path):
                raise RingError(
                    f"{self.path} is sparse ({st.st_blocks * 512} of {size} bytes allocated) on a "
                    "tmpfs; reading it could crash this process (SIGBUS), so it is skipped"
                )
            self._mm = mmap.mmap(fd, size, mmap.MAP_SHARED, mmap.PROT_READ)
        finally:
            os.close(fd)
        try:
            self._attach(size, start)
        except Exception:
            self._mm.close()
            raise

    def _attach(self, size: int, start: Literal["oldest", "latest"] | int) -> None:
        if self._mm[0:8] != MAGIC:
            raise RingError(
                f"{self.path} is not an nnwatch ring (or its writer has not finished creating it)"
            )
        (version, slots_off, slot_size, record_size, slots, meta_len, pid, start_time, created) = (
            _CONST.unpack_from(self._mm, _CONST_OFF)
        )
        if version != VERSION:
            raise RingError(f"{self.path} has ring format {version}; this nnwatch reads {VERSION}")
        if (
            record_size <= 0 or slots < 2 or slot_size % SLOT_ALIGN
            or slot_size < SLOT_HEADER + record_size or slot_size > SLOT_HEADER + record_size + SLOT_ALIGN
            or slots_off < META_OFFSET + meta_len or slots_off % 4096
            or slots_off + slots * slot_size > size
            or not (math.isfinite(start_time) and math.isfinite(created))
            or not 0 < pid < 1 << 31
        ):  # fmt: skip
            raise RingError(f"{self.path} has an inconsistent header; the file may be truncated or corrupt")
        self.pid, self.start_time, self.created = int(pid), float(start_time), float(created)
        self.slots, self.slot_size, self.record_size = int(slots), int(slot_size), int(record_size)
        try:
            self.meta_json = bytes(self._mm[META_OFFSET : META_OFFSET + meta_len]).decode()
            self.meta: RunMeta | None = RunMeta.from_json(self.meta_json) if self.meta_json else None
        except (ValueError, KeyError, TypeError, AttributeError) as exc:
            raise RingError(f"{self.path} holds a corrupt run description ({exc})") from exc
        if self.meta is not None:
            self.dtype = self.meta.schema.record_dtype()
            if self.dtype.itemsize != record_size:
                raise RingError(
                    f"{self.path}: meta describes {self.dtype.itemsize}-byte records but the ring "
                    f"holds {record_size}-byte ones"
                )
        else:
            self.dtype = np.dtype((np.void, record_size))
        slot_dtype = np.dtype(
            {
                "names": ["seq", "crc", "len", "payload"],
                "formats": ["<u8", "<u4", "<u4", (np.uint8, (record_size,))],
                "offsets": [0, 8, 12, SLOT_HEADER],
                "itemsize": slot_size,
            }
        )
        self._slots = np.ndarray((slots,), dtype=slot_dtype, buffer=self._mm, offset=slots_off)
        self._seq_view = self._slots["seq"]
        ws = self.state().write_seq
        if start == "oldest":
            self._next = max(0, ws - slots)
        elif start == "latest":
            self._next = ws
        else:
            self._next = max(0, min(int(start), ws))
        # The oldest slot may be mid-overwrite as we attach; losing it then is not "falling behind".
        self._quiet_below = self._next + 1 if start == "oldest" and ws >= slots else self._next
        self.dropped = 0
        self.torn = 0
        self.delivered = 0

    # -- header ----------------------------------------------------------------------------------
    def state(self) -> RingState:
        """Read the header now (cheap: a few unpacks from shared memory)."""
        ws, _hb, last, interval = _PUBLISH.unpack_from(self._mm, _PUBLISH_OFF)
        (hb,) = _HEARTBEAT.unpack_from(self._mm, _HEARTBEAT_OFF)
        code, status_time = _STATUS.unpack_from(self._mm, _STATUS_OFF)
        (errors,) = _ERRORS.unpack_from(self._mm, _ERRORS_OFF)
        (log_code,) = _U64.unpack_from(self._mm, _LOG_ERROR_OFF)
        if (
            ws > MAX_SEQ or code not in STATUS_NAMES
            or not all(math.isfinite(x) and x >= 0 for x in (hb, last, interval, status_time))
        ):  # fmt: skip
            raise RingError(
                f"{self.path} has a corrupt header (write position {ws}, status code {code}); "
                "its records are not trusted"
            )
        return RingState(
            pid=self.pid, start_time=self.start_time, created=self.created,
            status=STATUS_NAMES[code], status_time=status_time, write_seq=int(ws),
            heartbeat=hb, last_publish=last, step_interval=interval, errors=int(errors),
            slots=self.slots, record_size=self.record_size,
            log_error=LOG_ERRORS.get(int(log_code), "a write error") if log_code else "",
        )  # fmt: skip

    @property
    def heartbeat_age(self) -> float:
        """Seconds since the writer's last heartbeat."""
        return self.state().heartbeat_age()

    @property
    def last_step_age(self) -> float | None:
        """Seconds since the last record was published (None before the first)."""
        return self.state().last_step_age()


    @property
    def next_seq(self) -> int:
        """Sequence number of the next record this reader will return."""
        return self._next

    @property
    def pending(self) -> int:
        """Records published but not yet read by this reader."""
        return max(0, self.state().write_seq - self._next)

    # -- records ---------------------------------------------------------------------------------
    def read(self, max_records: int | None = None) -> np.ndarray:
        """New records as a structured array (``meta.schema.record_dtype()``); may be empty."""
        return self.read_batch(max_records).records

    def read_batch(self, max_records: int | None = None) -> RingBatch:
        """New records plus what was dropped or torn since the previous read."""
        (ws,) = _U64.unpack_from(self._mm, _PUBLISH_OFF)
        if ws > MAX_SEQ:  # a corrupt write position: nothing in the ring can be located
            return RingBatch(np.zeros(0, self.dtype), np.zeros(0, np.int64), 0, 0)
        dropped = torn = 0
        nxt = self._next
        if ws < nxt:  # cannot happen with one writer; resynchronise rather than return garbage
            nxt = ws
        if ws - nxt > self.slots:
            skip_to = ws - self.slots
            dropped += skip_to - max(nxt, self._quiet_below)
            nxt = skip_to
        k = ws - nxt
        if max_records is not None:
            k = min(k, max(0, int(max_records)))
        if k <= 0:
            self._next = nxt
            self.dropped += max(0, dropped)
            return RingBatch(np.zeros(0, self.dtype), np.zeros(0, np.int64), max(0, dropped), 0)
        ns = np.arange(nxt, nxt + k, dtype=np.int64)
        idx = ns % self.slots
        copy = self._slots[idx]  # fancy indexing: one copy of every slot we want
        seq_after = self._seq_view[idx]
        seq_before = copy["seq"].astype(np.int64)
        expected = 2 * ns + 2
        intact = (seq_before == expected) & (seq_after.astype(np.int64) == expected)
        overwritten = seq_before > expected
        quiet = ns < self._quiet_below
        dropped += int(np.count_nonzero(overwritten & ~quiet))
        torn_mask = ~intact & ~overwritten
        payload = copy["payload"]
        for j in np.flatnonzero(intact):
            if zlib.crc32(payload[j], int(ns[j]) & 0xFFFFFFFF) != int(copy["crc"][j]):
                intact[j] = False
                torn_mask[j] = True
        torn = int(np.count_nonzero(torn_mask & ~quiet))
        good = np.ascontiguousarray(payload[intact])
        records = good.view(self.dtype).reshape(-1)
        self._next = nxt + k
        self.dropped += max(0, dropped)
        self.torn += torn
        self.delivered += len(records)
        return RingBatch(records, ns[intact], max(0, dropped), torn)

    def latest(self) -> np.ndarray | None:
        """The newest intact record without moving this reader, or None (for ``nnwatch ls``)."""
        ws = self.state().write_seq
        for n in range(ws - 1, max(-1, ws - 4), -1):
            i = n % self.slots
            slot = self._slots[i : i + 1].copy()
            if int(slot["seq"][0]) != 2 * n + 2 or int(self._seq_view[i]) != 2 * n + 2:
                continue
            if zlib.crc32(slot["payload"][0], n & 0xFFFFFFFF) != int(slot["crc"][0]):
                continue
            return np.ascontiguousarray(slot["payload"][0]).view(self.dtype).reshape(-1)
        return None

    def wait(self, timeout: float, poll: float = 0.002) -> bool:
        """Sleep-poll until a record newer than this reader's position exists, or ``timeout``."""
        deadline = time.monotonic() + timeout
        while True:
            (ws,) = _U64.unpack_from(self._mm, _PUBLISH_OFF)
            if ws > self._next:
                return True
            if time.monotonic() >= deadline:
                return False
            time.sleep(poll)

    def close(self) -> None:
        """Unmap the file. Safe to call twice."""
        if getattr(self, "_slots", None) is not None:
            self._slots = None  # type: ignore[assignment]
            self._seq_view = None  # type: ignore[assignment]
        try:
            self._mm.close()
        except (BufferError, ValueError):
            pass

    def __enter__(self) -> RingReader:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
