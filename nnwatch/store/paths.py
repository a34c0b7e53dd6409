"""Where runs live, and the ownership and mode rules that keep them private to one user.

Every file nnwatch creates or appends to goes through this module, so that the rules hold
everywhere at once: no symlink is ever followed (``O_NOFOLLOW``), temporary files are created
exclusively (``O_EXCL``) under unpredictable names, a file nnwatch reads is only read when it is
a regular file (a FIFO planted in a run directory would otherwise block a reader forever), and a
directory nnwatch writes into is real, owned by the user and writable by nobody else. In a
shared directory another user could otherwise pre-create a run directory full of symlinks and
have a root trainer append its rows to any file on the machine.
"""

from __future__ import annotations

import errno
import os
import secrets
import stat
import tempfile
from pathlib import Path

ENV_RUN_DIR = "NNWATCH_RUN_DIR"
#: A run directory's snapshots, one directory each, and the file that makes one complete
#: (written last): the names monitors, ``pack`` and ``pull`` look for without loading torch.
SNAPSHOTS_DIR = "snapshots"
SNAPSHOT_MANIFEST = "manifest.json"
#: Largest JSON side file (meta, end, registry entry, manifest) a reader loads; real ones are KBs.
MAX_SMALL_FILE = 4 * 1024 * 1024
_NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)
_CLOEXEC = getattr(os, "O_CLOEXEC", 0)
_NONBLOCK = getattr(os, "O_NONBLOCK", 0)


class RunDirError(OSError):
    """The run directory exists but is unsafe or unusable; the message says why in plain words."""


class UnsafeFileError(OSError):
    """A file nnwatch was about to read or write is a symlink, a FIFO, or belongs to someone else."""


def default_root() -> Path:
    """The per-user root: $NNWATCH_RUN_DIR, else /dev/shm/nnwatch-$UID, else /tmp/nnwatch-$UID.

    Not $XDG_RUNTIME_DIR: it is removed at logout and would take runs started under nohup with it.
    """
    env = os.environ.get(ENV_RUN_DIR)
    if env:
        return Path(env).expanduser()
    uid = os.getuid()
    shm = Path("/dev/shm")
    if shm.is_dir() and os.access(shm, os.W_OK):
        return shm / f"nnwatch-{uid}"
    return Path(tempfile.gettempdir()) / f"nnwatch-{uid}"


def check_own_dir(path: Path, *, tighten: bool = True) -> os.stat_result:
    """Refuse ``path`` unless it is a real directory (not a symlink), owned by this user, that no
    other user can write into. With ``tighten``, group/other permission bits of an own directory
    are removed instead of refused (a directory made under a permissive umask)."""
    path = Path(path)
    st = os.lstat(path)
    if stat.S_ISLNK(st.st_mode):
        raise RunDirError(
            f"{path} is a symlink; nnwatch refuses it so that nobody can redirect runs"
        )
    if not stat.S_ISDIR(st.st_mode):
        raise RunDirError(f"{path} exists and is not a directory")
    if st.st_uid != os.getuid():
        raise RunDirError(
            f"{path} belongs to uid {st.st_uid}, not to you (uid {os.getuid()}); nnwatch will not "
            "write into another user's directory: choose a run_dir of your own"
        )
    if stat.S_IMODE(st.st_mode) & 0o077:
        if not tighten:
            raise RunDirError(
                f"{path} can be written by other users (mode {stat.S_IMODE(st.st_mode):o})"
            )
        os.chmod(path, 0o700, follow_symlinks=False)
        st = os.lstat(path)
    return st


def ensure_private_dir(path: Path) -> Path:
    """Create ``path`` with mode 0700, or check that an existing one is ours, private and real.

    A symlink, a directory owned by someone else, or one that others can read is refused (or,
    when it is ours, made private), since the command socket inside it is the only gate to
    steering a run.
    """
    path = Path(path)
    try:
        path.mkdir(mode=0o700, parents=True, exist_ok=True)
    except FileExistsError as exc:
        raise RunDirError(f"{path} exists and is not a directory") from exc
    check_own_dir(path)
    if not os.access(path, os.W_OK | os.X_OK):
        raise RunDirError(f"{path} is not writable")
    return path


def make_run_dir(path: str | os.PathLike[str]) -> Path:
    """Create an explicit ``run_dir`` (``watch(run_dir=...)``), or accept an existing one only when
    it is a real directory of this user that nobody else can write into.

    Parents are created as ``mkdir -p`` would; only the run directory itself must be private,
    since everything nnwatch writes goes inside it.
    """
    path = Path(path).expanduser()
    try:
        os.lstat(path)
        existed = True
    except FileNotFoundError:
        existed = False
    if not existed:
        path.parent.mkdir(parents=True, exist_ok=True)
        try:
            os.mkdir(path, 0o700)
        except FileExistsError:
            pass  # raced with someone: the checks below judge what is there now
    return ensure_private_dir(path)


def open_for_append(path: Path, mode: int = 0o600) -> int:
    """Open (creating if needed) a regular file of ours for appending, never through a symlink."""
    fd = os.open(
        path, os.O_WRONLY | os.O_CREAT | os.O_APPEND | _NOFOLLOW | _CLOEXEC | _NONBLOCK, mode
    )
    try:
        _check_own_regular(fd, path)
        os.set_blocking(fd, True)
    except BaseException:
        os.close(fd)
        raise
    return fd


def create_exclusive(path: Path, mode: int = 0o600) -> int:
    """Create a new file that did not exist (never a symlink, never someone else's file)."""
    return os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | _NOFOLLOW | _CLOEXEC, mode)


def _check_own_regular(fd: int, path: Path) -> os.stat_result:
    st = os.fstat(fd)
    if not stat.S_ISREG(st.st_mode):
        raise UnsafeFileError(errno.EINVAL, f"{path} is not a regular file")
    if st.st_uid != os.getuid():
        raise UnsafeFileError(errno.EPERM, f"{path} belongs to uid {st.st_uid}, not to you")
    return st


def open_regular(path: Path | str) -> int:
    """Open a file for reading only if it is a regular file and not a symlink. Never blocks: a
    FIFO is opened non-blocking and then refused."""
    fd = os.open(path, os.O_RDONLY | _NOFOLLOW | _CLOEXEC | _NONBLOCK)
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise UnsafeFileError(errno.EINVAL, f"{path} is not a regular file")
        os.set_blocking(fd, True)
    except BaseException:
        os.close(fd)
        raise
    return fd


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


def write_private_file(path: Path, data: bytes) -> None:
    """Write ``data`` atomically (temp file + rename) with mode 0600, so readers never see half.

    The temporary file gets an unpredictable name and is created exclusively without following
    symlinks, so nothing planted beside it can redirect the write; a failed write (a full disk)
    removes it again instead of leaving an empty temporary file behind.
    """
    path = Path(path)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{secrets.token_hex(4)}.tmp")
    fd = create_exclusive(tmp)
    try:
        try:
            view = memoryview(data)
            while view:
                n = os.write(fd, view)
                if n <= 0:
                    raise OSError(errno.ENOSPC, "no space left on device")
                view = view[n:]
        finally:
            os.close(fd)
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise


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
