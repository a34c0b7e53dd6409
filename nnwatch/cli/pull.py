"""``nnwatch pull HOST:RUN [STEP]``: copy a snapshot, or with ``--run`` a whole run, from another
machine to this one, through the user's own ``ssh`` and checked file by file.

The far host runs ``nnwatch pack`` (one ssh login: RUN is found there as ``nnwatch ls --all``
names it) and sends a tar framed by a header and a manifest of sha256s; every size and hash is
checked here before anything appears at the destination (``nnwatch.export.bundle``). STEP is the
snapshot of that step (``--nearest``: the closest one); without it, the newest snapshot. Files
land in ``./nnwatch-pulled/HOST/RUN`` (``--into DIR`` instead): a snapshot at
``RUN/snapshots/step-N`` (``nnwatch show`` and ``nnwatch replay`` take it), a run as a run
directory (``nnwatch open`` takes it). A live run is copied as its files stand while it writes.

Exit status: 0 pulled; 1 the host could not be reached or nnwatch there failed; 3 no such run
there; 4 no such snapshot; 5 the stream arrived damaged or cut short; 6 the files cannot be
written here (a full disk, permissions, the destination exists). Nothing is left at the
destination unless the status is 0.
"""

from __future__ import annotations

import argparse
import re
import shlex
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import IO, Any

COMMAND = "pull"
HELP = "copy a snapshot (or a whole run) from another host over ssh, checked by sha256"

EXIT_UNREACHABLE = 1
EXIT_NO_RUN = 3
EXIT_NO_SNAPSHOT = 4
EXIT_DAMAGED = 5
EXIT_CANNOT_WRITE = 6
#: How long ssh may take to end once the stream is over (or was refused) before it is stopped.
SSH_EXIT_WAIT = 10.0
_SNAPSHOT_NAME = re.compile(r"step-\d+(\.\d+)?")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    from nnwatch.cli.attach import add_ssh_arguments

    parser.add_argument(
        "run", metavar="HOST:RUN",
        help="the host and the run there (name or its start, pid or run directory; HOST: for the "
        "only run)",
    )  # fmt: skip
    parser.add_argument(
        "step", metavar="STEP", nargs="?", type=int, default=None,
        help="the snapshot of this step (default: the newest snapshot)",
    )  # fmt: skip
    parser.add_argument(
        "--nearest", action="store_true", help="without a snapshot at STEP, take the closest one"
    )
    parser.add_argument(
        "--run", dest="whole", action="store_true",
        help="copy the whole run directory (log, events, every snapshot), not one snapshot",
    )  # fmt: skip
    parser.add_argument(
        "--into", metavar="DIR", type=Path, default=None,
        help="the local run directory to fill (default: ./nnwatch-pulled/HOST/RUN)",
    )  # fmt: skip
    parser.add_argument(
        "--force", action="store_true", help="replace what an earlier pull left at the destination"
    )
    add_ssh_arguments(parser)


def _split(spec: str) -> tuple[str, str] | None:
    host, sep, run_spec = spec.partition(":")
    if not sep or not host or "/" in host:
        return None
    return host, run_spec


def _component(text: str, fallback: str) -> str:
    """A safe single directory name made of ``text`` (a host or run name from far away)."""
    clean = re.sub(r"[^A-Za-z0-9._@+-]", "_", text).lstrip(".")
    return clean or fallback


def _superseded(local: Path, coming: Any) -> bool:
    """Whether every file under ``local`` comes again in this pull (a run pulled after some of
    its snapshots were): then replacing it loses nothing, and needs no --force."""
    from nnwatch.export.bundle import list_files

    if not isinstance(coming, list):
        return False
    files, skipped = list_files(local)
    return not skipped and set(files) <= {str(p) for p in coming}


def remote_command(args: argparse.Namespace, run_spec: str) -> str:
    """What ssh runs on the host: ``nnwatch pack`` with RUN and STEP quoted for its shell."""
    words = [args.remote_nnwatch, "pack", shlex.quote(run_spec)]
    if args.step is not None:
        words.append(str(int(args.step)))
    if args.nearest:
        words.append("--nearest")
    if args.whole:
        words.append("--run")
    return " ".join(words)


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


def _refused(host: str, rc: int, why: str, remote_nnwatch: str) -> tuple[int, str]:
    """The exit status and words for an ssh that ended without sending a bundle."""
    prefix = "nnwatch pack: "
    if rc in (EXIT_NO_RUN, EXIT_NO_SNAPSHOT) and why.startswith(prefix):
        return rc, f"on {host}: {why[len(prefix) :]}"
    if rc == 255:
        return EXIT_UNREACHABLE, f"cannot reach {host} with ssh: {why or 'ssh gave no reason'}"
    if rc == 127 or "not found" in why:
        return EXIT_UNREACHABLE, (
            f"`{remote_nnwatch}` cannot be run on {host} ({why or f'exit status {rc}'}); is "
            "nnwatch installed there? (--remote-nnwatch names the command to run)"
        )
    if "invalid choice: 'pack'" in why:
        return EXIT_UNREACHABLE, (
            f"the nnwatch on {host} is older than `nnwatch pack`; upgrade it there to pull"
        )
    return EXIT_UNREACHABLE, f"nnwatch on {host} failed: {why or f'exit status {rc}'}"


