"""A run's files, or one snapshot's, as one checked stream: what ``nnwatch pull`` copies over ssh.

The stream is a plain tar (``nnwatch pack RUN > run.tar`` gives a file ``tar x`` reads), framed by
two members of its own: ``.nnwatch-bundle/header.json`` first (what this is, where it lies on its
host, which files and how many bytes follow) and ``.nnwatch-bundle/manifest.json`` last (every file's size and
sha256, computed over the very bytes that were sent). The manifest comes last because a live run's
files grow while they are read: hashes taken in a first pass would call a healthy copy corrupt.
A file is sent as it was when opened (its size then), never through a symlink, and only when it
is a regular file; sockets, symlinks and the hidden temporary files of writes in progress are
left out and named in the header.

The receiver writes into a hidden directory beside the destination, creating plain files only
(no links, no device, no name that climbs out), checks every size and hash and that nothing is
missing or extra, and only then renames the directory into place: a damaged, cut or full-disk
transfer leaves nothing at the destination.
"""

from __future__ import annotations

import errno
import hashlib
import io
import json
import os
import shutil
import stat
import tarfile
import tempfile
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import IO, Any

from nnwatch.store.disk_errors import free_bytes
from nnwatch.store.paths import create_exclusive
from nnwatch.store.safe_read import open_regular

FORMAT = 1
CONTROL_DIR = ".nnwatch-bundle"
HEADER = f"{CONTROL_DIR}/header.json"
MANIFEST = f"{CONTROL_DIR}/manifest.json"
#: Largest header or manifest a receiver reads (a run has tens of files, a manifest a few KB).
MAX_CONTROL = 16 * 1024 * 1024
CHUNK = 1 << 20


class BundleError(Exception):
    """The stream is damaged, cut short or not a bundle; the message names the file.
    ``started``: the header had arrived (so the sender was sending, and the fault is in transit)."""

    def __init__(self, message: str, *, started: bool = True) -> None:
        super().__init__(message)
        self.started = started


@dataclass(frozen=True)
class PackedFile:
    """One file as it was sent: its path inside the bundle, its size and its sha256."""

    path: str
    size: int
    sha256: str


@dataclass
class Received:
    """A bundle written in place: the header, the files checked, and where they now lie."""

    header: dict[str, Any]
    files: list[PackedFile]
    path: Path
    skipped: list[str] = field(default_factory=list)

    @property
    def bytes(self) -> int:
        return sum(f.size for f in self.files)


# ------------------------------------------------------------------------------------------------
# sending


def list_files(root: Path) -> tuple[list[str], list[str]]:
    """The regular files under ``root`` (relative, sorted), and what was left out, in words.
    Nothing is followed: a symlink is named and skipped, like a socket or a FIFO."""
    files: list[str] = []
    skipped: list[str] = []

    def walk(d: Path, prefix: str) -> None:
        with os.scandir(d) as it:
            entries = sorted(it, key=lambda e: e.name)
        for e in entries:
            rel = f"{prefix}{e.name}"
            if e.name.startswith("."):
                skipped.append(f"{rel} (a temporary file of a write in progress)")
            elif e.is_symlink():
                skipped.append(f"{rel} (a symlink, not followed)")
            elif e.is_dir(follow_symlinks=False):
                walk(Path(e.path), f"{rel}/")
            elif e.is_file(follow_symlinks=False):
                files.append(rel)
            else:
                skipped.append(f"{rel} (not a regular file: a socket or a pipe)")

    walk(root, "")
    return files, skipped


class _HashingReader:
    """Reads at most ``size`` bytes of a file for tarfile, hashing what it hands over."""

    def __init__(self, fh: IO[bytes], size: int) -> None:
        self.fh, self.left, self.hash = fh, size, hashlib.sha256()

    def read(self, n: int = -1) -> bytes:
        want = self.left if n < 0 else min(n, self.left)
        data = self.fh.read(want) if want > 0 else b""
        self.left -= len(data)
        self.hash.update(data)
        return data


def _add_bytes(tar: tarfile.TarFile, name: str, data: bytes) -> None:
    info = tarfile.TarInfo(name)
    info.size, info.mode = len(data), 0o600
    tar.addfile(info, io.BytesIO(data))


