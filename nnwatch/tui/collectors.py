"""The monitor's background threads: one polls the run, one samples NVML and psutil, and for a
rank of a distributed job one more follows every rank of that job (``RankCollector``).

They are plain daemon threads rather than Textual thread workers on purpose: a source blocked in
a system call (a hung NFS read, a socket to a frozen trainer) must never keep the monitor from
quitting, and daemon threads do not hold the interpreter open. They share data through
``RunState`` (under its lock) and tell the UI what happened with ``post`` (``App.post_message``,
which is thread-safe).
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

from textual.message import Message

from nnwatch.sources.base import CommandReply, RunSource, SourceError, SourceUpdate
from nnwatch.sources.hardware import Hardware, HardwareReading
from nnwatch.sources.job_monitor import JobMonitor
from nnwatch.store.jobs import Job, group_jobs, run_info_from_dir
from nnwatch.store.registry import inspect_dir, list_runs, recorded_runs
from nnwatch.tui.messages import (
    CommandFinished,
    HardwareSampled,
    RanksUpdated,
    ReaderFailed,
    ReaderRecovered,
    RecordsArrived,
    RunLost,
    RunStateChanged,
    SnapshotWritten,
)
from nnwatch.tui.model import INGEST_CHUNK, RunState

Post = Callable[[Message], Any]


def describe(exc: BaseException) -> str:
    """An exception as one line for the screen: ``IndexError: index 0 is out of bounds ...``."""
    text = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


class _Loop:
    """A daemon thread that calls ``tick`` every ``interval`` seconds until stopped.

    An exception from ``tick`` never ends the thread silently: it is posted as ``ReaderFailed``
    (once per run of failures; ``ReaderRecovered`` after the next clean round), and the loop tries
    again every ``retry_interval`` seconds. A reader thread that died would leave the screen on
    its last picture, or on CONNECTING, with no word of why.
    """

    name = "nnwatch-loop"
    what = "reader"  # how the screen names this thread when it fails

    def __init__(
        self, interval: float, post: Post | None = None, retry_interval: float = 1.0
    ) -> None:
        self.interval = interval
        self.retry_interval = retry_interval
        self._post = post
        self.broken = False  # the last round raised
        self.failures = 0  # rounds that raised, for tests and the curious
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name=self.name, daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()

    def join(self, timeout: float | None = None) -> None:
        if self._thread.is_alive():
            self._thread.join(timeout)

    @property
    def stopped(self) -> bool:
        return self._stop.is_set()

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                busy = self.tick()
            except Exception as exc:  # noqa: BLE001 - shown on screen, never a silent death
                self.failures += 1
                if not self.broken:
                    self.broken = True
                    self._tell(ReaderFailed(self.what, describe(exc)))
                self._stop.wait(self.retry_interval)
                continue
            if self.broken:
                self.broken = False
                self._tell(ReaderRecovered(self.what))
            if not busy:
                self._stop.wait(self.interval)

    def _tell(self, message: Message) -> None:
        if self._post is None:
            return
        try:
            self._post(message)
        except Exception:  # noqa: BLE001 - the app is gone: nobody left to tell
            pass

    def tick(self) -> bool:  # pragma: no cover - subclasses implement it
        """Do one round; return True to go again at once (more data is waiting)."""
        return False


class SourceCollector(_Loop):
    """Polls the source, feeds ``RunState``, and posts what changed.

    Any exception from the source (a ``SourceError`` or a bug in a source) marks the run lost
    and is retried every ``retry_interval``: the monitor keeps its history and stays responsive.
    An exception while taking the data in (a reader bug) is posted as ``ReaderFailed`` (see
    ``_Loop``), so the screen says "reader failed: ..." instead of waiting for ever.
    """

    name = "nnwatch-source"

    def __init__(
        self,
        source: RunSource,
        state: RunState,
        post: Post,
        interval: float,
        retry_interval: float = 1.0,
    ) -> None:
        super().__init__(interval, post, retry_interval)
        self.source = source
        self.state = state
        self.post = post
        self.polls = 0
        self.ingested = 0  # polls fully taken in: polls > ingested while one is half-way
        self.failing = False
        self._source_lock = threading.Lock()  # poll, reconnect and commands never overlap

    def tick(self) -> bool:
        try:
            with self._source_lock:
                update = self.source.poll()
        except Exception as exc:  # noqa: BLE001 - a failing source must not kill the monitor
            message = str(exc) if isinstance(exc, SourceError) else f"{type(exc).__name__}: {exc}"
            if not self.failing:
                before = self.state.mark_lost(message)
                self.post(RunLost(message))
                self.post(RunStateChanged("lost", before, message))
            self.failing = True
            self._stop.wait(self.retry_interval)
            return False
        self.polls += 1
        self.failing = False
        try:
            return self._take_in(update)
        finally:
            self.ingested = self.polls  # taken in, or failed (posted as ReaderFailed by the loop)

    def _take_in(self, update: SourceUpdate) -> bool:
        got = self.state.ingest(update)
        more = got.rows >= INGEST_CHUNK
        if got.panes:
            last = self.state.history.last_step
            self.post(RecordsArrived(got.rows, int(last) if last == last else -1, got.panes, more))
        if got.state_after != got.state_before:
            self.post(RunStateChanged(got.state_after, got.state_before, update.status.message))
        for snap in got.snapshots:
            self.post(SnapshotWritten(snap.step, snap.path, snap.reason))
        return more

    @property
    def caught_up(self) -> bool:
        """No poll half taken in (its rows counted, its layers, events or state not yet): a
        headless test draws the screen only then."""
        polls = self.polls  # read first: a poll that starts after this is not half-way yet
        return self.ingested >= polls

    def redirect(self, post: Post) -> None:
        """Post to ``post`` from now on: the run went from overlay to main run, or back."""
        self.post = post
        self._post = post

    def command(self, name: str, args: dict[str, Any]) -> None:
        """Send one command in its own thread; the answer comes back as ``CommandFinished``."""

        def run() -> None:
            try:
                reply = self.source.command(name, **args)
            except Exception as exc:  # noqa: BLE001 - reported to the user, never raised
                reply = CommandReply(False, error=str(exc) or type(exc).__name__)
            self.post(CommandFinished(name, tuple(sorted(args.items())), reply))

        threading.Thread(target=run, name=f"nnwatch-cmd-{name}", daemon=True).start()

    def reconnect(self, done: Callable[[bool, str], None]) -> None:
        def run() -> None:
            try:
                with self._source_lock:
                    self.source.reconnect()
                self.failing = False
                done(True, "")
            except Exception as exc:  # noqa: BLE001
                done(False, str(exc) or type(exc).__name__)

        threading.Thread(target=run, name="nnwatch-reconnect", daemon=True).start()


class HardwareSampler(_Loop):
    """Reads NVML and psutil about once a second; NVML is opened in this thread, not the UI's."""

    name = "nnwatch-hardware"
    what = "hardware reader"

    def __init__(
        self,
        state: RunState,
        post: Post,
        interval: float = 1.0,
        reader: Callable[[], HardwareReading] | None = None,
        use_nvml: bool = True,
    ) -> None:
        super().__init__(interval, post)
        self.state = state
        self.post = post
        self.use_nvml = use_nvml
        self._reader = reader
        self._hardware: Hardware | None = None

    def tick(self) -> bool:
        if self._reader is None:
            self._hardware = Hardware(use_nvml=self.use_nvml)
            self._reader = self._hardware.read
        reading = self._reader()  # Hardware.read never raises; a custom one might (see _Loop)
        self.state.set_hardware(reading)
        self.post(HardwareSampled(reading))
        return False

    def _run(self) -> None:
        try:
            super()._run()
        finally:
            if self._hardware is not None:
                self._hardware.close()


