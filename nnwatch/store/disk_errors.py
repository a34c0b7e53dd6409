"""What the file system under a path says: a failed write in plain words, the space left, tmpfs.

Writers of every layer (the run log, the ring, snapshots, ``pack``, ``pull``) report a failed
write the same way, naming what a user can act on (a full disk, permissions, a read-only file
system); readers of a mapped file need to know whether it lies on tmpfs, where touching a hole
kills them. None of it opens or writes a file, so it lives apart from the openers in
:mod:`nnwatch.store.paths`.
"""

from __future__ import annotations

import errno
import os
from pathlib import Path


def describe_os_error(exc: BaseException, where: Path | str | None = None) -> str:
    """Plain words for a write failure, naming the cause a user can act on (full disk,
    permissions, read-only file system) and, for a full disk, how much space is left."""
    code = getattr(exc, "errno", None)
    text = getattr(exc, "strerror", None) or str(exc) or type(exc).__name__
    if code in (errno.ENOSPC, errno.EDQUOT) or (code is None and _disk_full(where)):
        free = free_bytes(where) if where is not None else None
        left = "" if free is None else f", {free // 1024} KiB free"
        return f"the disk is full ({where or 'the run directory'}{left}): {text}"
    if code in (errno.EACCES, errno.EPERM):
        return f"permission denied: {text}"
    if code == errno.EROFS:
        return f"the file system is read-only: {text}"
    return text


def free_bytes(where: Path | str | None) -> int | None:
    """Bytes an unprivileged user can still write at ``where`` (None when it cannot be told)."""
    if where is None:
        return None
    p = Path(where)
    for candidate in (p, *p.parents):
        try:
            st = os.statvfs(candidate)
        except OSError:
            continue
        return int(st.f_bavail) * int(st.f_frsize)
    return None


def _disk_full(where: Path | str | None, slack: int = 64 * 1024) -> bool:
    free = free_bytes(where)
    return free is not None and free < slack


def is_tmpfs(path: Path | str) -> bool:
    """Whether ``path`` lies on a tmpfs/shm mount, where touching a hole in a file that the full
    file system cannot back kills the reader with SIGBUS (reading a hole elsewhere gives zeros)."""
    try:
        real = os.path.realpath(path)
        best, fstype = "", ""
        with open("/proc/self/mounts", encoding="utf-8", errors="replace") as fh:
            for line in fh:
                parts = line.split()
                if len(parts) < 3:
                    continue
                mnt = parts[1].replace("\\040", " ")
                inside = real == mnt or real.startswith(mnt.rstrip("/") + "/")
                if inside and len(mnt) >= len(best):
                    best, fstype = mnt, parts[2]
        return fstype in ("tmpfs", "shm", "ramfs", "hugetlbfs")
    except OSError:
        return False
