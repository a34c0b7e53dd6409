"""Copy a snapshot, or a whole run, from another host through the user's own ``ssh``: what
``nnwatch pull HOST:RUN [STEP]`` and the monitor's pull key share.

The far host runs ``nnwatch pack`` (one ssh login; RUN is found there as ``nnwatch ls --all``
names it) and sends a tar framed by a header and a manifest of sha256s; every size and hash is
checked here before anything appears at the destination (``nnwatch.store.bundle``). Files land
in ``./nnwatch-pulled/HOST/RUN`` unless a directory is named: a snapshot at
``RUN/snapshots/step-N`` (``nnwatch show`` and ``nnwatch replay`` take it), a run as a run
directory (``nnwatch open`` takes it). Nothing is left at the destination when a pull fails.
"""

from __future__ import annotations

import re
import shlex
import subprocess
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

from nnwatch.sources.remote_command import explain_failure, remote_command
from nnwatch.sources.ssh_child import ssh_base, stop_process
from nnwatch.store.bundle import BundleError, Received, list_files, receive_bundle
from nnwatch.store.copy_note import COPY_FILE, write_copy_note
from nnwatch.store.disk_errors import describe_os_error
from nnwatch.store.paths import SNAPSHOTS_DIR

EXIT_UNREACHABLE = 1
EXIT_NO_RUN = 3
EXIT_NO_SNAPSHOT = 4
EXIT_DAMAGED = 5
EXIT_CANNOT_WRITE = 6
#: How long ssh may take to end once the stream is over (or was refused) before it is stopped.
SSH_EXIT_WAIT = 10.0
#: Where pulled files go when no directory is named (relative to the working directory).
PULLED_DIR = Path("nnwatch-pulled")
_SNAPSHOT_NAME = re.compile(r"step-\d+(\.\d+)?")


class PullError(Exception):
    """A pull that did not land; ``code`` is the exit status that says why (the EXIT_ names)."""

    def __init__(self, message: str, code: int) -> None:
        super().__init__(message)
        self.code = code


@dataclass(frozen=True)
class PullRequest:
    """What to copy from where, and how to reach it."""

    host: str
    run: str = ""
    step: int | None = None
    nearest: bool = False
    whole: bool = False
    into: Path | None = None
    force: bool = False
    ssh: str = "ssh"
    ssh_args: Sequence[str] = ()
    #: The command that runs nnwatch there; None: found from the host's runs (``remote_command``).
    remote_nnwatch: str | None = None
    #: The run root there, when it is not the default.
    root: str | None = None

    def remote_command(self) -> str:
        """What ssh runs on the host: ``nnwatch pack`` with RUN and STEP quoted for its shell."""
        words = ["pack", self.run]
        if self.step is not None:
            words.append(str(int(self.step)))
        if self.nearest:
            words.append("--nearest")
        if self.whole:
            words.append("--run")
        return remote_command(words, remote_nnwatch=self.remote_nnwatch, root=self.root)


def split_host_run(spec: str) -> tuple[str, str] | None:
    """``HOST:RUN`` (``HOST:`` for the only run there) as (host, run); None without a host."""
    host, sep, run_spec = spec.partition(":")
    if not sep or not host or "/" in host:
        return None
    return host, run_spec


def safe_name(text: str, fallback: str) -> str:
    """A safe single directory name made of ``text`` (a host or run name from far away)."""
    clean = re.sub(r"[^A-Za-z0-9._@+-]", "_", text).lstrip(".")
    return clean or fallback


def _superseded(local: Path, coming: Any) -> bool:
    """Whether every file under ``local`` comes again in this pull (a run pulled after some of
    its snapshots were): then replacing it loses nothing, and needs no ``force``."""
    if not isinstance(coming, list):
        return False
    files, skipped = list_files(local)
    ours = {COPY_FILE}  # written here by the pull before, not part of the run
    return not skipped and set(files) - ours <= {str(p) for p in coming}


def pulled_run_dir(host: str, run_dir: str, run: str = "") -> Path:
    """Where a run of ``host`` is copied when no directory is named: ``nnwatch-pulled/HOST/RUN``
    under the working directory (the user part of ``user@host`` left out)."""
    return (
        PULLED_DIR
        / safe_name(host.rpartition("@")[2], "host")
        / safe_name(Path(run_dir).name or run, "run")
    ).absolute()


def destination(req: PullRequest, header: dict[str, Any]) -> tuple[Path, bool]:
    """Where the bundle described by ``header`` goes, and whether what is there may be replaced;
    BundleError for a header that names something no pull writes, FileExistsError to refuse."""
    base = req.into or pulled_run_dir(
        req.host, str(header.get("run_dir") or ""), str(header.get("run") or "")
    )
    base = Path(base).expanduser().absolute()
    if header.get("kind") == "run":
        final = base
    elif header.get("kind") == "snapshot":
        name = str(header.get("name") or "")
        if not _SNAPSHOT_NAME.fullmatch(name):
            raise BundleError(f"the header names the snapshot {name!r}: refused")
        final = base / SNAPSHOTS_DIR / name
    else:
        raise BundleError(f"the bundle is of an unknown kind {header.get('kind')!r}")
    replace = False
    if final.exists() or final.is_symlink():
        if final.is_symlink() or not final.is_dir():
            raise FileExistsError(f"{final} is there and is not a directory; not replaced")
        replace = req.force or _superseded(final, header.get("paths"))
        if not replace:
            raise FileExistsError(f"{final} is already there (--force replaces it)")
    return final, replace


def _why(err: IO[bytes]) -> str:
    err.seek(0)
    lines = [x for x in err.read().decode(errors="replace").strip().splitlines() if x.strip()]
    return lines[-1].strip() if lines else ""


