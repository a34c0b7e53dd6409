"""The job summary: every rank's step, loss, grad norm, step time, non-finite count and memory,
gathered on rank 0 through the job's own process group, so that attaching to rank 0 shows the
whole job when the other nodes cannot be reached over SSH.

How, and why it never blocks a rank:

- Every ``every`` optimizer steps each rank fills its own row of a small int64 block
  (``world x FIELDS``; the float64 values are stored bit for bit, the other rows hold INT64_MIN)
  and launches one ``all_reduce(MAX, async_op=True)``: MAX over one real value and INT64_MIN
  returns the value exactly, so everyone gets every rank's row. It is launched from the same
  optimizer post-hook as the cross-rank consistency check, right after it, at optimizer-step
  counts every rank shares: both collectives are issued in the same order on every rank, always.
  The training thread only launches; it never waits for a result.
- A liveness beat goes through the job's key-value store, not a collective: a daemon thread on
  every rank sets its own key four times a second (step, host, pid). A rank that stops stepping
  keeps beating (it is waiting, or slow); one that died or is frozen stops. Rank 0's thread reads
  all beats in one ``multi_get``, reads the completed summaries, and writes ``job.json`` into its
  run directory (:mod:`nnwatch.store.jobs` reads it), so a collective that never completes
  because a rank is gone is reported, not waited for.
- At the end each rank writes how it ended into the store; rank 0 (however it ended)
  waits up to a second and a half for the others' ends or silences before its last ``job.json``,
  so the rank that died first is named even though rank 0 dies of it moments later.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import logging
import math
import os
import resource
import socket
import threading
import time
from collections import deque
from typing import TYPE_CHECKING, Any, Protocol, cast

import numpy as np
import torch

from nnwatch.probe.run_files import RunFiles
from nnwatch.store.jobs import JOB_SUMMARY_FIELDS, JOB_SUMMARY_FILE
from nnwatch.store.paths import write_private_file
from nnwatch.store.schema import FieldName

if TYPE_CHECKING:
    from pathlib import Path

    from nnwatch.store.schema import RunSchema


class SummaryOwner(Protocol):
    """What the job summary needs of the run: the step, and the tail of its records."""

    @property
    def step_index(self) -> int: ...

    @property
    def schema(self) -> RunSchema: ...

    @property
    def run_dir(self) -> Path | None: ...

    @property
    def files(self) -> RunFiles:
        """Where the last records are kept (``recent``, raw, and ``recent_records``)."""


log = logging.getLogger("nnwatch")

DEFAULT_EVERY = 0  # off unless asked for: watch(job_summary_every=N) or NNWATCH_JOB_SUMMARY_EVERY
#: How often each rank's beat thread sets its key (and rank 0 reads them all, and writes job.json).
BEAT_S = 0.25
#: Above this many ranks the beat slows in proportion, so the job's store sees at most about
#: 1,000 beats a second (1,024 ranks: a beat a second each, silence after 4 s).
BEAT_RANKS = 256
#: A rank whose beat did not change for this long is silent: dead, or stopped (SIGSTOP).
SILENT_S = 1.0
#: At a crash, how long rank 0 waits for the other ranks' ends (or silences) before its last word.
FINAL_WAIT_S = 1.5
#: At close, how long a summary collective still in flight is waited for.
CLOSE_WAIT_S = 2.0
INT64_MIN = torch.iinfo(torch.int64).min
F = len(JOB_SUMMARY_FIELDS)
_INDEX = {name: i for i, name in enumerate(JOB_SUMMARY_FIELDS)}
#: Records the row is made from: the last loss and grad norm, the median step time of these.
TAIL = 32


class JobSummary:
    """Owned by the :class:`~nnwatch.probe.consistency.ConsistencyCheck` that drives its slot."""

    def __init__(
        self, w: SummaryOwner, every: int, *, rank: int, world: int, group: Any = None,
        device: torch.device | None = None,
    ) -> None:
        import torch.distributed as dist

        self.w = w
        self.every = int(every)
        self.rank, self.world, self.group = rank, world, group
        self.beat_s = BEAT_S * max(1.0, world / BEAT_RANKS)
        self.silent_s = SILENT_S * self.beat_s / BEAT_S
        self.dist = dist
        self.store: Any = None
        self.prefix = ""
        self.launched = 0
        self.tables = 0  # summaries rank 0 has read back
        self.table: np.ndarray | None = None  # the latest complete table (world x F), rank 0
        self.table_step = -1
        self.table_at: float | None = None
        self._pending: deque[tuple[int, float, torch.Tensor, Any]] = deque()
        #: where the collective's buffer lives: the CPU for gloo, the GPU for NCCL
        self.device = device if device is not None else torch.device("cpu")
        self._copy: tuple[torch.Tensor, Any] | None = None  # a device table on its way to the host
        self._side: Any = None  # the CUDA stream those copies run on
        self._dtype: Any = None
        self._publishing = False
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._beats = 0
        self._seen: dict[int, dict[str, Any]] = {}  # rank 0: what it last saw of each rank
        self._lock = threading.Lock()
        self._ends_known = 0
        self.host = socket.gethostname()
        self.closed = False

    # -- setup (training thread) -----------------------------------------------------------------
    def register(self, store: Any, prefix: str) -> None:
        """Set this rank's first beat (before the rank counts itself in), start the beat thread."""
        self.store, self.prefix = store, prefix
        self._beat()
        self._thread = threading.Thread(target=self._run, name="nnwatch-job-beat", daemon=True)
        self._thread.start()

    def agreed(self) -> None:
        """Every rank takes part: rank 0 may now read the others' beats and publish."""
        self._publishing = self.rank == 0

    # -- the slot (training thread) --------------------------------------------------------------
    def launch(self, nonfinite: int, first_nonfinite: int) -> None:
        """Launch this rank's contribution. Never waits; every rank launches at the same counts.

        The row is filled on the host; on a GPU group (NCCL) it goes to the device with one
        non-blocking copy from pinned memory, so the training thread never syncs with the GPU."""
        if self.closed:
            return
        cuda = self.device.type == "cuda"
        try:
            host = torch.full((self.world * F,), INT64_MIN, dtype=torch.int64, pin_memory=cuda)
        except Exception:  # noqa: BLE001 - no pinned memory (memlock limits): a plain buffer
            host = torch.full((self.world * F,), INT64_MIN, dtype=torch.int64)
        try:
            row = _summary_row(self._tail(), self.w.step_index, nonfinite, first_nonfinite)
            host[self.rank * F : (self.rank + 1) * F] = torch.from_numpy(row.view(np.int64).copy())
        except Exception as exc:  # noqa: BLE001 - still take part, with an empty row
            log.debug("nnwatch: job summary row: %r", exc)
        try:
            buf = host
            if cuda:
                buf = torch.empty(host.shape, dtype=host.dtype, device=self.device)
                buf.copy_(host, non_blocking=True)
            work = self.dist.all_reduce(
                buf, op=self.dist.ReduceOp.MAX, group=self.group, async_op=True
            )
        except Exception as exc:  # noqa: BLE001 - never into the user's optimizer.step()
            log.warning("nnwatch: the job summary is off on this rank: %s", exc)
            self.closed = True
            self._stop.set()
            return
        self.launched += 1
        q = self._pending
        if self.rank == 0:  # only rank 0 reads it; the others let the process group keep it
            q.append((self.w.step_index, time.time(), buf, work))
        else:  # keep the newest, so that close() can wait for it before the group goes
            q.clear()
            q.append((self.w.step_index, time.time(), buf, work))

    def _tail(self, n: int = TAIL) -> np.ndarray:
        """The last ``n`` step records (not the probe's whole 500-step window: a tenth the cost)."""
        recent = self.w.files.recent
        if not recent:
            return np.zeros(0)
        raw = b"".join(reversed(list(itertools.islice(reversed(recent.copy()), n))))
        if self._dtype is None:
            self._dtype = self.w.schema.record_dtype()
        rows = np.frombuffer(raw, dtype=self._dtype)
        return cast("np.ndarray", rows[np.isfinite(rows["step"])])

    # -- beats and publishing (the beat thread) --------------------------------------------------
    def _key(self, what: str, rank: int) -> str:
        return f"{self.prefix}/{what}/{rank}"

    def _beat(self) -> None:
        self._beats += 1
        value = {"n": self._beats, "step": int(self.w.step_index), "host": self.host, "pid": os.getpid()}
        self.store.set(self._key("beat", self.rank), json.dumps(value))

    def _run(self) -> None:
        written = 0.0
        while not self._stop.wait(self.beat_s):
            try:
                self._beat()
                if self._publishing:
                    self._read_beats()
                    self._read_tables()
                    if time.monotonic() - written >= max(0.5, 2 * self.beat_s):
                        self.publish()
                        written = time.monotonic()
            except Exception as exc:  # noqa: BLE001 - the store went away with the job
                log.debug("nnwatch: job beat: %r", exc)
                if self.closed:
                    return

    def _read_beats(self) -> None:
        keys = [self._key("beat", r) for r in range(self.world)]
        ends = [self._key("end", r) for r in range(self.world)]
        values = self.store.multi_get(keys)
        now = time.time()
        with self._lock:
            for r, raw in enumerate(values):
                try:
                    beat = json.loads(bytes(raw))
                except ValueError:
                    continue
                seen = self._seen.setdefault(r, {"n": None, "step": None})
                if beat.get("n") != seen.get("n"):
                    seen["beat_at"] = now
                if beat.get("step") != seen.get("step"):
                    seen["step_seen_at"] = now
                seen.update(n=beat.get("n"), step=beat.get("step"), host=beat.get("host"),
                            pid=beat.get("pid"))  # fmt: skip
        ended = int(self.store.add(f"{self.prefix}/ends", 0))  # one round trip while none ends
        if ended > self._ends_known:
            self._ends_known = ended
            for r, key in enumerate(ends):
                if "ended" in self._seen.get(r, {}) or not self.store.check([key]):
                    continue
                with contextlib.suppress(ValueError), self._lock:
                    self._seen.setdefault(r, {})["ended"] = json.loads(bytes(self.store.get(key)))

    def _read_tables(self) -> None:
        """Read the completed summaries, oldest first (rank 0's beat thread). A device buffer is
        copied to pinned memory on a side stream and read once that copy is done, later."""
        q = self._pending
        while q:
            if self._copy is None:  # a newer table is complete: the older ones are never shown
                while len(q) > 1 and q[1][3].is_completed():
                    q.popleft()
            step, at, buf, work = q[0]
            if self._copy is None:
                if not work.is_completed():
                    return
                try:
                    work.wait()  # completed: raises at once if it failed
                except Exception:  # noqa: BLE001 - a rank is gone: this summary never completes
                    self._pending.popleft()
                    continue
                if buf.device.type == "cuda":
                    self._copy = self._to_host(buf)
                    return
                host = buf
            else:
                host, event = self._copy
                if not event.query():
                    return
                self._copy = None
            self._pending.popleft()
            data = host.numpy().view(np.float64).reshape(self.world, F)
            with self._lock:
                self.table, self.table_step, self.table_at = data.copy(), step, at
                self.tables += 1

    def _to_host(self, buf: torch.Tensor) -> tuple[torch.Tensor, Any]:
        if self._side is None:
            self._side = torch.cuda.Stream(device=buf.device)
        host = torch.empty(buf.shape, dtype=buf.dtype, pin_memory=True)
        with torch.cuda.stream(self._side):
            self._side.wait_stream(torch.cuda.current_stream(buf.device))
            host.copy_(buf, non_blocking=True)
            event = torch.cuda.Event()
            event.record(self._side)
        return host, event

    def publish(self) -> None:
        """Write ``job.json`` (rank 0): the latest table, each rank's beat, and the ends seen."""
        run_dir = self.w.run_dir
        if run_dir is None:
            return
        with self._lock:
            table = self.table
            ranks = []
            for r in range(self.world):
                seen = dict(self._seen.get(r, {}))
                row: dict[str, Any] = {"rank": r, "host": seen.get("host"), "pid": seen.get("pid"),
                                       "beat_step": seen.get("step"), "beat_at": seen.get("beat_at"),
                                       "step_seen_at": seen.get("step_seen_at"),
                                       "ended": seen.get("ended")}  # fmt: skip
                if table is not None:
                    row.update({name: _plain(table[r, i]) for i, name in enumerate(JOB_SUMMARY_FIELDS)})
                ranks.append(row)
            waiting = None
            if self._pending:
                step, at, _, _ = self._pending[0]
                waiting = {"step": step, "since": at}
            doc = {
                "version": 1, "written": time.time(), "world_size": self.world,
                "every": self.every, "publisher_rank": self.rank, "pid": os.getpid(),
                "table_step": self.table_step, "table_at": self.table_at,
                "silent_after": self.silent_s, "beat_period": self.beat_s,
                "waiting": waiting, "ranks": ranks, "closed": self.closed,
            }  # fmt: skip
        # atomic, never through a planted link, and through the pinned run directory
        write_private_file(run_dir / JOB_SUMMARY_FILE, json.dumps(doc).encode())

    # -- the end (training thread) ---------------------------------------------------------------
    def close(self, ending: dict[str, Any] | None) -> None:
        """Say how this rank ended; rank 0 also waits for the other ranks' ends (briefly: at most
        ``FINAL_WAIT_S``, less once each has ended or gone silent) and writes its last ``job.json``."""
        if self.closed:
            return
        self.closed = True
        self._stop.set()
        thread = self._thread
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout=1 + 2 * self.beat_s)  # its last pass must not race the final one
        ending = dict(ending or {"status": "finished"})
        ending.setdefault("ended", time.time())
        try:
            if self.store is not None:
                self.store.set(self._key("end", self.rank), json.dumps(ending, default=str))
                self.store.add(f"{self.prefix}/ends", 1)
        except Exception:  # noqa: BLE001 - the store went with the job
            pass
        deadline = time.monotonic() + CLOSE_WAIT_S
        for _, _, _, work in list(self._pending):
            with contextlib.suppress(Exception):
                while not work.is_completed() and time.monotonic() < deadline:
                    time.sleep(0.01)
        if not self._publishing:
            return
        try:
            self._wait_for_the_others()  # returns as soon as every rank ended or went silent
            self._read_beats()
            self._read_tables()
            self.publish()
        except BaseException as exc:  # noqa: BLE001 - a SIGTERM mid-wait: still leave the file
            with contextlib.suppress(Exception):
                self.publish()
            if not isinstance(exc, Exception):
                raise

    def _wait_for_the_others(self) -> None:
        deadline = time.monotonic() + FINAL_WAIT_S * self.beat_s / BEAT_S
        while time.monotonic() < deadline:
            self._read_beats()
            now = time.time()
            with self._lock:
                settled = all(
                    "ended" in s or now - float(s.get("beat_at") or now) > self.silent_s
                    for r, s in self._seen.items() if r != self.rank
                )  # fmt: skip
            if settled:
                return
            time.sleep(self.beat_s / 2)