def write_bundle(
    out: IO[bytes], root: Path, header: dict[str, Any], leave_out: dict[str, str] | None = None
) -> list[PackedFile]:
    """Send the regular files under ``root`` to ``out`` as a bundle; returns what was sent.
    ``leave_out`` names files not to send, with why (they are listed as skipped).
    Raises OSError when a file cannot be read (the stream is then left without its manifest, which
    the receiver reports as cut short)."""
    root = Path(root)
    files, skipped = list_files(root)
    for rel, why in (leave_out or {}).items():
        if rel in files:
            files.remove(rel)
            skipped.append(f"{rel} ({why})")
    total = 0
    for rel in files:
        try:
            total += os.lstat(root / rel).st_size
        except FileNotFoundError:
            pass
    head = {
        **header, "format": FORMAT, "files": len(files), "paths": files, "bytes": total,
        "skipped": skipped,
    }  # fmt: skip
    head_bytes = json.dumps(head, indent=1, sort_keys=True).encode()
    packed: list[PackedFile] = []
    with tarfile.open(fileobj=out, mode="w|", format=tarfile.PAX_FORMAT) as tar:
        _add_bytes(tar, HEADER, head_bytes)
        for rel in files:
            try:
                fd = open_regular(root / rel)
            except FileNotFoundError:
                skipped.append(f"{rel} (removed while the bundle was sent)")
                continue
            with os.fdopen(fd, "rb") as fh:
                st = os.fstat(fd)
                info = tarfile.TarInfo(rel)
                info.size, info.mode, info.mtime = st.st_size, 0o600, int(st.st_mtime)
                reader = _HashingReader(fh, st.st_size)
                try:
                    tar.addfile(info, reader)  # type: ignore[arg-type]
                except OSError as exc:
                    if reader.left:
                        raise OSError(
                            errno.EIO, f"{rel} shrank while it was being sent ({exc})"
                        ) from exc
                    raise
            packed.append(PackedFile(rel, st.st_size, reader.hash.hexdigest()))
        manifest = {
            "format": FORMAT,
            "header_sha256": hashlib.sha256(head_bytes).hexdigest(),
            "files": [asdict(p) for p in packed],
            "skipped": skipped,
        }
        _add_bytes(tar, MANIFEST, json.dumps(manifest, indent=1).encode())
    out.flush()
    return packed


# ------------------------------------------------------------------------------------------------
# receiving


def _read_control(
    tar: tarfile.TarFile, member: tarfile.TarInfo, what: str
) -> tuple[dict[str, Any], bytes]:
    if not member.isreg() or member.size > MAX_CONTROL:
        raise BundleError(f"the bundle's {what} is not a small plain file: the stream is damaged")
    fh = tar.extractfile(member)
    data = fh.read() if fh is not None else b""
    try:
        value = json.loads(data)
    except ValueError:
        raise BundleError(f"the bundle's {what} is not JSON: the stream is damaged") from None
    if not isinstance(value, dict):
        raise BundleError(f"the bundle's {what} is not a JSON object: the stream is damaged")
    return value, data


def safe_parts(name: str) -> list[str]:
    """The components of a member name, refused (ValueError) when it is absolute, climbs out with
    ``..``, or holds an empty, ``.`` or hidden component: a pull writes only inside its target."""
    if not name or name.startswith("/") or "\\" in name or "\0" in name:
        raise ValueError(name)
    parts = name.split("/")
    if any(p in ("", ".", "..") or p.startswith(".") for p in parts):
        raise ValueError(name)
    return parts


