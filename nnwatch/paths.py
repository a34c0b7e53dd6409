"""Where runs live, and the ownership and mode rules that keep them private to one user."""

from __future__ import annotations

import os
import stat
import tempfile
from pathlib import Path

ENV_RUN_DIR = "NNWATCH_RUN_DIR"


class RunDirError(OSError):
    """The run directory exists but is unsafe or unusable; the message says why in plain words."""


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


def ensure_private_dir(path: Path) -> Path:
    """Create ``path`` with mode 0700, or check that an existing one is ours, private and real.

    A symlink, a directory owned by someone else, or one that others can read is refused, since
    the command socket inside it is the only gate to steering a run.
    """
    path = Path(path)
    try:
        path.mkdir(mode=0o700, parents=True, exist_ok=True)
    except FileExistsError as exc:
        raise RunDirError(f"{path} exists and is not a directory") from exc
    st = os.lstat(path)
    if stat.S_ISLNK(st.st_mode):
        raise RunDirError(f"{path} is a symlink; nnwatch refuses it so that nobody can redirect runs")
    if not stat.S_ISDIR(st.st_mode):
        raise RunDirError(f"{path} is not a directory")
    if st.st_uid != os.getuid():
        raise RunDirError(f"{path} belongs to uid {st.st_uid}, not to you (uid {os.getuid()})")
    if stat.S_IMODE(st.st_mode) & 0o077:
        os.chmod(path, 0o700)
    if not os.access(path, os.W_OK | os.X_OK):
        raise RunDirError(f"{path} is not writable")
    return path


def write_private_file(path: Path, data: bytes) -> None:
    """Write ``data`` atomically (temp file + rename) with mode 0600, so readers never see half."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        os.write(fd, data)
    finally:
        os.close(fd)
    os.replace(tmp, path)
