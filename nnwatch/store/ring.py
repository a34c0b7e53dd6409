"""The ring file's writer: one memory-mapped file per rank, written only by the training thread,
read by any number of monitors that come and go (``ring_reader.py``; the bytes they agree on are
in ``ring_layout.py``).

Why a ring in a plain file: the trainer must never wait for a reader. Publishing copies the record
into the file's pages plus a few header words, so a reader that is slow, frozen (SIGSTOP) or killed
costs the trainer nothing; the reader only loses the oldest slots, and it counts them. A plain file
the run owns, not ``multiprocessing.shared_memory``: before Python 3.13 a reader's resource tracker
may delete the producer's segment when the reader exits (CPython gh-82300).

Why ``os.pwrite`` and not a memory map: a mapped file that another process truncates kills the
process that touches the lost pages with SIGBUS, which Python cannot catch; a trainer writing
through a mapping dies (exit 135) when anyone truncates its ring. A write into a truncated file
only extends it again. The writer checks the file's size with its heartbeat (once a second, off
the training thread); a ring found cut short ends live monitoring for the run, with one message,
and training and its run log go on. Two system calls per record (the slot, then the header's
write position and times), measured in ``docs/reliability.md``. An existing file at the ring's path
is never truncated: it is unlinked (a live writer keeps its own inode) and a new one created.
"""

from __future__ import annotations

import errno
import logging
import os
import stat
import struct
import sys
import threading
import time
import zlib
from pathlib import Path

import numpy as np

from nnwatch.store.disk_errors import describe_os_error
from nnwatch.store.identity import own_start_time, pid_namespace
from nnwatch.store.paths import open_in_dir, unlink_file
from nnwatch.store.ring_layout import (
    CONST_OFF,
    HEADER_CONST,
    MAGIC,
    META_OFFSET,
    PUBLISH,
    PUBLISH_OFF,
    STATUS_CODES,
    VERSION,
    W_ERRORS,
    W_HEARTBEAT,
    W_LOG_ERROR,
    W_PID_NS,
    W_STATUS,
    W_STATUS_TIME,
    RingError,
    slot_size,
)

log = logging.getLogger("nnwatch")

DEFAULT_RING_BYTES = 16 * 1024 * 1024
MIN_SLOTS = 256
#: Weight of the newest interval in the step-interval average: readers use it for "hung" and steps/s.
_EMA = 0.1
#: A slot's head as one write: sequence number (even: done), CRC32 of the record, its length.
_SLOT_HEAD = struct.Struct("<QII")
_U64, _F64 = struct.Struct("<Q"), struct.Struct("<d")
#: How often (seconds) the heartbeat also checks that the file still has its size.
SIZE_CHECK_S = 1.0


def _unlink_quietly(path: Path) -> None:
    try:
        unlink_file(path)  # through the pinned run directory, like the open
    except OSError:
        pass