def _summary_row(rows: np.ndarray, step: int, nonfinite: int, first_nonfinite: int) -> np.ndarray:
    """This rank's row of the job summary at ``step``, from its last step records ``rows``: the
    loss, the last measured gradient norm, the median step time and the memory in use."""
    row = np.full(F, math.nan, dtype=np.float64)
    idx = _INDEX
    row[idx["step"]] = float(step)
    row[idx["time"]] = time.time()
    row[idx["nonfinite"]] = float(nonfinite)
    row[idx["first_nonfinite"]] = float(first_nonfinite)
    # until the sampler's first reading (about a second in): the peak resident memory
    row[idx["memory"]] = float(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss) * 1024
    if len(rows):
        last = rows[-1]
        row[idx["loss"]] = float(last["loss"])
        gn = rows[FieldName.GRAD_NORM]
        measured = np.flatnonzero(~np.isnan(gn))
        if len(measured):
            row[idx[FieldName.GRAD_NORM]] = float(gn[measured[-1]])
        st = rows[FieldName.STEP_TIME]
        st = st[np.isfinite(st) & (st > 0)]
        if len(st):
            row[idx[FieldName.STEP_TIME]] = float(np.median(st))
        for name in (FieldName.CUDA_PEAK, FieldName.RSS):  # sampled now and then: the last reading
            got = rows[name][np.isfinite(rows[name]) & (rows[name] > 0)]
            if len(got):
                row[idx["memory"]] = float(got[-1])
                break
    return row


def _plain(x: float) -> float | None:
    x = float(x)
    return x if math.isfinite(x) else (None if math.isnan(x) else x)


def every_from_env(default: int = DEFAULT_EVERY) -> int:
    """``NNWATCH_JOB_SUMMARY_EVERY`` turns the job summary on without a code change."""
    raw = os.environ.get("NNWATCH_JOB_SUMMARY_EVERY")
    try:
        return default if raw is None else int(raw)
    except ValueError:
        return default
