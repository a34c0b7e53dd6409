"""Reading a ring file: attach to a run's ring and take the records published since the last read,
without ever slowing the writer (see ``ring.py``) or the other readers.

A reader only copies: a slot whose sequence number changed during the copy, or whose checksum does
not match, is counted as torn and skipped; records the writer lapped before this reader got to them
are counted as dropped (see ``ring_layout.py`` for why both checks are needed).
"""

from __future__ import annotations

import errno
import math
import mmap
import os
import stat
import struct
import time
import zlib
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import numpy as np

from nnwatch.store.disk_errors import is_tmpfs
from nnwatch.store.record_split import split_records
from nnwatch.store.ring_layout import (
    CONST_OFF,
    ERRORS,
    ERRORS_OFF,
    HEADER_CONST,
    HEARTBEAT,
    HEARTBEAT_OFF,
    LOG_ERROR_OFF,
    LOG_ERRORS,
    MAGIC,
    MAX_SEQ,
    META_OFFSET,
    PID_NS_OFF,
    PUBLISH,
    PUBLISH_OFF,
    SLOT_ALIGN,
    SLOT_HEADER,
    STATUS,
    STATUS_NAMES,
    STATUS_OFF,
    U64,
    VERSION,
    RingError,
)
from nnwatch.store.schema import RunMeta, RunSchema


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
    #: The writer's PID namespace (0: not recorded); see ``identity.pid_checkable``.
    pid_ns: int = 0

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
            size = min(size, _declared_size(head, size))  # a hole past the slots is not mapped
            try:
                self._mm = mmap.mmap(fd, size, mmap.MAP_SHARED, mmap.PROT_READ)
            except OSError as exc:
                raise RingError(
                    f"cannot map the ring {self.path} ({size} bytes): {exc.strerror or exc}"
                ) from exc
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
            HEADER_CONST.unpack_from(self._mm, CONST_OFF)
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
            raise RingError(
                f"{self.path} has an inconsistent header; the file may be truncated or corrupt"
            )
        self.pid, self.start_time, self.created = int(pid), float(start_time), float(created)
        self.slots, self.slot_size, self.record_size = int(slots), int(slot_size), int(record_size)
        self._read_meta(meta_len, record_size)
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

    def _read_meta(self, meta_len: int, record_size: int) -> None:
        """The run's description the ring carries, and the record layout it gives (raw bytes
        when there is none), checked against the header's record size."""
        try:
            self.meta_json = bytes(self._mm[META_OFFSET : META_OFFSET + meta_len]).decode()
            self.meta: RunMeta | None = (
                RunMeta.from_json(self.meta_json) if self.meta_json else None
            )
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

    # -- header ----------------------------------------------------------------------------------
    def state(self) -> RingState:
        """Read the header now (cheap: a few unpacks from shared memory)."""
        ws, _hb, last, interval = PUBLISH.unpack_from(self._mm, PUBLISH_OFF)
        (hb,) = HEARTBEAT.unpack_from(self._mm, HEARTBEAT_OFF)
        code, status_time = STATUS.unpack_from(self._mm, STATUS_OFF)
        (errors,) = ERRORS.unpack_from(self._mm, ERRORS_OFF)
        (log_code,) = U64.unpack_from(self._mm, LOG_ERROR_OFF)
        (pid_ns,) = U64.unpack_from(self._mm, PID_NS_OFF)
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
            pid_ns=int(pid_ns) if pid_ns < 1 << 63 else 0,
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
        return int(self._next)

    @property
    def pending(self) -> int:
        """Records published but not yet read by this reader."""
        return int(max(0, self.state().write_seq - self._next))

    # -- records ---------------------------------------------------------------------------------
    def read(self, max_records: int | None = None) -> np.ndarray:
        """New records as a structured array (``meta.schema.record_dtype()``); may be empty."""
        return self.read_batch(max_records).records

    def read_rows(self, schema: RunSchema) -> tuple[np.ndarray, np.ndarray]:
        """New records as the run log keeps them: (scalar rows, layer rows); either may be
        empty. A monitor reads these, not the raw records."""
        return split_records(self.read(), schema)

    def read_batch(self, max_records: int | None = None) -> RingBatch:
        """New records plus what was dropped or torn since the previous read."""
        (ws,) = U64.unpack_from(self._mm, PUBLISH_OFF)
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
        # lapped: the writer was at this slot again before or during the copy (it writes the
        # slot's sequence with its payload, in one call)
        overwritten = (seq_before > expected) | (seq_after.astype(np.int64) > expected)
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
            (ws,) = U64.unpack_from(self._mm, PUBLISH_OFF)
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


def _declared_size(head: bytes, size: int) -> int:
    """The bytes the header says the ring spans (slots' offset + slots x slot size), or ``size``
    when the header is too odd to say: ``_attach`` then rejects it with its own words."""
    try:
        fields = HEADER_CONST.unpack_from(head, CONST_OFF)
    except struct.error:
        return size
    slots_off, slot_size, slots = fields[1], fields[2], fields[4]
    end = slots_off + slots * slot_size
    return end if 0 < end <= size else size
