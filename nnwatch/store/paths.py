"""Where runs live, and the ownership and mode rules that keep them private to one user.

Every file nnwatch creates or appends to goes through this module, so that the rules hold
everywhere at once: no symlink is ever followed (``O_NOFOLLOW``), temporary files are created
exclusively (``O_EXCL``) under unpredictable names, a file nnwatch reads is only read when it is
a regular file (a FIFO planted in a run directory would otherwise block a reader forever), and a
directory nnwatch writes into is real, owned by the user and writable by nobody else. In a
shared directory another user could otherwise pre-create a run directory full of symlinks and
have a root trainer append its rows to any file on the machine.

The whole path of a run directory is trusted, not only its last component: it is opened from
``/`` one directory at a time (:func:`open_dir_nofollow`), and a symlink or directory that
another user could replace (theirs, or in a directory they can write) is refused. While a run
writes, its directory is *pinned* (:func:`pin_dir`): every file under it is opened relative to
that one descriptor, so a directory swapped for a symlink after the first step redirects nothing.
"""

from __future__ import annotations

import errno
import os
import secrets
import stat
import tempfile
import threading
from pathlib import Path

from nnwatch.store.replaceable import replaceable

ENV_RUN_DIR = "NNWATCH_RUN_DIR"
#: A run directory's snapshots, one directory each, and the file that makes one complete
#: (written last): the names monitors, ``pack`` and ``pull`` look for without loading torch.
SNAPSHOTS_DIR = "snapshots"
SNAPSHOT_MANIFEST = "manifest.json"
_NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)
_CLOEXEC = getattr(os, "O_CLOEXEC", 0)
_NONBLOCK = getattr(os, "O_NONBLOCK", 0)
_DIRECTORY = getattr(os, "O_DIRECTORY", 0)


class RunDirError(OSError):
    """The run directory exists but is unsafe or unusable; the message says why in plain words."""


class UnsafeFileError(OSError):
    """A file nnwatch was about to read or write is a symlink, a FIFO, or belongs to someone else."""


def default_root() -> Path:
    """The per-user root: $NNWATCH_RUN_DIR, else /dev/shm/nnwatch-$UID, else /tmp/nnwatch-$UID,
    else (both made first by another user) a directory of this user's with an unpredictable name.

    Not $XDG_RUNTIME_DIR: it is removed at logout and would take runs started under nohup with it.
    """
    env = os.environ.get(ENV_RUN_DIR)
    if env:
        return Path(env).expanduser()
    stem = f"nnwatch-{os.getuid()}"
    shm = Path("/dev/shm")
    parents = [shm] if shm.is_dir() and os.access(shm, os.W_OK) else []
    parents.append(Path(tempfile.gettempdir()))
    taken = []
    for parent in parents:
        root = parent / stem
        why = _taken(root)
        if why is None:
            break
        taken.append(f"{root} {why}")
    else:
        root = own_dir(parents[0], stem)
    if taken:
        _say_once(f"nnwatch: {'; '.join(taken)}; runs go to {root} instead (NNWATCH_RUN_DIR "
                  "chooses another place)")  # fmt: skip
    return root


def own_dir(parent: Path, stem: str) -> Path:
    """``parent/stem`` when it is this user's or not there yet; else this user's own
    ``parent/stem.<random>``, made now if there is none.

    A predictable name in a shared directory can be made first by anyone (mode 0777, say), and
    nnwatch must never use another user's directory: that would switch monitoring off for
    everyone whose name was taken. The fallback's name cannot be guessed ahead, and it is found
    again (by the trainer and by ``ls`` alike) by ownership: only this user can own it. Of two
    made at the same moment, both processes settle on the first by name.
    """
    if _taken(parent / stem) is None:
        return parent / stem

    def mine() -> list[str]:
        try:
            names = [e.name for e in os.scandir(parent) if e.name.startswith(stem + ".")]
        except OSError:
            return []
        return sorted(n for n in names if _taken(parent / n) is None)

    found = mine()
    if not found:
        try:
            os.mkdir(parent / f"{stem}.{secrets.token_hex(8)}", 0o700)
        except OSError:
            pass
        found = mine()
    return parent / found[0] if found else parent / f"{stem}.{secrets.token_hex(8)}"


