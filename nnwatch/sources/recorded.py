"""A finished or crashed run, read back from its run log, delivered like a live run would be.

``RecordedSource(run_dir)`` maps the log with ``nnwatch.store.run_reader.load_run`` and hands the history to
the monitor in chunks (views into the mapping, which the monitor reduces in one pass), asking the
kernel to read ahead and dropping the mapped pages behind it, so that opening a 10-million-step
run neither copies it into Python objects nor keeps gigabytes resident. It also reads any part of
the history again on request (``scalars_between``, ``layer_row_at``), which is what the step
cursor uses to scrub. A run that is still being written keeps growing: later polls
return the new rows. Nothing here imports a UI library.
"""

from __future__ import annotations

import mmap
import os
from pathlib import Path
from typing import Any, cast

import numpy as np

from nnwatch.sources.base import RunSource, SourceError, SourceStatus, SourceUpdate
from nnwatch.store.copy_note import describe_copy
from nnwatch.store.events import Event
from nnwatch.store.run_reader import load_run
from nnwatch.store.runlog import RunLogError
from nnwatch.store.schema import FieldName, RunMeta

CHUNK_ROWS = 262_144  # rows per poll while loading: ~30 MB of scalars for a small model
LAYER_TAIL = 64  # per-layer rows handed over at the end of loading; older ones are read on demand


def _state_of(status: str) -> str:
    return {
        "finished": "finished", "crashed": "crashed", "running": "live", "copied": "recorded",
    }.get(status, status)  # fmt: skip


class RecordedSource(RunSource):
    """The history of one run directory. Cannot be steered (``can_command`` is False)."""

    def __init__(self, run_dir: str | os.PathLike[str], *, chunk_rows: int = CHUNK_ROWS) -> None:
        self.run_dir = Path(run_dir).expanduser()
        self.chunk_rows = max(1, int(chunk_rows))
        try:
            self._run = load_run(self.run_dir)
        except RunLogError as exc:
            raise SourceError(str(exc)) from exc
        except OSError as exc:
            raise SourceError(f"cannot read {self.run_dir}: {exc.strerror or exc}") from exc
        self._sent = 0  # scalar rows handed over
        self._events_sent = 0
        self._layers_sent = 0
        self._closed = False
        _read_ahead(self._run.scalars)

    @property
    def meta(self) -> RunMeta:
        return self._run.meta

    @property
    def run(self) -> Any:
        return self._run

    @property
    def total_rows(self) -> int:
        return len(self._run.scalars)

    def poll(self) -> SourceUpdate:
        if self._closed:
            raise SourceError("the recorded run was closed")
        run = self._run
        if self._sent >= len(run.scalars) and run.status == "running":
            self._reload()
            run = self._run
        scalars = run.scalars
        start, stop = self._sent, min(self._sent + self.chunk_rows, len(scalars))
        # A view into the mapping, not a copy: the monitor reduces it in one pass. Pages of the
        # chunks it has finished with are dropped from this process (they stay in the page cache).
        _drop_pages(scalars, start)
        chunk = scalars[start:stop]
        self._sent = stop
        done = stop >= len(scalars)
        layers = run.layers[:0].copy()
        events: list[Event] = []
        if done:
            # per-layer rows: only the newest; older ones are read on demand when scrubbing
            n = len(run.layers)
            first = max(self._layers_sent, n - LAYER_TAIL)
            layers = np.array(run.layers[first:n])
            self._layers_sent = n
            events = run.events[self._events_sent :]
            self._events_sent = len(run.events)
        state = _state_of(run.status)  # from the first chunk on: the badge never flips mid-load
        message = "; ".join(run.warnings) if done else f"loading {stop:,} of {len(scalars):,} steps"
        if done and run.status == "running":
            message = "reading the log of a running run; attach to it to steer it"
        copy = getattr(run, "copy", None)
        if done and copy is not None:  # not a run of this host: say what its own host said
            message = "; ".join([describe_copy(copy), *run.warnings])
        return SourceUpdate(chunk, layers, events, SourceStatus(state, message=message))

    def _reload(self) -> None:
        """Map the files again to see rows a running trainer appended since."""
        try:
            self._run = load_run(self.run_dir)
        except (RunLogError, OSError) as exc:
            raise SourceError(f"cannot re-read {self.run_dir}: {exc}") from exc

    # -- random access for scrubbing -------------------------------------------------------
    def scalars_between(self, first_step: float, last_step: float) -> np.ndarray:
        """A private copy of the scalar rows with first_step <= step <= last_step.

        Steps are found by binary search on the mapped step column, so gaps (dropped records)
        do not shift anything and only a few pages are read.
        """
        s = self._run.scalars
        if not len(s):
            return cast("np.ndarray", s[:0].copy())
        steps = s[FieldName.STEP]
        i = int(np.searchsorted(steps, first_step, side="left"))
        j = int(np.searchsorted(steps, last_step, side="right"))
        return np.array(s[i:j]) if j > i else s[:0].copy()

    def layer_row_at(self, step: int) -> np.ndarray | None:
        """The last per-layer row at or before ``step`` (binary search over the mapped file)."""
        layers = self._run.layers
        if not len(layers):
            return None
        i = int(np.searchsorted(layers[FieldName.STEP], step, side="right")) - 1
        return np.array(layers[i]) if i >= 0 else None

    def close(self) -> None:
        self._closed = True


def _read_ahead(arr: np.ndarray) -> None:
    """Ask the kernel to start reading the whole log now, while the first chunks are reduced:
    a cold 1 GB log then streams from disk at full speed instead of page fault by page fault."""
    filename = getattr(arr, "filename", None)
    if not filename or not hasattr(os, "posix_fadvise"):
        return
    try:
        fd = os.open(filename, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)  # never waits
    except OSError:
        return
    try:
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_SEQUENTIAL)
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_WILLNEED)
    except OSError:
        pass
    finally:
        os.close(fd)


def _drop_pages(arr: np.ndarray, rows_done: int) -> None:
    """Tell the kernel we are done with the mapped pages before row ``rows_done``.

    They stay in the page cache (reading them again is cheap) but stop counting towards this
    process's resident memory, which keeps the monitor small while it opens a huge run.
    """
    mm = getattr(arr, "_mmap", None)
    if mm is None or not hasattr(mm, "madvise") or rows_done <= 0:
        return
    offset = int(getattr(arr, "offset", 0)) % mmap.ALLOCATIONGRANULARITY
    end = (offset + rows_done * arr.dtype.itemsize) // mmap.PAGESIZE * mmap.PAGESIZE
    if end > 0:
        try:
            mm.madvise(mmap.MADV_DONTNEED, 0, end)
        except (OSError, ValueError):
            pass