def _ended_runs_near(run_dir: str, root: Path | None) -> list[Any]:
    """Runs without a registry entry (ended, or copied here) under the root and beside
    ``run_dir``: where the other ranks of its job are when they ended on this host."""
    out: list[Any] = []
    try:
        out += recorded_runs(root, problems=[])
    except OSError:
        pass
    parent = Path(run_dir).parent
    for meta in sorted(parent.glob("*/meta.json"))[:512]:
        if meta.parent == Path(run_dir):
            continue
        try:
            info = inspect_dir(meta.parent)
        except Exception:  # noqa: BLE001 - one unreadable directory must not hide the others
            continue
        if info is not None:
            out.append(info)
    return out


class JobViewCollector(_Loop):
    """Posts ``RanksUpdated`` with the job views ``poll`` returns: a rank's dashboard opened from
    the job view (``attach --job``) shows the same ranks as the job view, from the same source."""

    name = "nnwatch-ranks"
    what = "ranks reader"
    job: Job | None = None  # no local job: ranks are switched from the job view

    def __init__(self, poll: Callable[[], Any], post: Post, interval: float = 1.0) -> None:
        super().__init__(interval, post)
        self.poll = poll
        self.post = post

    def tick(self) -> bool:
        view = self.poll()
        if view is not None:
            self.post(RanksUpdated(view))
        return False