def log_error_code(message: str) -> int:
    """The header code for a failure message from :func:`nnwatch.store.disk_errors.describe_os_error`."""
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
        self._size = size
        self._checked = time.monotonic()
        self._cut = False  # the file was found cut short: nothing more is written
        self.pid = os.getpid()
        self.start_time = own_start_time()
        self._fd = self._create(size, meta)
        now = time.time()
        self._word(W_HEARTBEAT, _F64, now)
        self._word(W_PID_NS, _U64, pid_namespace())
        self._word(W_STATUS, _U64, STATUS_CODES["running"])
        self._word(W_STATUS_TIME, _F64, now)
        os.pwrite(self._fd, MAGIC, 0)  # last: a reader that sees the magic sees a complete header

    def _create(self, size: int, meta: bytes) -> int:
        """A new ring file of ``size`` bytes, every page allocated and written, its header and
        the slots' constant length words set; the descriptor stays open for ``pwrite``."""
        _unlink_quietly(self.path)  # never truncate: a live writer of that path keeps its inode
        fd = open_in_dir(
            self.path,
            os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC,
            0o600,
        )
        try:
            st = os.fstat(fd)
            if not stat.S_ISREG(st.st_mode) or st.st_uid != os.getuid():
                raise RingError(
                    f"{self.path} is not a regular file of yours; not writing a ring there"
                )
            os.fchmod(fd, 0o600)
            os.ftruncate(fd, size)
            # Reserve the space now: on a full tmpfs (Docker's 64 MiB /dev/shm) a reader touching
            # a hole of the file dies of SIGBUS; posix_fallocate fails with ENOSPC instead, which
            # the probe reports while training goes on. The half-made file is removed.
            if hasattr(os, "posix_fallocate"):
                os.posix_fallocate(fd, 0, size)
            self._write_initial(fd, meta)
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
        return fd

    def _write_initial(self, fd: int, meta: bytes) -> None:
        """Header constants, meta, and zeroed slots whose length words are set: written a chunk
        of slots at a time (every page is written now, so the first lap does not fault pages in)."""
        head = bytearray(self.slots_offset)
        HEADER_CONST.pack_into(
            head, CONST_OFF, VERSION, self.slots_offset, self.slot_size, self.record_size,
            self.slots, len(meta), self.pid, self.start_time, time.time(),
        )  # fmt: skip
        head[META_OFFSET : META_OFFSET + len(meta)] = meta
        _write_all(fd, head, 0)
        per = max(1, (1 << 20) // self.slot_size)
        chunk = np.zeros(per * self.slot_size, np.uint8)
        lengths = np.ndarray((per,), dtype="<u4", buffer=chunk, offset=12, strides=(self.slot_size,))
        lengths[:] = self.record_size
        for first in range(0, self.slots, per):
            n = min(per, self.slots - first)
            _write_all(fd, chunk.data[: n * self.slot_size],
                       self.slots_offset + first * self.slot_size)  # fmt: skip

    def _word(self, index: int, kind: struct.Struct, value: float) -> None:
        """One 8-byte header word, in one write (a reader never sees half of it zeroed)."""
        os.pwrite(self._fd, kind.pack(value), 8 * index)

    # -- training thread ---------------------------------------------------------------------------
    def publish(self, record: bytes | memoryview) -> None:
        """Write one record into the next slot. Training thread only; two ``pwrite`` calls, no
        waiting: the slot (sequence ``2n+2``, CRC, length, payload), then the write position."""
        if self._cut:
            return
        try:
            n = self._n
            off = self.slots_offset + (n % self.slots) * self.slot_size
            if isinstance(record, memoryview) and (record.ndim != 1 or record.format != "B"):
                record = record.cast("B")
            crc = zlib.crc32(record, n & 0xFFFFFFFF)
            if len(record) != self.record_size:
                raise ValueError(f"a record of {len(record)} bytes; the ring holds {self.record_size}")
            _pwritev(self._fd, [_SLOT_HEAD.pack(2 * n + 2, crc, self.record_size), record], off)
            t = time.time()
            if self._last_t:
                dt = t - self._last_t
                self._interval = (
                    dt if not self._interval else self._interval + _EMA * (dt - self._interval)
                )
            self._last_t = t
            self._n = n + 1
            # last: write position, heartbeat, last publish, interval (the record is now visible)
            os.pwrite(self._fd, PUBLISH.pack(n + 1, t, t, self._interval), PUBLISH_OFF)
        except Exception as exc:  # noqa: BLE001 - nothing may escape into the training loop
            self._error("publish", exc)

    # -- any thread ------------------------------------------------------------------------------
    def beat(self) -> None:
        """Refresh the heartbeat, so readers can tell a live trainer from a frozen or dead one;
        once a second, also check that the file was not cut short under the run."""
        if self._cut or self._closed:
            return
        try:
            self._word(W_HEARTBEAT, _F64, time.time())
            if time.monotonic() - self._checked >= SIZE_CHECK_S:
                self._check_size()
        except Exception:  # noqa: BLE001 - closed ring, or a race with close(): nothing to do
            pass

    def _check_size(self) -> None:
        """End live monitoring, with one message, when another process truncated the file (the
        records written since are in holes that writes re-extended: no reader can trust them)."""
        self._checked = time.monotonic()
        size = os.fstat(self._fd).st_size
        if size == self._size:
            return
        self._cut = True
        log.warning(
            "nnwatch: the ring %s was cut to %d of its %d bytes by another process; live "
            "monitoring of this run ends here (training and its run log go on)",
            self.path, size, self._size,
        )  # fmt: skip

    def set_status(self, status: str) -> None:
        """Record "running", "paused", "finished", "stopped" or "crashed" for readers."""
        code = STATUS_CODES.get(status)
        if code is None:
            raise ValueError(
                f"unknown ring status {status!r}; use one of {', '.join(STATUS_CODES)}"
            )
        if self._cut:
            return
        try:
            self._word(W_STATUS_TIME, _F64, time.time())
            self._word(W_STATUS, _U64, code)
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
        if self._cut or self._closed:
            return
        try:
            self._word(W_LOG_ERROR, _U64, code)
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
        """Write the final status and close. The file stays (readers may still be attached)."""
        if self._closed:
            return
        self._beat_stop.set()
        if self._beat_thread is not None:
            self._beat_thread.join(timeout=2)
        try:
            self.set_status(status)
        finally:
            self._closed = True
            os.close(self._fd)
            if unlink:
                _unlink_quietly(self.path)

    def _error(self, where: str, exc: BaseException) -> None:
        self.errors += 1
        try:
            if not self._cut and not self._closed:
                self._word(W_ERRORS, _U64, self.errors)
        except Exception:  # noqa: BLE001
            pass
        if not self._reported and not self._closed:
            self._reported = True
            log.warning(
                "nnwatch: the ring %s failed in %s (%s: %s); training goes on, monitors may miss "
                "records. Further errors are counted silently.", self.path, where,
                type(exc).__name__, exc,
            )  # fmt: skip


def _pwritev_joined(fd: int, parts: list[bytes | memoryview], offset: int) -> int:
    """``os.pwritev`` where the platform has none: the parts joined into one write."""
    return os.pwrite(fd, b"".join(parts), offset)


_pwritev = getattr(os, "pwritev", _pwritev_joined)


def _write_all(fd: int, data: bytes | bytearray | memoryview, offset: int) -> None:
    """``pwrite`` until all of ``data`` is at ``offset`` (a short write on a full disk: ENOSPC)."""
    view = memoryview(data)
    while view:
        n = os.pwrite(fd, view, offset)
        if n <= 0:
            raise OSError(errno.ENOSPC, "no space left on device")
        view, offset = view[n:], offset + n
