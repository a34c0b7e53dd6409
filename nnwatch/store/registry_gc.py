"""Cleaning up after runs that are gone: their registry entries, sockets and rings (``nnwatch gc``).

:mod:`nnwatch.store.registry` only reads and judges runs; removing what a dead run left behind
is a separate, careful step, since an entry may name any path: a socket is removed only when it
is that run's own, in nnwatch's socket directory, and a ring is folded into its log only when
the process that writes it (as its own header names it) is gone.
"""

from __future__ import annotations

import os
import re
import stat
from pathlib import Path

from nnwatch.store.identity import pid_checkable, same_process, this_host
from nnwatch.store.paths import default_root, own_dir
from nnwatch.store.registry import FOREIGN_GONE_AFTER, RunInfo, list_runs, recorded_runs
from nnwatch.store.registry_entry import SOCKET_DIR, unregister
from nnwatch.store.ring_layout import ENDED, RingError
from nnwatch.store.ring_reader import RingReader
from nnwatch.store.run_reader import fold_ring_into_log
from nnwatch.store.runlog import RunLogError


def gc(
    root: Path | None = None, *, dry_run: bool = False, problems: list[str] | None = None
) -> list[RunInfo]:
    """Remove the entries (and sockets) of runs whose process is gone; return what was removed.

    Only entries from this host are judged: a pid means nothing on another machine, nor in another
    PID namespace (a container sharing /dev/shm), where the ring's heartbeat must have been
    silent for ``FOREIGN_GONE_AFTER`` seconds. An entry's socket is removed only when it lies in
    nnwatch's own socket directory and carries that entry's pid: an entry may name any path.
    Entries that cannot be read are left alone and named in ``problems``.
    """
    removed = []
    sockets = _socket_dirs(root)
    for info in list_runs(root, problems=problems):
        if info.host != this_host():
            continue
        if not pid_checkable(info.host, info.pid_ns):
            if info.ending is None and (
                info.heartbeat_age is None or info.heartbeat_age <= FOREIGN_GONE_AFTER
            ):
                if info.heartbeat_age is None and problems is not None:
                    problems.append(
                        f"kept {Path(info.entry_path).name}: its trainer runs in another PID "
                        "namespace and its ring cannot be read, so whether it lives cannot be told"
                    )
                continue
        elif same_process(info.pid, info.start_time):
            continue
        removed.append(info)
        if dry_run:
            continue
        unregister(Path(info.entry_path))
        if info.socket:
            why = _not_its_socket(info, sockets)
            if why is None:
                try:
                    os.unlink(info.socket)
                except OSError:
                    pass
            elif why and problems is not None:
                problems.append(f"left the socket {info.socket} that {Path(info.entry_path).name} named: {why}")
    return removed


def _socket_dirs(root: Path | None) -> set[str]:
    """The directories nnwatch makes its command sockets in (see :func:`socket_path`)."""
    base = Path(root) if root is not None else default_root()
    return {
        os.path.realpath(base / SOCKET_DIR),
        os.path.realpath(own_dir(Path("/tmp"), f"nnwatch-{os.getuid()}-s")),
    }


def _not_its_socket(info: RunInfo, dirs: set[str]) -> str | None:
    """None when ``info.socket`` is the dead run's own socket file, else why it is left alone
    ("" when it is simply gone already)."""
    path = Path(str(info.socket))
    if os.path.realpath(path.parent) not in dirs:
        return "it is not in nnwatch's socket directory"
    if not re.fullmatch(rf"{info.pid}(-n[0-9]+|-x[0-9a-f]+)?-r{info.rank}(-w[0-9]+)?\.sock", path.name):
        return "it is not named for that run's process"
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return ""
    except OSError as exc:
        return exc.strerror or str(exc)
    if not stat.S_ISSOCK(st.st_mode) or st.st_uid != os.getuid():
        return "it is not a socket of yours"
    return None


def ring_writer_lives(ring: str | Path) -> bool | None:
    """Whether the process that writes ``ring`` (as its own header names it) still runs: a dead
    entry may point at a live run's directory. None when the ring cannot be read."""
    try:
        with RingReader(Path(ring)) as reader:
            state = reader.state()
            host = reader.meta.host if reader.meta is not None else None
    except (RingError, OSError, ValueError):
        return None
    if state.status in ENDED:
        return False
    if pid_checkable(host, state.pid_ns):
        return same_process(state.pid, state.start_time)
    return state.heartbeat_age() <= FOREIGN_GONE_AFTER


def fold_dead_rings(
    root: Path | None = None, *, dry_run: bool = False, problems: list[str] | None = None
) -> list[tuple[str, int, str]]:
    """For every run of this host whose process is gone but whose ring file is still there (a
    crash, or a log that failed): move the steps only the ring holds into the log and remove the
    ring. Returns (run directory, steps recovered, what was done) per ring."""
    done: list[tuple[str, int, str]] = []
    seen: set[str] = set()
    for info in [*list_runs(root, problems=problems), *recorded_runs(root, problems=problems)]:
        key = os.path.realpath(info.run_dir)
        if key in seen or info.host != this_host() or info.alive is not False:
            continue
        seen.add(key)
        if not os.path.lexists(info.ring) or Path(info.ring).parent != Path(info.run_dir):
            continue
        writer = ring_writer_lives(info.ring)
        if writer:
            continue  # the ring's own writer runs: a dead entry pointed at a live run
        if dry_run:
            done.append((info.run_dir, 0, "would move the ring's steps into the log" if writer is False
                         else "would keep the ring: it cannot be read"))  # fmt: skip
            continue
        try:
            n, what = fold_ring_into_log(info.run_dir)
        except (RunLogError, OSError, ValueError) as exc:
            if problems is not None:
                problems.append(f"left the ring of {Path(info.run_dir).name}: {exc}")
            continue
        done.append((info.run_dir, n, what))
    return done