class RankCollector(_Loop):
    """Follows every rank of the job that ``run_dir`` belongs to; posts ``RanksUpdated`` each poll.

    The job is found from the registry (``list_runs``) in this thread, never in the UI's, and is
    looked up again every ``regroup_every`` polls while ranks are still missing: ranks register
    when they take their first step, which need not be at the same time. ``job`` (the latest
    ``Job``) is read by the UI thread to switch ranks; it is replaced, never mutated.
    """

    name = "nnwatch-ranks"
    what = "ranks reader"

    def __init__(
        self,
        run_dir: str,
        post: Post,
        interval: float = 1.0,
        *,
        job: Job | None = None,
        root: Path | None = None,
        regroup_every: int = 3,
    ) -> None:
        super().__init__(interval, post)
        self.run_dir = run_dir
        self.post = post
        self.job = job
        self.root = root
        self.regroup_every = max(1, regroup_every)
        self.polls = 0
        self._monitor: JobMonitor | None = JobMonitor(job) if job is not None else None

    def _find_job(self) -> Job | None:
        here = os.path.realpath(self.run_dir)
        try:
            runs = list_runs(self.root)
        except Exception:  # noqa: BLE001 - an unreadable registry leaves the job as it was
            return self.job
        if not any(os.path.realpath(r.run_dir) == here for r in runs):
            try:
                runs.append(run_info_from_dir(self.run_dir))  # finished, or not registered here
            except Exception:  # noqa: BLE001
                return self.job
        found = self._job_of(runs, here)
        if found is not None and found.missing:
            # ranks that ended (their registry entries gone) are still this host's ranks, not
            # "other node": their run directories are found beside this one or under the root
            seen = {os.path.realpath(r.run_dir) for r in runs}
            runs += [r for r in _ended_runs_near(self.run_dir, self.root)
                     if os.path.realpath(r.run_dir) not in seen]  # fmt: skip
            found = self._job_of(runs, here)
        return found or self.job

    @staticmethod
    def _job_of(runs: list[Any], here: str) -> Job | None:
        for job in group_jobs(runs):
            if any(os.path.realpath(r.run_dir) == here for r in job.runs):
                return job
        return None

    def tick(self) -> bool:
        job = self.job
        if job is None or (job.missing and self.polls % self.regroup_every == 0):
            found = self._find_job()
            if found is not None and (job is None or found.ranks != job.ranks):
                if self._monitor is not None:
                    self._monitor.close()
                self.job, self._monitor = found, JobMonitor(found)
        self.polls += 1
        if self._monitor is None:
            return False
        view = self._monitor.poll()  # an error is shown and retried (see _Loop), never fatal
        self.post(RanksUpdated(view))
        return False

    def _run(self) -> None:
        try:
            super()._run()
        finally:
            if self._monitor is not None:
                self._monitor.close()
