"""The ring file's writer: one memory-mapped file per rank, written only by the training thread,
read by any number of monitors that come and go (``ring_reader.py``; the bytes they agree on are
in ``ring_layout.py``).

Why a ring in a plain file: the trainer must never wait for a reader. Publishing is a memcpy into
shared memory plus a few header stores, so a reader that is slow, frozen (SIGSTOP) or killed costs
the trainer nothing; the reader only loses the oldest slots, and it counts them. Plain ``mmap`` on
a file the run owns, not ``multiprocessing.shared_memory``: before Python 3.13 a reader's resource
tracker may delete the producer's segment when the reader exits (CPython gh-82300).
"""

from __future__ import annotations

import logging
import mmap
import os
import stat
import sys
import threading
import time
import zlib
from pathlib import Path

import numpy as np

from nnwatch.store.identity import own_start_time, pid_namespace
from nnwatch.store.paths import describe_os_error, open_in_dir, unlink_file
from nnwatch.store.ring_layout import (
    CONST_OFF,
    HEADER_CONST,
    MAGIC,
    META_OFFSET,
    SLOT_HEADER,
    STATUS_CODES,
    VERSION,
    W_ERRORS,
    W_HEARTBEAT,
    W_INTERVAL,
    W_LAST_PUBLISH,
    W_LOG_ERROR,
    W_PID_NS,
    W_STATUS,
    W_STATUS_TIME,
    W_WRITE_SEQ,
    RingError,
    slot_size,
)

log = logging.getLogger("nnwatch")

DEFAULT_RING_BYTES = 16 * 1024 * 1024
MIN_SLOTS = 256
#: Weight of the newest interval in the step-interval average: readers use it for "hung" and steps/s.
_EMA = 0.1


def _unlink_quietly(path: Path) -> None:
    try:
        unlink_file(path)  # through the pinned run directory, like the open
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


def default_slots(record_size: int) -> int:
    """Enough slots for about 16 MiB of records, and never fewer than 256."""
    return max(MIN_SLOTS, DEFAULT_RING_BYTES // slot_size(record_size))


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
        self.slot_size = slot_size(self.record_size)
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

        fd = open_in_dir(
            self.path, os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW | os.O_NONBLOCK, 0o600
        )
        try:
            st = os.fstat(fd)
            if not stat.S_ISREG(st.st_mode) or st.st_uid != os.getuid():
                raise RingError(
                    f"{self.path} is not a regular file of yours; not writing a ring there"
                )
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
        # Touch every page now, so the first lap of publishes does not pay page faults; then the
        # constant length field of every slot, through one strided view. (No Python object per
        # slot: tens of thousands of them cost the first step 0.1-0.2 s of allocation and
        # garbage-collector passes over the whole training process, and slowed every later one.)
        zeros = np.frombuffer(self._mm, dtype=np.uint8)
        zeros[:] = 0
        lengths = np.ndarray(
            (self.slots,), dtype="<u4", buffer=self._mm, offset=self.slots_offset + 12,
            strides=(self.slot_size,),
        )  # fmt: skip
        lengths[:] = self.record_size
        del zeros, lengths
        now = time.time()
        self.pid = os.getpid()
        self.start_time = own_start_time()
        HEADER_CONST.pack_into(
            self._mm, CONST_OFF, VERSION, self.slots_offset, self.slot_size, self.record_size,
            self.slots, len(meta), self.pid, self.start_time, now,
        )  # fmt: skip
        self._mm[META_OFFSET : META_OFFSET + len(meta)] = meta
        self._mv = memoryview(self._mm)
        # Typed views: item assignment is one aligned store (little-endian hosts only, see top).
        self._hdr_q = self._mv[:META_OFFSET].cast("Q")
        self._hdr_d = self._mv[:META_OFFSET].cast("d")
        self._slot_q = self._mv[self.slots_offset :].cast("Q")
        self._slot_i = self._mv[self.slots_offset :].cast("I")
        self._hdr_d[W_HEARTBEAT] = now
        self._hdr_q[W_PID_NS] = pid_namespace()
        self._hdr_q[W_STATUS] = STATUS_CODES["running"]
        self._hdr_d[W_STATUS_TIME] = now
        self._mm[0:8] = MAGIC  # last: a reader that sees the magic sees a complete header
        self._words = self.slot_size // 8  # a slot's sequence word, as an index into _slot_q

    # -- training thread ---------------------------------------------------------------------------
    def publish(self, record: bytes | memoryview) -> None:
        """Write one record into the next slot. Training thread only; O(record size), no waiting."""
        try:
            n = self._n
            i = n % self.slots
            q = i * self._words
            seqs = self._slot_q
            seqs[q] = 2 * n + 1  # odd: being written
            start = self.slots_offset + i * self.slot_size + SLOT_HEADER
            try:
                self._mm[start : start + self.record_size] = record
            except (ValueError, TypeError, IndexError):
                record = memoryview(record).cast("B")
                self._mm[start : start + self.record_size] = record
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
            hdr[W_HEARTBEAT] = t
            hdr[W_LAST_PUBLISH] = t
            hdr[W_INTERVAL] = self._interval
            self._hdr_q[W_WRITE_SEQ] = n + 1  # last: the record is now visible to readers
        except Exception as exc:  # noqa: BLE001 - nothing may escape into the training loop
            self._error("publish", exc)

    # -- any thread ------------------------------------------------------------------------------
    def beat(self) -> None:
        """Refresh the heartbeat, so readers can tell a live trainer from a frozen or dead one."""
        try:
            self._hdr_d[W_HEARTBEAT] = time.time()
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
            self._hdr_d[W_STATUS_TIME] = time.time()
            self._hdr_q[W_STATUS] = code
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
            self._hdr_q[W_LOG_ERROR] = code
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
            for header_view in (self._hdr_q, self._hdr_d, self._slot_q, self._slot_i):
                header_view.release()
            self._mv.release()
            self._mm.close()
            if unlink:
                _unlink_quietly(self.path)

    def _error(self, where: str, exc: BaseException) -> None:
        self.errors += 1
        try:
            self._hdr_q[W_ERRORS] = self.errors
        except Exception:  # noqa: BLE001
            pass
        if not self._reported and not self._closed:
            self._reported = True
            log.warning(
                "nnwatch: the ring %s failed in %s (%s: %s); training goes on, monitors may miss "
                "records. Further errors are counted silently.", self.path, where,
                type(exc).__name__, exc,
            )  # fmt: skip