def _write_member(tar: tarfile.TarFile, member: tarfile.TarInfo, staging: Path) -> PackedFile:
    """Write one member as a new private file under ``staging``, hashing it on the way."""
    kind = "symlink" if member.issym() else "hard link" if member.islnk() else "special file"
    if not member.isreg():
        if member.isdir():
            raise BundleError(
                f"the stream holds a directory entry {member.name!r}, which a bundle never has"
            )
        raise BundleError(
            f"the stream holds a {kind} {member.name!r}: refused (a pull writes plain files only)"
        )
    try:
        parts = safe_parts(member.name)
        tarfile.data_filter(member, str(staging))  # the stdlib's own check, as a second opinion
    except (ValueError, tarfile.FilterError):
        raise BundleError(
            f"the stream names a file outside its folder ({member.name!r}): refused"
        ) from None
    d = staging
    for p in parts[:-1]:
        d = d / p
        try:
            os.mkdir(d, 0o700)
        except FileExistsError:
            if not stat.S_ISDIR(os.lstat(d).st_mode):
                raise BundleError(f"{member.name!r} lies under a file of the same bundle") from None
    src = tar.extractfile(member)
    assert src is not None
    digest = hashlib.sha256()
    size = 0
    try:
        fd = create_exclusive(d / parts[-1])
    except FileExistsError:
        raise BundleError(f"{member.name} appears twice in the stream") from None
    with os.fdopen(fd, "wb") as fh:
        while True:
            chunk = src.read(CHUNK)
            if not chunk:
                break
            digest.update(chunk)
            size += len(chunk)
            fh.write(chunk)
    os.utime(d / parts[-1], (member.mtime, member.mtime))  # "newest snapshot" goes by mtimes
    return PackedFile(member.name, size, digest.hexdigest())


def _date_dirs(d: Path) -> float:
    """Give each directory under ``d`` (and ``d``) the newest mtime of what it holds, as on the
    host, where a directory's mtime is when its last file was written; returns that time."""
    newest = 0.0
    with os.scandir(d) as it:
        for e in it:
            t = (
                _date_dirs(Path(e.path))
                if e.is_dir(follow_symlinks=False)
                else e.stat(follow_symlinks=False).st_mtime
            )
            newest = max(newest, t)
    if newest:
        os.utime(d, (newest, newest))
    return newest


def _check(manifest: dict[str, Any], head_bytes: bytes, got: dict[str, PackedFile]) -> None:
    """Every file the sender hashed arrived with its size and sha256, and nothing else did."""
    if manifest.get("header_sha256") != hashlib.sha256(head_bytes).hexdigest():
        raise BundleError("the bundle's header arrived damaged (its sha256 differs)")
    rows = manifest.get("files")
    if not isinstance(rows, list):
        raise BundleError("the bundle's manifest has no file list: the stream is damaged")
    want: dict[str, PackedFile] = {}
    for row in rows:
        try:
            p = PackedFile(str(row["path"]), int(row["size"]), str(row["sha256"]))
        except (KeyError, TypeError, ValueError):
            raise BundleError("the bundle's manifest is malformed: the stream is damaged") from None
        want[p.path] = p
    for path, w in want.items():
        g = got.get(path)
        if g is None:
            raise BundleError(f"{path} is missing from the stream")
        if g.size != w.size:
            raise BundleError(f"{path} arrived damaged: {g.size} bytes, the sender sent {w.size}")
        if g.sha256 != w.sha256:
            raise BundleError(
                f"{path} arrived damaged: its sha256 is {g.sha256[:16]}..., "
                f"the sender's {w.sha256[:16]}..."
            )
    extra = sorted(set(got) - set(want))
    if extra:
        raise BundleError(f"{extra[0]} arrived but the sender's manifest does not list it")


def receive_bundle(
    stream: IO[bytes],
    target: Callable[[dict[str, Any]], tuple[Path, bool]],
) -> Received:
    """Read a bundle from ``stream`` and put it, checked, where ``target(header)`` says: a path,
    and whether what is already there may be replaced (``target`` may raise to refuse it).

    Raises :class:`BundleError` for a damaged, cut or foreign stream and OSError when the files
    cannot be written here (a full disk); in both cases nothing is left at the destination, nor
    any directory this call created."""
    try:
        tar = tarfile.open(fileobj=stream, mode="r|")
    except tarfile.TarError as exc:
        raise BundleError(f"nothing usable arrived ({exc})", started=False) from None
    created: list[Path] = []
    staging: Path | None = None
    try:
        header, head_bytes = _read_header(tar)
        final, replace = target(header)
        _make_parents(final.parent, created)
        _check_room(header, final.parent)
        staging = Path(tempfile.mkdtemp(prefix=".nnwatch-pull-", dir=final.parent))
        got, manifest = _read_files(tar, staging)
        _check(manifest[0], head_bytes, got)
        _date_dirs(staging)
        _place(staging, final, replace=replace)
        staging = None
        skipped = manifest[0].get("skipped")
        return Received(
            header, list(got.values()), final,
            [str(s) for s in skipped] if isinstance(skipped, list) else [],
        )  # fmt: skip
    except BaseException:
        if staging is not None:
            shutil.rmtree(staging, ignore_errors=True)
        for d in reversed(created):
            try:
                os.rmdir(d)
            except OSError:
                break
        raise