_SAID: set[str] = set()


def _say_once(message: str) -> None:
    if message not in _SAID:
        _SAID.add(message)
        import logging  # lazy: the store logs nothing else

        logging.getLogger("nnwatch").warning("%s", message)


def _taken(root: Path) -> str | None:
    """Why a default root that is already there cannot be ours (another user made it first, in a
    world-writable /dev/shm), or None when it is ours or not there yet."""
    try:
        st = os.lstat(root)
    except OSError:
        return None
    if stat.S_ISLNK(st.st_mode):
        return "is a symlink"
    if not stat.S_ISDIR(st.st_mode):
        return "is not a directory"
    if st.st_uid != os.getuid():
        return f"belongs to uid {st.st_uid}, not to you"
    return None


def check_own_dir(path: Path, *, tighten: bool = True) -> os.stat_result:
    """Refuse ``path`` unless it is a real directory (not a symlink), owned by this user, that no
    other user can write into. With ``tighten``, group/other permission bits of an own directory
    are removed instead of refused (a directory made under a permissive umask)."""
    path = Path(path)
    dir_fd, rel = pinned(path)  # a pinned run directory is judged by its descriptor
    st = os.stat(rel, dir_fd=dir_fd, follow_symlinks=False)
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
        os.chmod(rel, 0o700, dir_fd=dir_fd, follow_symlinks=False)
        st = os.stat(rel, dir_fd=dir_fd, follow_symlinks=False)
    return st


def ensure_private_dir(path: Path) -> Path:
    """Create ``path`` with mode 0700, or check that an existing one is ours, private and real.

    A symlink, a directory owned by someone else, or one that others can read is refused (or,
    when it is ours, made private), since the command socket inside it is the only gate to
    steering a run.
    """
    path = Path(path)
    try:
        _make_dirs(path)
    except FileExistsError as exc:
        if os.path.islink(path):  # a symlink to a file: say what it is, not what it points to
            raise RunDirError(
                f"{path} is a symlink; nnwatch refuses it so that nobody can redirect runs"
            ) from exc
        raise RunDirError(f"{path} exists and is not a directory") from exc
    check_own_dir(path)
    if not os.access(path, os.W_OK | os.X_OK):
        raise RunDirError(f"{path} is not writable")
    return path


def _make_dirs(path: Path) -> None:
    """``mkdir -p path``, every directory it makes 0700 whatever the umask: under ``umask 000``
    mkdir's own parents would be 0777 without the sticky bit, writable by every user (and then
    refused by the very checks that follow). FileExistsError when ``path`` is not a directory."""
    todo = []
    p = Path(os.path.abspath(path))
    while not os.path.lexists(p) and p != p.parent:
        todo.append(p)
        p = p.parent
    for d in reversed(todo):
        try:
            os.mkdir(d, 0o700)
        except FileExistsError:
            continue  # made meanwhile by someone: what it is, is judged by the caller
        fd = os.open(d, os.O_RDONLY | _DIRECTORY | _NOFOLLOW | _CLOEXEC)
        try:
            os.fchmod(fd, 0o700)
        finally:
            os.close(fd)
    if not os.path.isdir(path):
        raise FileExistsError(errno.EEXIST, f"{path} exists and is not a directory")


def make_run_dir(path: str | os.PathLike[str]) -> Path:
    """Create an explicit ``run_dir`` (``watch(run_dir=...)``), or accept an existing one only when
    it is a real directory of this user that nobody else can write into.

    Missing parents are created as ``mkdir -p`` would (mode 0700), and the whole path is walked
    from ``/`` without following a symlink, or entering a directory, that another user could
    replace (see :func:`open_dir_nofollow`): a symlink of theirs in /tmp must not carry the run
    into a directory of their choosing.
    """
    path = Path(os.path.abspath(Path(path).expanduser()))
    os.close(open_dir_nofollow(path, create=True))
    return ensure_private_dir(path)


