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

The openers underneath (:func:`open_regular`, :func:`read_small_file` for JSON side files) are
here too: they only read, through the pinned directories of :mod:`nnwatch.store.paths`.
"""

from __future__ import annotations

import errno
import os
import stat
from collections.abc import Iterator
from pathlib import Path
from typing import BinaryIO

from nnwatch.store.paths import UnsafeFileError, open_in_dir

#: Largest JSON side file (meta, end, registry entry, manifest) a reader loads; real ones are KBs.
MAX_SMALL_FILE = 4 * 1024 * 1024
_NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)
_CLOEXEC = getattr(os, "O_CLOEXEC", 0)
_NONBLOCK = getattr(os, "O_NONBLOCK", 0)
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


def open_regular(path: Path | str) -> int:
    """Open a file for reading only if it is a regular file and not a symlink. Never blocks: a
    FIFO is opened non-blocking and then refused."""
    try:
        fd = open_in_dir(path, os.O_RDONLY | _NOFOLLOW | _CLOEXEC | _NONBLOCK)
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise UnsafeFileError(errno.ELOOP, f"{path} is a symlink (not followed)") from exc
        if exc.errno == errno.ENXIO:
            raise UnsafeFileError(errno.ENXIO, f"{path} is a socket, not a file") from exc
        raise
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise UnsafeFileError(errno.EINVAL, f"{path} is {_not_a_file(st.st_mode)}")
        os.set_blocking(fd, True)
    except BaseException:
        os.close(fd)
        raise
    return fd


def _not_a_file(mode: int) -> str:
    """What a path that should be a regular file is instead, in words."""
    if stat.S_ISFIFO(mode):
        return "a FIFO, not a file"
    if stat.S_ISDIR(mode):
        return "a directory, not a file"
    if stat.S_ISCHR(mode) or stat.S_ISBLK(mode):
        return "a device, not a file"
    return "not a regular file"


def read_small_file(path: Path | str, limit: int = MAX_SMALL_FILE) -> bytes:
    """The bytes of a small regular file (JSON side files). Raises OSError for a missing file, a
    symlink, a FIFO or device, or one larger than ``limit``; never blocks and never follows links."""
    fd = open_regular(path)
    try:
        size = os.fstat(fd).st_size
        if size > limit:
            raise UnsafeFileError(
                errno.EFBIG, f"{path} is {size} bytes, too large for what it should hold"
            )
        chunks = []
        left = limit + 1
        while left > 0:
            chunk = os.read(fd, min(left, 1 << 20))
            if not chunk:
                break
            chunks.append(chunk)
            left -= len(chunk)
        data = b"".join(chunks)
        if len(data) > limit:
            raise UnsafeFileError(errno.EFBIG, f"{path} grew beyond {limit} bytes while being read")
        return data
    finally:
        os.close(fd)