def _read_header(tar: tarfile.TarFile) -> tuple[dict[str, Any], bytes]:
    """The bundle's header (and its bytes, which the manifest hashes): the stream's first
    member, of the format this nnwatch reads. Faults before it say the sender never started."""
    try:
        first = tar.next()
    except tarfile.TarError as exc:
        raise BundleError(f"the stream is damaged at its start ({exc})", started=False) from None
    if first is None or first.name != HEADER:
        raise BundleError("the stream is not an nnwatch bundle (no header first)", started=False)
    header, head_bytes = _read_control(tar, first, "header")
    if header.get("format") != FORMAT:
        raise BundleError(
            f"the bundle is of format {header.get('format')!r}; this nnwatch reads format "
            f"{FORMAT}: install the same nnwatch version on both machines"
        )
    return header, head_bytes


def _check_room(header: dict[str, Any], parent: Path) -> None:
    """Refuse up front (ENOSPC) a pull that the header says cannot fit, rather than fail at
    the disk's end half-way through."""
    need = int(header.get("bytes") or 0)
    free = free_bytes(parent)
    if free is not None and need > free:
        raise OSError(
            errno.ENOSPC,
            f"{need // 1024} KiB are to be pulled and {parent} has {free // 1024} KiB free",
        )


def _read_files(
    tar: tarfile.TarFile, staging: Path
) -> tuple[dict[str, PackedFile], tuple[dict[str, Any], bytes]]:
    """Write every file after the header into ``staging``, up to the manifest, which must come
    last: the files as they arrived, and the manifest (with its bytes)."""
    got: dict[str, PackedFile] = {}
    manifest: tuple[dict[str, Any], bytes] | None = None
    try:
        while (member := tar.next()) is not None:  # not `for`: it would yield the header again
            if manifest is not None:
                raise BundleError(f"the stream goes on after its manifest ({member.name!r})")
            if member.name == MANIFEST:
                manifest = _read_control(tar, member, "manifest")
                continue
            if member.name == HEADER:
                raise BundleError("the stream holds a second header: it is damaged")
            f = _write_member(tar, member, staging)
            got[f.path] = f
    except tarfile.TarError as exc:
        if "unexpected end of data" in str(exc):
            raise BundleError(
                f"the stream was cut short in the middle of a file, after {len(got)} whole file(s)"
            ) from None
        raise BundleError(f"the stream is damaged after {len(got)} file(s) ({exc})") from None
    if manifest is None:
        last = f" (the last whole file: {list(got)[-1]})" if got else ""
        raise BundleError(
            f"the stream ended before its manifest: it was cut short or damaged{last}"
        )
    return got, manifest


def _make_parents(d: Path, made: list[Path]) -> None:
    """``mkdir -p d`` (new directories private), adding the ones it creates to ``made``,
    outermost first, as it goes: a failure half-way still leaves a list to clean up."""
    missing: list[Path] = []
    p = d
    while not os.path.lexists(p):
        missing.append(p)
        p = p.parent
    for m in reversed(missing):
        os.mkdir(m, 0o700)
        made.append(m)
    if not d.is_dir() or d.is_symlink():
        raise OSError(errno.ENOTDIR, f"{d} is not a directory")


def _place(staging: Path, final: Path, *, replace: bool) -> None:
    """Rename the checked directory into place; an old one is only removed once the new is in."""
    old: Path | None = None
    if os.path.lexists(final):
        if not replace:
            raise FileExistsError(errno.EEXIST, f"{final} already exists (--force replaces it)")
        old = final.with_name(f".{final.name}.old-{os.getpid()}")
        os.rename(final, old)
    try:
        os.rename(staging, final)
    except BaseException:
        if old is not None:
            os.rename(old, final)
        raise
    if old is not None:
        if old.is_dir() and not old.is_symlink():
            shutil.rmtree(old, ignore_errors=True)
        else:
            old.unlink(missing_ok=True)