def _ended(proc: subprocess.Popen[bytes], wait: float) -> int | None:
    """ssh's exit status once it ended by itself within ``wait`` seconds; None if it did not."""
    try:
        return proc.wait(timeout=wait)
    except subprocess.TimeoutExpired:
        return None


def _refused(host: str, rc: int, why: str, remote_nnwatch: str | None) -> PullError:
    """Why an ssh that ended without sending a bundle sent nothing."""
    prefix = "nnwatch pack: "
    if rc in (EXIT_NO_RUN, EXIT_NO_SNAPSHOT) and why.startswith(prefix):
        return PullError(f"on {host}: {why[len(prefix) :]}", rc)
    if rc == 255:
        return PullError(
            f"cannot reach {host} with ssh: {why or 'ssh gave no reason'}", EXIT_UNREACHABLE
        )
    if rc == 127 or "not found" in why:
        return PullError(explain_failure(host, rc, why, remote_nnwatch), EXIT_UNREACHABLE)
    if "invalid choice: 'pack'" in why:
        return PullError(
            f"the nnwatch on {host} is older than `nnwatch pack`; upgrade it there to pull",
            EXIT_UNREACHABLE,
        )
    return PullError(f"nnwatch on {host} failed: {why or f'exit status {rc}'}", EXIT_UNREACHABLE)


def pull(req: PullRequest) -> Received:
    """Copy what ``req`` names to this machine, checked; PullError (with its exit status) when
    nothing landed."""
    if req.whole and req.step is not None:
        raise PullError("--run copies the whole run; give no STEP with it", 2)
    places: dict[str, Path] = {}

    def target(header: dict[str, Any]) -> tuple[Path, bool]:
        final, replace = destination(req, header)
        places["final"] = final
        return final, replace

    cmd = [*ssh_base(req.ssh, req.ssh_args), req.host, req.remote_command()]
    with tempfile.TemporaryFile() as err:
        try:
            proc = subprocess.Popen(
                cmd, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=err
            )
        except FileNotFoundError:
            raise PullError(
                f"cannot run {cmd[0]!r}: is OpenSSH installed here?", EXIT_UNREACHABLE
            ) from None
        assert proc.stdout is not None
        try:
            try:
                got = receive_bundle(proc.stdout, target)
            except BundleError as exc:
                raise _stream_failed(req, proc, err, exc) from None
            except FileExistsError as exc:
                raise PullError(str(exc.strerror or exc), EXIT_CANNOT_WRITE) from None
            except OSError as exc:
                where = places.get("final")
                raise PullError(
                    f"cannot write the files here: {describe_os_error(exc, where and where.parent)}"
                    "; nothing was written",
                    EXIT_CANNOT_WRITE,
                ) from None
            proc.stdout.read()  # the tar's end padding, so that ssh ends by itself
            _ended(proc, SSH_EXIT_WAIT)
        finally:
            stop_process(proc)
            proc.stdout.close()
    if got.header.get("kind") == "run":
        try:  # a copy: readers must not judge it by a pid on this machine
            write_copy_note(got.path, got.header, req.host.rpartition("@")[2])
        except OSError:
            pass  # the files landed; without the note they read as a run of this host
    return got


def _stream_failed(
    req: PullRequest, proc: subprocess.Popen[bytes], err: IO[bytes], exc: BundleError
) -> PullError:
    """Why the bundle did not arrive whole: ssh or the far side refused, stopped midway, or the
    stream came damaged."""
    rc = _ended(proc, 2.0 if exc.started else SSH_EXIT_WAIT)
    if not exc.started and rc not in (None, 0):
        return _refused(req.host, rc, _why(err), req.remote_nnwatch)
    if rc not in (None, 0):  # ssh or the far side stopped in the middle
        why = _why(err) or f"ssh ended with status {rc}"
        return PullError(
            f"the transfer from {req.host} stopped: {why}; nothing was written",
            EXIT_UNREACHABLE,
        )
    return PullError(
        f"the stream from {req.host} arrived damaged: {exc}; nothing was written "
        "(pull again; if it fails again, the link or the host's disk alters data)",
        EXIT_DAMAGED,
    )


def size_text(n: int) -> str:
    """A byte count as people read it."""
    if n < 10 * 1024:
        return f"{n} bytes"
    if n < 10 * 1024 * 1024:
        return f"{n / 1024:.1f} KiB"
    return f"{n / 1024 / 1024:.1f} MiB"


def describe(got: Received, host: str) -> list[str]:
    """Where the files came from (host-qualified) and where they are now, as lines to print."""
    h = got.header
    source = f"{host}:{h.get('source') or h.get('run_dir')}"
    what = f"run {h.get('run')}"
    if h.get("kind") == "snapshot":
        what = f"snapshot of step {h.get('step')} of {what}"
    asked = h.get("asked_step")
    if h.get("kind") == "snapshot" and asked is not None and asked != h.get("step"):
        what += f" (the closest to step {asked})"
    lines = [
        f"pulled the {what} from {source}",
        f"  {len(got.files)} files, {size_text(got.bytes)}, every size and sha256 checked",
    ]
    lines += [f"  left out: {s}" for s in got.skipped]
    if h.get("live"):
        lines.append(
            f"  the run is {h.get('state')} on {host}: these are its files as they stood while it "
            "wrote them; pull again once it ends for the rest"
        )
    lines.append(f"  -> {got.path}")
    if h.get("kind") == "snapshot":
        lines.append(f"inspect it: nnwatch show {shlex.quote(str(got.path))}")
    else:
        lines.append(f"open it: nnwatch open {shlex.quote(str(got.path))}")
    return lines