def _size(n: int) -> str:
    if n < 10 * 1024:
        return f"{n} bytes"
    if n < 10 * 1024 * 1024:
        return f"{n / 1024:.1f} KiB"
    return f"{n / 1024 / 1024:.1f} MiB"


def run(args: argparse.Namespace) -> int:
    from nnwatch.export.bundle import BundleError, receive_bundle
    from nnwatch.sources.remote import stop_process
    from nnwatch.store.paths import describe_os_error

    def fail(code: int, message: str) -> int:
        print(f"nnwatch pull: {message}", file=sys.stderr)
        return code

    remote = _split(args.run)
    if remote is None:
        return fail(2, f"{args.run!r} names no host: write HOST:RUN (HOST: for the only run there)")
    if args.whole and args.step is not None:
        return fail(2, "--run copies the whole run; give no STEP with it")
    host, run_spec = remote
    host_dir = _component(host.rpartition("@")[2], "host")
    places: dict[str, Path] = {}

    def target(header: dict[str, Any]) -> tuple[Path, bool]:
        run_dir = str(header.get("run_dir") or "")
        base = args.into or Path("nnwatch-pulled") / host_dir / _component(
            Path(run_dir).name or str(header.get("run") or ""), "run"
        )
        base = Path(base).expanduser().absolute()
        if header.get("kind") == "run":
            final = base
        elif header.get("kind") == "snapshot":
            name = str(header.get("name") or "")
            if not _SNAPSHOT_NAME.fullmatch(name):
                raise BundleError(f"the header names the snapshot {name!r}: refused")
            final = base / "snapshots" / name
        else:
            raise BundleError(f"the bundle is of an unknown kind {header.get('kind')!r}")
        replace = False
        if final.exists() or final.is_symlink():
            if final.is_symlink() or not final.is_dir():
                raise FileExistsError(f"{final} is there and is not a directory; not replaced")
            replace = args.force or _superseded(final, header.get("paths"))
            if not replace:
                raise FileExistsError(f"{final} is already there (--force replaces it)")
        places["final"] = final
        return final, replace

    cmd = [*shlex.split(args.ssh), *args.ssh_args, host, remote_command(args, run_spec)]
    with tempfile.TemporaryFile() as err:
        try:
            proc = subprocess.Popen(
                cmd, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=err
            )
        except FileNotFoundError:
            return fail(EXIT_UNREACHABLE, f"cannot run {cmd[0]!r}: is OpenSSH installed here?")
        assert proc.stdout is not None
        try:
            try:
                got = receive_bundle(proc.stdout, target)
            except BundleError as exc:
                rc = _ended(proc, 2.0 if exc.started else SSH_EXIT_WAIT)
                if not exc.started and rc not in (None, 0):
                    code, words = _refused(host, rc, _why(err), args.remote_nnwatch)
                    return fail(code, words)
                if rc not in (None, 0):  # ssh or the far side stopped in the middle
                    why = _why(err) or f"ssh ended with status {rc}"
                    return fail(
                        EXIT_UNREACHABLE,
                        f"the transfer from {host} stopped: {why}; nothing was written",
                    )
                return fail(
                    EXIT_DAMAGED,
                    f"the stream from {host} arrived damaged: {exc}; nothing was written "
                    "(pull again; if it fails again, the link or the host's disk alters data)",
                )
            except FileExistsError as exc:
                return fail(EXIT_CANNOT_WRITE, str(exc.strerror or exc))
            except OSError as exc:
                where = places.get("final")
                return fail(
                    EXIT_CANNOT_WRITE,
                    f"cannot write the files here: {describe_os_error(exc, where and where.parent)}; "
                    "nothing was written",
                )
            proc.stdout.read()  # the tar's end padding, so that ssh ends by itself
            _ended(proc, SSH_EXIT_WAIT)
        finally:
            stop_process(proc)
            proc.stdout.close()
    report(got, host)
    return 0


def report(got: Any, host: str) -> None:
    """Where the files came from (host-qualified) and where they are now."""
    h = got.header
    source = f"{host}:{h.get('source') or h.get('run_dir')}"
    what = f"run {h.get('run')}"
    if h.get("kind") == "snapshot":
        what = f"snapshot of step {h.get('step')} of {what}"
    asked = h.get("asked_step")
    if h.get("kind") == "snapshot" and asked is not None and asked != h.get("step"):
        what += f" (the closest to step {asked})"
    print(f"pulled the {what} from {source}")
    print(f"  {len(got.files)} files, {_size(got.bytes)}, every size and sha256 checked")
    for s in got.skipped:
        print(f"  left out: {s}")
    if h.get("live"):
        print(
            f"  the run is {h.get('state')} on {host}: these are its files as they stood while it "
            "wrote them; pull again once it ends for the rest"
        )
    print(f"  -> {got.path}")
    if h.get("kind") == "snapshot":
        print(f"inspect it: nnwatch show {shlex.quote(str(got.path))}")
    else:
        print(f"open it: nnwatch open {shlex.quote(str(got.path))}")
