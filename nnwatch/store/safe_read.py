"""Reading a run's files as what they are: never through a link, never blocking, sized by their data.

A run directory holds what other programs, copies and people put there, and every reader of it
opens files here. Three things a plain ``open()`` does wrong with them:

- a FIFO where ``events.jsonl`` should be blocks the reader until a writer comes (forever), and a
  symlink to ``/dev/zero`` gives it bytes without end: files are opened with ``O_NOFOLLOW |
  O_NONBLOCK`` and refused unless they are regular files (:func:`open_file`);
- a log a crash (or ``truncate``) extended to gigabytes is one long hole that reads as zeros: a
  reader sized by the length on disk loads millions of zero rows, so readers are sized by the
  last byte of data the file holds (:func:`held_size`), and say how much they left out;
- a line of text with no end (a hole again, or a damaged file) must not grow without bound:
  :func:`iter_lines` skips lines longer than a limit.
"""

from __future__ import annotations

import errno
import os
from collections.abc import Iterator
from pathlib import Path
from typing import BinaryIO

from nnwatch.store.paths import open_regular

#: The longest line a reader takes from a JSON-lines file (events); real lines are a few KB.
MAX_LINE = 1 << 20
_SEEK_DATA = getattr(os, "SEEK_DATA", None)
#: Below this, a file's holes are not worth looking for.
_PAGE = 4096


def open_file(path: Path | str) -> BinaryIO:
    """A regular file of a run, opened for reading in binary (see the module's docstring);
    :class:`OSError` with plain words for a symlink, a FIFO, a device or a socket."""
    return os.fdopen(open_regular(path), "rb")


def held_size(fd: int, size: int | None = None) -> int:
    """The end of the last data the open file ``fd`` holds: its length, less a tail that was
    never written (a hole, which reads as zeros). Cheap: a file with every block allocated is
    answered from ``fstat``; a sparse one by a binary search over ``SEEK_DATA`` (about 30
    ``lseek`` calls for gigabytes), at the file system's block granularity."""
    st = os.fstat(fd)
    size = st.st_size if size is None else min(size, st.st_size)
    if size <= _PAGE or _SEEK_DATA is None or st.st_blocks * 512 >= size:
        return size
    here = os.lseek(fd, 0, os.SEEK_CUR)  # put back after the search: the caller reads on
    lo, hi = 0, size  # the first offset with no data at or after it lies in [lo, hi]
    try:
        while lo < hi:
            mid = (lo + hi) // 2
            try:
                os.lseek(fd, mid, _SEEK_DATA)
            except OSError as exc:
                if exc.errno != errno.ENXIO:
                    return size  # the file system cannot say: trust the length, as before
                hi = mid  # no data at or after mid
            else:
                lo = mid + 1
    finally:
        os.lseek(fd, here, os.SEEK_SET)
    return lo


def hole_tail(path: Path | str) -> tuple[int, int]:
    """(length on disk, data held) of a regular file (see :func:`held_size`)."""
    with open_file(path) as fh:
        size = os.fstat(fh.fileno()).st_size
        return size, held_size(fh.fileno(), size)


def read_held(path: Path | str, limit: int) -> bytes:
    """The data a regular file holds (a hole at its end left out), at most ``limit`` bytes:
    :class:`OSError` when it holds more, or is not a regular file."""
    with open_file(path) as fh:
        held = held_size(fh.fileno())
        if held > limit:
            raise OSError(errno.EFBIG, f"{path} holds {held} bytes, too many for what it should hold")
        return fh.read(held)


def iter_lines(path: Path | str, max_line: int = MAX_LINE) -> Iterator[bytes | None]:
    """The lines of a text file of a run (without their newline), as far as it holds data; a line
    longer than ``max_line`` is skipped and yields None, so the caller can count it. Raises
    :class:`OSError` as :func:`open_file` does."""
    with open_file(path) as fh:
        left = held_size(fh.fileno())
        part = b""
        skipping = False
        while left > 0:
            chunk = fh.read(min(left, 1 << 20))
            if not chunk:
                break
            left -= len(chunk)
            *lines, rest = (part + chunk).split(b"\n")
            for line in lines:
                if skipping:  # the end of a line that was already too long
                    skipping = False
                    continue
                yield line if len(line) <= max_line else None
            if len(rest) > max_line:
                if not skipping:
                    yield None
                skipping, rest = True, b""
            part = rest
        if part and not skipping:
            yield part if len(part) <= max_line else None
