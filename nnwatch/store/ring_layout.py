"""The ring file's layout: what the writer (``ring.py``) and the readers (``ring_reader.py``) agree
on, byte for byte, and nothing that only one of them needs.

Why sequence numbers *and* a checksum: Python has no memory fences and aarch64 hosts reorder
stores, so a reader can see a slot's "done" sequence number before the payload bytes. Each slot is
written as: sequence ``2n+1`` (odd: writing), payload, then CRC32 (seeded with ``n``) plus sequence
``2n+2`` (even: done), and only then the header's write position. A reader copies a slot, checks
that the sequence was ``2n+2`` before and after the copy, and that the CRC matches; anything else
is a *torn* slot, counted and never returned as data.

File layout (little-endian; the writer stores words natively, so it refuses big-endian hosts)::

    0     header: magic, HEADER_CONST at CONST_OFF, then the mutable words W_* (8 bytes each)
    256   meta JSON (the run's RunMeta), so a reader can decode records with nothing else
    S     slots, S = header + meta rounded up to 4096; each slot is
              u64 seq | u32 crc | u32 length | payload (record_size bytes) | padding to 64
"""

from __future__ import annotations

import struct
from pathlib import Path

MAGIC = b"NNWRING\x01"
VERSION = 1
META_OFFSET = 256
SLOT_HEADER = 16
SLOT_ALIGN = 64

#: The run states the header can hold. "hung" is never written: readers infer it (see health.py).
STATUS_CODES: dict[str, int] = {
    "starting": 0, "running": 1, "paused": 2, "finished": 3, "crashed": 4, "stopped": 5,
}  # fmt: skip
#: Statuses after which the writer publishes nothing more ("stopped": interrupted, ended cleanly).
ENDED = ("finished", "crashed", "stopped")
STATUS_NAMES: dict[int, str] = {v: k for k, v in STATUS_CODES.items()}

# Constant part of the header, written once before the magic: version, slots offset, slot size,
# record size, slots, meta length, pid, process start time, creation time.
HEADER_CONST = struct.Struct("<IIIIII qdd")
CONST_OFF = 8
# Mutable part, one aligned 8-byte word per field (index in 8-byte words from the file's start).
# The writer stores each with a single memoryview item assignment: ``struct.pack_into`` would
# first zero the whole range, and a reader could catch the zeros (a write position of 0, a
# heartbeat from 1970).
W_WRITE_SEQ, W_HEARTBEAT, W_LAST_PUBLISH, W_INTERVAL = 8, 9, 10, 11  # u64, f64, f64, f64
W_STATUS, W_STATUS_TIME, W_ERRORS = 12, 13, 14  # u64, f64, u64
W_LOG_ERROR = 15  # u64: why the run log stopped (LOG_ERRORS), 0 while it works
#: u64: the writer's PID namespace (inode of /proc/self/ns/pid), 0 when unknown (older writers
#: left the word zero): a reader in another namespace judges the run by its heartbeat alone.
W_PID_NS = 16
PID_NS_OFF = 8 * W_PID_NS
#: The reader's views of those words: write_seq, heartbeat, last publish, interval; ...
PUBLISH = struct.Struct("<Qddd")
PUBLISH_OFF = 8 * W_WRITE_SEQ
HEARTBEAT = struct.Struct("<d")
HEARTBEAT_OFF = 8 * W_HEARTBEAT
STATUS = struct.Struct("<Qd")  # status code, time of the change
STATUS_OFF = 8 * W_STATUS
ERRORS = struct.Struct("<Q")
ERRORS_OFF = 8 * W_ERRORS
LOG_ERROR_OFF = 8 * W_LOG_ERROR
U64 = struct.Struct("<Q")
#: A slot's length word (at offset 12 of the slot).
SLOT_LENGTH = struct.Struct("<I")
#: A write position beyond this is a corrupt header, not a run (2**48 steps at 1 MHz: 9 years).
MAX_SEQ = 1 << 48
#: Why the run log (or a snapshot) could not be written, as the header stores it for monitors.
LOG_ERRORS: dict[int, str] = {
    1: "the disk is full", 2: "permission denied", 3: "a write error", 4: "the file system is read-only",
}  # fmt: skip


class RingError(RuntimeError):
    """A ring file cannot be used; the message says what is wrong in plain words."""


def ring_path(run_dir: Path, rank: int = 0) -> Path:
    """The ring file inside a run directory (``ring``, or ``ring-r<rank>`` for ranks above 0)."""
    return Path(run_dir) / ("ring" if int(rank) == 0 else f"ring-r{int(rank)}")


def slot_size(record_size: int) -> int:
    """Bytes per slot: the slot header plus one record, rounded up to SLOT_ALIGN."""
    return -(-(SLOT_HEADER + record_size) // SLOT_ALIGN) * SLOT_ALIGN
