"""The other ranks of this job on this node, watched so that a silent death gets its name.

A rank killed by SIGKILL (by hand, by the OOM killer) or by a segfault writes nothing: readers
find its process gone and can only say "vanished without a word". Its launcher knows better
(torchrun logs ``exitcode: -9``), but the launcher polls its workers only every 0.1 s, and until
it does, the dead rank is a zombie whose exit status ``/proc/PID/stat`` still holds.

So each rank of a distributed job watches its node-mates: a daemon thread holds a pidfd for each
(found in the registry: same host, same job), sleeps in ``poll()`` on them, and when one becomes
readable (that process just ended) reads its exit status at once and writes it into the mate's
run directory as ``exit.json`` (:mod:`nnwatch.store.exit_note`), unless the mate wrote its own
``end.json``. It costs one sleeping thread and one descriptor per mate; nothing runs on the
training thread, and nothing here can stop training. Linux only (``os.pidfd_open``); elsewhere
it does nothing.
"""

from __future__ import annotations

import json
import os
import select
import threading
import time
from pathlib import Path
from typing import Any

from nnwatch.store.exit_note import ending_for_status, write_exit_note
from nnwatch.store.identity import same_process, this_host
from nnwatch.store.jobs import read_job
from nnwatch.store.registry_entry import registry_dir, validate_entry
from nnwatch.store.safe_read import read_small_file

#: How often the registry is read again while mates are missing (ranks register at their first
#: step, a few seconds apart), and how often later (an elastic restart brings new mates).
RESCAN_S = 5.0
RESCAN_LATE_S = 60.0


def zombie_exit_status(pid: int) -> int | None:
    """The ``waitpid`` status of ``pid`` while it is a zombie (ended, not yet reaped), else None."""
    try:
        with open(f"/proc/{int(pid)}/stat", "rb") as fh:
            fields = fh.read().rsplit(b")", 1)[1].split()
    except (OSError, IndexError):
        return None
    if not fields or fields[0] != b"Z" or len(fields) < 50:
        return None
    try:
        return int(fields[-1])  # field 52, exit_code (Linux 3.5+)
    except ValueError:
        return None


class MateWatch:
    """Watches this node's other ranks of one job (see the module docstring)."""

    def __init__(self, *, rank: int, host: str, world_size: int, job_id: str, root: Path) -> None:
        self.rank, self.host, self.world_size, self.job_id = rank, host, world_size, job_id
        self.root = root
        self.local_world = _local_world(world_size)
        self._fds: dict[int, tuple[int, int, str]] = {}  # fd -> (pid, rank, run_dir)
        self._seen: set[int] = set()  # pids already watched (or ended)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="nnwatch-mates", daemon=True)
        self.noted: list[tuple[int, dict[str, Any]]] = []  # (rank, note): what this watch wrote

    def start(self) -> None:
        if hasattr(os, "pidfd_open"):
            self._thread.start()

    def _run(self) -> None:
        next_scan = 0.0
        try:
            while not self._stop.is_set():
                now = time.monotonic()
                if now >= next_scan:
                    self._scan()
                    full = len(self._seen) >= self.local_world - 1
                    next_scan = now + (RESCAN_LATE_S if full else RESCAN_S)
                self._wait(min(RESCAN_S, max(0.05, next_scan - time.monotonic())))
        except Exception:  # noqa: BLE001 - a help, never a reason to disturb training
            pass
        finally:
            for fd in list(self._fds):
                _close(fd)
            self._fds.clear()

    def _scan(self) -> None:
        """Open a pidfd for each mate not watched yet (same host, same job, another pid)."""
        try:
            paths = sorted(registry_dir(self.root).glob("*.json"))
        except OSError:
            return
        for path in paths:
            entry = _entry(path)
            if entry is None or int(entry["pid"]) in self._seen or entry.get("host") != self.host:
                continue
            pid, rank = int(entry["pid"]), int(entry.get("rank", -1))
            if pid == os.getpid() or rank == self.rank or entry.get("world_size") != self.world_size:
                continue
            job = read_job(str(entry["run_dir"])) or {}
            if job.get("id") != self.job_id or not same_process(pid, float(entry.get("start_time") or 0)):
                continue
            try:
                fd = os.pidfd_open(pid)
            except OSError:
                continue
            self._seen.add(pid)
            self._fds[fd] = (pid, rank, str(entry["run_dir"]))

    def _wait(self, timeout: float) -> None:
        if not self._fds:
            self._stop.wait(timeout)
            return
        poller = select.poll()
        for fd in self._fds:
            poller.register(fd, select.POLLIN)
        for fd, _ in poller.poll(timeout * 1000):
            pid, rank, run_dir = self._fds.pop(fd)
            status = zombie_exit_status(pid)
            _close(fd)
            if status is None:
                continue  # reaped before we looked: the reader's "vanished" stays
            fields = ending_for_status(status)
            if fields["status"] == "finished":
                continue
            if write_exit_note(run_dir, fields, f"rank {self.rank} (pid {os.getpid()}) on this node"):
                self.noted.append((rank, fields))

    def close(self) -> None:
        self._stop.set()
        if self._thread.is_alive() and self._thread is not threading.current_thread():
            self._thread.join(timeout=2)


def start_mate_watch(meta: Any, root: Path) -> MateWatch | None:
    """A running :class:`MateWatch` for a rank of a distributed job, else None."""
    job = (getattr(meta, "extra", None) or {}).get("job") or {}
    if int(getattr(meta, "world_size", 1) or 1) < 2 or not job.get("id") or _local_world(2) < 2:
        return None
    watch = MateWatch(rank=int(meta.rank), host=this_host(), world_size=int(meta.world_size),
                      job_id=str(job["id"]), root=root)  # fmt: skip
    watch.start()
    return watch


def _local_world(default: int) -> int:
    try:
        return int(os.environ.get("LOCAL_WORLD_SIZE", default))
    except ValueError:
        return default


def _entry(path: Path) -> dict[str, Any] | None:
    try:
        return validate_entry(json.loads(read_small_file(path, limit=1024 * 1024)))
    except (OSError, ValueError, RecursionError):
        return None


def _close(fd: int) -> None:
    try:
        os.close(fd)
    except OSError:
        pass
