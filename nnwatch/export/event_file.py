"""A TensorBoard event file, written synchronously by the thread that calls it.

TensorBoard's own writer hands every event to a background thread and checksums it (CRC-32C) in
pure Python: about 200 us for a 400-byte event, holding the GIL, which a training loop running
hundreds of steps per second feels. This writer frames events the same way (TFRecord: length,
masked CRC of the length, data, masked CRC of the data), in the thread that already runs the
export, with the C CRC-32C of ``google-crc32c`` when it is installed (about 1 us per event) and
TensorBoard's pure-Python one otherwise. The file name follows TensorBoard's pattern, so
TensorBoard and its ``EventAccumulator`` find it.
"""

from __future__ import annotations

import functools
import itertools
import os
import socket
import struct
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from nnwatch.store.paths import open_dir_nofollow

_counter = itertools.count()
_LEN = struct.Struct("<Q")
_CRC = struct.Struct("<I")


@functools.cache  # chosen once: the import is looked for on the first record only
def _crc32c_function() -> Callable[[bytes], int]:
    try:
        import google_crc32c

        if google_crc32c.implementation == "c":
            return google_crc32c.value  # type: ignore[no-any-return]
    except ImportError:
        pass
    from tensorboard.compat.tensorflow_stub.pywrap_tensorflow import crc32c

    return crc32c  # type: ignore[no-any-return]


def masked_crc32c(data: bytes) -> int:
    """The CRC-32C of ``data``, masked the way TFRecord files store it."""
    x = _crc32c_function()(data) & 0xFFFFFFFF
    return (((x >> 15) | (x << 17)) + 0xA282EAD8) & 0xFFFFFFFF


class EventFile:
    """One ``events.out.tfevents.*`` file in ``log_dir``; ``write`` appends one ``Event`` proto."""

    def __init__(self, log_dir: str | os.PathLike[str]) -> None:
        from tensorboard.compat.proto.event_pb2 import Event

        self._Event = Event
        self.log_dir = Path(log_dir)
        name = (
            f"events.out.tfevents.{int(time.time()):010d}.{socket.gethostname()}."
            f"{os.getpid()}.{next(_counter)}"
        )
        self.path = self.log_dir / name
        # The directory is walked from / without following a link or entering a directory that
        # another user could replace (see open_dir_nofollow), and the file is created new in it:
        # a symlink planted in OUT_DIR must not carry a root export into someone's directory.
        dir_fd = open_dir_nofollow(self.log_dir, create=True)
        try:
            fd = os.open(name, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC,
                         0o600, dir_fd=dir_fd)  # fmt: skip
        finally:
            os.close(dir_fd)
        self._fh = os.fdopen(fd, "ab")
        self.write(Event(wall_time=time.time(), file_version="brain.Event:2"))
        self.flush()

    def write(self, event: Any) -> None:
        data = event.SerializeToString()
        header = _LEN.pack(len(data))
        self._fh.write(
            header + _CRC.pack(masked_crc32c(header)) + data + _CRC.pack(masked_crc32c(data))
        )

    def add_summary(self, summary: Any, step: int, walltime: float | None) -> None:
        self.write(
            self._Event(
                summary=summary,
                step=int(step),
                wall_time=time.time() if walltime is None else walltime,
            )
        )

    def flush(self) -> None:
        self._fh.flush()

    def close(self) -> None:
        if not self._fh.closed:
            self._fh.flush()
            self._fh.close()