def open_dir_nofollow(path: str | os.PathLike[str], *, create: bool = False) -> int:
    """A descriptor of directory ``path``, opened from ``/`` one component at a time.

    A component is entered only when nobody but this user or root could have put it there or
    could replace it: it belongs to one of them, and so does the directory that holds it, which
    no other user can write into (a sticky directory such as /tmp is fine: there only an entry's
    owner can rename it). A symlink passing that test is followed (``/var/run -> /run``); any
    other symlink, another user's directory, or one in a directory others can write, is refused
    with a :class:`RunDirError` naming it. ``create``: missing directories are made (mode 0700).
    The last component must be this user's own directory.
    """
    me = os.getuid()
    names = [n for n in os.fspath(os.path.abspath(path)).split("/") if n]
    fds = [os.open("/", os.O_RDONLY | _DIRECTORY | _CLOEXEC)]
    shown: list[str] = []
    hops = 0
    through, after = "", -1  # the last symlink followed, and the names left after it
    try:
        while names:
            name = names.pop(0)
            if name == ".":
                continue
            if name == "..":
                if len(fds) > 1:
                    os.close(fds.pop())
                    shown.pop()
                continue
            parent = fds[-1]
            where = "/" + "/".join([*shown, name])
            st = _stat_or_make(name, parent, create)
            why = replaceable(st, os.fstat(parent), me)
            if stat.S_ISLNK(st.st_mode):
                if why:
                    raise RunDirError(
                        f"{where} is a symlink that {why}; nnwatch does not follow it, so that "
                        "nobody can redirect the run's files: give the real path of a directory "
                        "of your own"
                    )
                through, after = where, len(names)  # named if what it leads to is refused
                hops += 1
                if hops > 40:
                    raise RunDirError(f"{path} has too many levels of symlinks")
                names = _link_names(name, parent, fds, shown) + names
                continue
            link = through if through and len(names) == after else ""
            _enter_dir(name, parent, st, where, why, link, fds, shown)
        last = os.fstat(fds[-1])
        if len(fds) > 1 and last.st_uid != me:
            raise RunDirError(
                f"{path} belongs to uid {last.st_uid}, not to you (uid {me}); nnwatch will not "
                "write into another user's directory: choose a run_dir of your own"
            )
        return fds.pop()
    finally:
        for fd in fds:
            os.close(fd)


def _stat_or_make(name: str, parent: int, create: bool) -> os.stat_result:
    """The entry ``name`` of directory ``parent``, not followed; made first (0700) when it is
    missing and ``create`` says so."""
    try:
        return os.stat(name, dir_fd=parent, follow_symlinks=False)
    except FileNotFoundError:
        if not create:
            raise
        try:
            os.mkdir(name, 0o700, dir_fd=parent)
        except FileExistsError:
            pass  # raced with someone: what is there now is judged by the caller
        return os.stat(name, dir_fd=parent, follow_symlinks=False)


def _link_names(name: str, parent: int, fds: list[int], shown: list[str]) -> list[str]:
    """The names symlink ``name`` of ``parent`` leads to, to walk in its place; an absolute
    target starts the walk again from ``/`` (every directory but the root is closed)."""
    target = os.readlink(name, dir_fd=parent)
    if target.startswith("/"):
        while len(fds) > 1:
            os.close(fds.pop())
        shown.clear()
    return [n for n in target.split("/") if n]


def _enter_dir(
    name: str,
    parent: int,
    st: os.stat_result,
    where: str,
    why: str | None,
    link: str,
    fds: list[int],
    shown: list[str],
) -> None:
    """Open directory ``name`` of ``parent`` onto ``fds`` when it may be entered: a directory
    nobody else could have put there or replace (``why``), and the very entry that was judged,
    not one swapped in since. ``link``: the symlink that led here, named when it is refused."""
    if not stat.S_ISDIR(st.st_mode):
        if link:  # name the symlink, not only its target
            raise RunDirError(f"{link} is a symlink to {where}, which is not a directory")
        raise RunDirError(f"{where} exists and is not a directory")
    if why:
        raise RunDirError(
            f"{where} {why}; nnwatch will not write below it, since its contents could "
            "be swapped under a running trainer: choose a run_dir of your own"
        )
    fd = os.open(name, os.O_RDONLY | _DIRECTORY | _NOFOLLOW | _CLOEXEC, dir_fd=parent)
    got = os.fstat(fd)
    fds.append(fd)
    shown.append(name)
    if (got.st_dev, got.st_ino) != (st.st_dev, st.st_ino):
        raise RunDirError(f"{where} was replaced while nnwatch opened it")


# -- pinned directories: a run's files opened through one descriptor -----------------------------

_PINNED: dict[str, int] = {}
_PIN_LOCK = threading.Lock()


def pin_dir(path: str | os.PathLike[str]) -> str:
    """Open ``path`` once (see :func:`open_dir_nofollow`) and open every later file under it
    through that descriptor, until :func:`unpin_dir`; returns the key to unpin with. Pinning a
    directory twice holds the first descriptor."""
    key = os.path.abspath(os.fspath(path))
    fd = open_dir_nofollow(key)
    with _PIN_LOCK:
        if key in _PINNED:
            os.close(fd)
        else:
            _PINNED[key] = fd
    return key


def unpin_dir(key: str) -> None:
    """Forget a pinned directory and close its descriptor (after its last file was written)."""
    with _PIN_LOCK:
        fd = _PINNED.pop(key, None)
    if fd is not None:
        os.close(fd)


def pinned(path: str | os.PathLike[str]) -> tuple[int | None, str]:
    """(directory descriptor, path relative to it) for a path under a pinned directory, else
    (None, the path): what every opener here passes to ``os.open(..., dir_fd=...)``."""
    text = os.path.abspath(os.fspath(path))
    best = ""
    for key in list(_PINNED):
        if (text == key or text.startswith(key.rstrip("/") + "/")) and len(key) > len(best):
            best = key
    fd = _PINNED.get(best) if best else None
    if fd is None:
        return None, os.fspath(path)
    rel = os.path.relpath(text, best)
    return fd, rel


def open_in_dir(path: str | os.PathLike[str], flags: int, mode: int = 0o600) -> int:
    """``os.open`` that goes through the pinned run directory when ``path`` lies under one."""
    fd, rel = pinned(path)
    return os.open(rel, flags, mode, dir_fd=fd)


def unlink_file(path: str | os.PathLike[str]) -> None:
    """``os.unlink`` through the pinned run directory when ``path`` lies under one."""
    fd, rel = pinned(path)
    os.unlink(rel, dir_fd=fd)


def rename_file(src: str | os.PathLike[str], dst: str | os.PathLike[str]) -> None:
    """``os.replace`` through the pinned run directory (both paths under the same one)."""
    sfd, srel = pinned(src)
    dfd, drel = pinned(dst)
    os.replace(srel, drel, src_dir_fd=sfd, dst_dir_fd=dfd)


def make_dir(path: str | os.PathLike[str], mode: int = 0o700) -> None:
    """``os.mkdir`` through the pinned run directory when ``path`` lies under one."""
    fd, rel = pinned(path)
    os.mkdir(rel, mode, dir_fd=fd)


def open_for_append(path: Path, mode: int = 0o600) -> int:
    """Open (creating if needed) a regular file of ours for appending, never through a symlink."""
    fd = open_in_dir(
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
    return open_in_dir(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | _NOFOLLOW | _CLOEXEC, mode)


def _check_own_regular(fd: int, path: Path) -> os.stat_result:
    st = os.fstat(fd)
    if not stat.S_ISREG(st.st_mode):
        raise UnsafeFileError(errno.EINVAL, f"{path} is not a regular file")
    if st.st_uid != os.getuid():
        raise UnsafeFileError(errno.EPERM, f"{path} belongs to uid {st.st_uid}, not to you")
    return st


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
        rename_file(tmp, path)
    except BaseException:
        try:
            unlink_file(tmp)
        except OSError:
            pass
        raise
