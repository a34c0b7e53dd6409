"""The monitor's bounded picture of one run, filled by the collector thread and read by the panes.

``RunState`` is the only shared object between the collector thread (which ingests what the
source delivers) and the UI thread (which draws). Both hold ``lock`` while they touch it; ingest
work is numpy over batches, and drawing reads at most a few thousand numbers, so neither waits
long. Everything kept is bounded: history buckets, a raw tail, the last layer rows and the last
events, however long the run. No UI library is imported here.
"""

from __future__ import annotations

import math
import threading
from collections import deque
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from nnwatch.sources.base import SourceStatus, SourceUpdate
from nnwatch.sources.hardware import HardwareReading
from nnwatch.store.events import CommandApplied, Event, FindingEvent, SnapshotTaken, as_event
from nnwatch.store.schema import FieldName, RunMeta
from nnwatch.tui.recorded_reads import (
    Seekable,
    last_measured,
    update_row_before,
    updated,
    value_before,
)
from nnwatch.tui.scalar_history import Columns, History, first_column, raw_columns

#: ``take_changes()`` for a state whose every topic is to be drawn again (a new main run, a theme).
EVERY_TOPIC: frozenset[str] = frozenset({"*"})
ZOOM_STEPS = 500  # the "recent" zoom level of the charts
INGEST_CHUNK = 262_144  # rows reduced at a time, so a huge batch never holds the lock for long


def _sig(*values: float) -> tuple[float | None, ...]:
    """Values to compare for "did this pane's picture change": NaN (not measured) as None,
    since NaN != NaN would make an idle pane look changed on every poll."""
    return tuple(v if math.isfinite(v) else None for v in values)


def is_finding(event: Mapping[str, Any]) -> bool:
    """A detector's finding (an event, or the dict of its line)."""
    return isinstance(as_event(event), FindingEvent)


@dataclass(frozen=True)
class Ingested:
    """What one ``ingest`` call changed, for the collector to turn into messages."""

    rows: int
    panes: frozenset[str]
    snapshots: tuple[SnapshotTaken, ...]
    commands: tuple[CommandApplied, ...]
    state_before: str
    state_after: str


class RunState:
    """Bounded history, latest layer rows, recent events and status of one run."""

    def __init__(
        self,
        meta: RunMeta,
        *,
        capacity: int = 2048,
        tail: int = 4096,
        max_events: int = 2000,
        max_layer_rows: int = 64,
    ) -> None:
        self.lock = threading.RLock()
        self.meta = meta
        self.history = History(capacity=capacity, tail=tail)
        self._layer_dtype = meta.schema.layer_row_dtype()
        self.layer_rows: deque[np.ndarray] = deque(maxlen=max_layer_rows)
        self.events: deque[Event] = deque(maxlen=max_events)
        self.events_total = 0
        self.findings_by_severity: dict[str, int] = {}
        self.status = SourceStatus("connecting")
        self.hardware: HardwareReading | None = None
        self.lost_message = ""
        #: monitor-side threads that failed and have not recovered: what -> "IndexError: ..."
        self.reader_errors: dict[str, str] = {}
        #: the data topics ("loss", "layers", "header"...) changed since the UI last took them
        self._changed: set[str] = set()
        self._gpu_sig: tuple[float | None, ...] = ()
        self._amp_sig: tuple[float | None, ...] = ()
        self.param_index = {n: i for i, n in enumerate(meta.schema.param_layer_names)}

    # -- collector thread --------------------------------------------------------------------
    def ingest(self, update: SourceUpdate) -> Ingested:
        """Take one poll's data in; return which panes changed. Huge batches go in chunks."""
        changed: set[str] = set()
        scalars = update.scalars
        if update.summary is not None and len(update.summary):  # remote overview, live aggregates
            scalars = _ingest_summary(
                self.history, self.lock, update.summary, update.summary_fields, scalars
            )
            changed |= {"header", "loss", "grad"}
        n = len(scalars)
        if n > INGEST_CHUNK:
            with self.lock:
                self.history.reserve(n)
        for i in range(0, n, INGEST_CHUNK):
            chunk = np.asarray(scalars[i : i + INGEST_CHUNK])
            with self.lock:
                self.history.append(chunk)
        with self.lock:
            if n:
                changed |= {"header", "loss", "grad"} | self._scalar_changes()
            layers = update.layers
            if len(layers):
                for row in np.asarray(
                    layers[-self.layer_rows.maxlen :] if self.layer_rows.maxlen else layers
                ):
                    self.layer_rows.append(np.array(row, dtype=self._layer_dtype))
                changed |= {"layers", "updates"}
            fresh, snapshots, commands = self._take_events(update.events)
            if fresh:
                changed |= {"events", "header"}
            before = self.status.state
            if update.status != self.status:
                changed.add("header")
            self.status = update.status
            if update.status.state not in ("lost",):
                self.lost_message = ""
            self._changed |= changed
            return Ingested(n, frozenset(changed), snapshots, commands, before, self.status.state)

    def _scalar_changes(self) -> set[str]:
        """The panes of the scalars that change only on some records: AMP (a scaler's scale or
        skips) and GPU (memory, CPU, RSS). Under ``lock``."""
        changed: set[str] = set()
        h = self.history
        amp_sig = _sig(h.latest_finite(FieldName.AMP_SCALE), h.total(FieldName.AMP_SKIPPED))
        if amp_sig != self._amp_sig and amp_sig[0] is not None:
            changed.add("amp")
        self._amp_sig = amp_sig
        gpu_sig = _sig(
            *(h.latest(f) for f in (
                FieldName.CUDA_ALLOCATED, FieldName.CUDA_RESERVED, FieldName.CUDA_PEAK,
            )),  # fmt: skip
            h.latest_finite(FieldName.CPU_PERCENT),
            h.latest_finite(FieldName.RSS),
        )
        if gpu_sig != self._gpu_sig:
            changed.add("gpu")
        self._gpu_sig = gpu_sig
        return changed

    def _take_events(
        self, events: Iterable[Event | Mapping[str, Any]]
    ) -> tuple[list[Event], tuple[SnapshotTaken, ...], tuple[CommandApplied, ...]]:
        """Keep the events, count the findings; return them, and the snapshots and commands
        among them. Every event is new: a source never delivers one twice (a resumed stream's
        repeats are dropped there, :mod:`nnwatch.sources.seen_events`). Under ``lock``."""
        snapshots: list[SnapshotTaken] = []
        commands: list[CommandApplied] = []
        fresh = [as_event(ev) for ev in events]  # a test's source may hand over dicts
        for ev in fresh:
            self.events.append(ev)
            self.events_total += 1
            if isinstance(ev, FindingEvent):
                sev = ev.finding.severity
                self.findings_by_severity[sev] = self.findings_by_severity.get(sev, 0) + 1
            elif isinstance(ev, SnapshotTaken):
                snapshots.append(ev)
            elif isinstance(ev, CommandApplied):
                commands.append(ev)
        return fresh, tuple(snapshots), tuple(commands)

    def mark_lost(self, message: str) -> str:
        """The source failed: keep the history, show the run as lost. Returns the previous state."""
        with self.lock:
            before = self.status.state
            self.status = SourceStatus("lost", dropped=self.status.dropped, message=message)
            self.lost_message = message
            self._changed.add("header")
            return before

    def mark_reader_failed(self, what: str, message: str) -> None:
        """A monitor-side thread failed (``what``: "reader", "hardware reader", ...)."""
        with self.lock:
            self.reader_errors[what] = message
            self._changed.add("header")

    def clear_reader_failed(self, what: str) -> None:
        with self.lock:
            if self.reader_errors.pop(what, None) is not None:
                self._changed.add("header")

    @property
    def reader_failure(self) -> str:
        """The failures for the header, source reader first: "reader failed: IndexError: ..."."""
        with self.lock:
            errors = sorted(self.reader_errors.items(), key=lambda kv: kv[0] != "reader")
        return "; ".join(f"{what} failed: {message}" for what, message in errors)

    def set_hardware(self, reading: HardwareReading) -> None:
        with self.lock:
            self.hardware = reading
            self._changed.add("gpu")

    def mark_changed(self, *topics: str) -> None:
        """Have the panes of ``topics`` draw again at the next redraw tick."""
        with self.lock:
            self._changed.update(topics)

    def take_changes(self, only: frozenset[str] | None = None) -> frozenset[str]:
        """The data topics changed since the last call (UI thread): each pane whose topic is
        among them has something new to draw. ``only``: take just those, leave the rest."""
        with self.lock:
            taken = self._changed if only is None else self._changed & only
            self._changed = self._changed - taken
            return frozenset(taken)

    # -- UI thread ---------------------------------------------------------------------------
    def step_bounds(self) -> tuple[float, float]:
        with self.lock:
            return self.history.first_step, self.history.last_step

    def window(self, zoomed: bool, cursor: float | None) -> tuple[float, float]:
        """The step range the charts show: the whole run, or ``ZOOM_STEPS`` ending at the cursor."""
        first, last = self.step_bounds()
        if not math.isfinite(first):
            return 0.0, 1.0
        if not zoomed:
            return first, max(last, first + 1)
        end = (
            last
            if cursor is None
            else min(max(cursor + ZOOM_STEPS // 2, first + ZOOM_STEPS - 1), last)
        )
        return max(first, end - ZOOM_STEPS + 1), max(end, first + 1)

    def columns(
        self, field: str, ncols: int, x0: float, x1: float, source: object | None = None
    ) -> Columns:
        """``field`` over [x0, x1] in ``ncols`` columns, read exactly from a seekable source when
        the range is small and not in the raw tail (scrubbing a recorded run)."""
        with self.lock:
            h = self.history
            in_tail = x0 >= h.tail_first_step
            if not in_tail and isinstance(source, Seekable) and x1 - x0 <= 4 * ZOOM_STEPS:
                rows = source.scalars_between(x0, x1)
                if len(rows):
                    col = first_column(rows[field])
                    vals = np.full(len(rows), np.nan) if col is None else col.astype(np.float64)
                    return raw_columns(rows["step"].astype(np.float64), vals, field, ncols, x0, x1)
            return h.columns(field, ncols, x0, x1)

    def layer_row(self, cursor: float | None, source: object | None = None) -> np.ndarray | None:
        """The per-layer stats to show: the newest, or the last sampled at or before the cursor."""
        with self.lock:
            if cursor is None:
                return self.layer_rows[-1] if self.layer_rows else None
            for row in reversed(self.layer_rows):  # every row after the oldest kept is kept
                if row["step"] <= cursor:
                    found: np.ndarray = row
                    return found
        if isinstance(source, Seekable):
            return source.layer_row_at(int(cursor))
        return None

    def update_row(self, cursor: float | None, source: object | None = None) -> np.ndarray | None:
        """The per-layer row of the last measured update at or before the cursor (the newest
        without one). The update fields exist on measured updates only: a row kept for another
        reason (a non-finite step, an update the AMP scaler skipped) has none, and is passed over
        for the one before it. None for a run recorded before them (schema 3 and older)."""
        if FieldName.UPDATE_LAYER not in (self._layer_dtype.names or ()):
            return None
        with self.lock:
            kept = list(self.layer_rows)
        for row in reversed(kept):
            if (cursor is None or row["step"] <= cursor) and updated(row):
                measured: np.ndarray = row
                return measured
        if not isinstance(source, Seekable):
            return None
        # every row after the oldest one kept is kept: look further back in the source
        at = float(kept[0]["step"]) - 1 if kept else math.inf
        return update_row_before(source, at if cursor is None else min(at, cursor))

    def value_at(
        self, field: str, cursor: float | None, source: object | None = None, measured: bool = False
    ) -> float:
        """``field`` at the cursor step (or the latest value).

        ``measured``: the last measured (not NaN) value at or before it, for fields the probe's
        cost budget measures on some steps only (gradient norms), so that a title does not
        flicker to "-" between measurements. Inf is a measurement and shows.
        """
        with self.lock:
            h = self.history
            if cursor is None and not measured:
                return h.latest(field)
            steps = h.tail("step")
            if len(steps) and (cursor is None or cursor >= steps[0]):
                i = (
                    len(steps) - 1
                    if cursor is None
                    else int(np.searchsorted(steps, cursor, side="right")) - 1
                )
                vals = h.tail(field)[: max(i, 0) + 1]
                return last_measured(vals) if measured else float(vals[-1])
            if cursor is None:
                return math.nan
        if isinstance(source, Seekable):
            return value_before(source, field, cursor, ZOOM_STEPS, measured)
        return math.nan

    def steps_per_second(self, window_s: float = 5.0) -> float:
        """Recent throughput from the records' own clock (so a recorded run shows its real rate)."""
        with self.lock:
            t = self.history.tail("time")
            s = self.history.tail("step")
        return _rate(t, s, window_s)

    def recent_clip_share(self, n: int = 100) -> float:
        """Share of the last ``n`` steps whose gradients were clipped (NaN if clip was never called)."""
        with self.lock:
            c = self.history.tail(FieldName.CLIPPED, n)
        c = c[np.isfinite(c)]
        return float(c.mean()) if len(c) else math.nan

    def recent_skips(self, n: int = 1000) -> int:
        with self.lock:
            c = self.history.tail(FieldName.AMP_SKIPPED, n)
        return int(np.nansum(c)) if len(c) else 0

    def ema(self, field: str, alpha: float = 0.02, n: int = 2000, clamp: float = 10.0) -> float:
        """An exponential moving average of the last ``n`` raw values of ``field``; values more
        than ``clamp`` times the window's median away from it are clamped first (robust)."""
        with self.lock:
            v = self.history.tail(field, n)
        return _robust_ema(v, alpha, clamp)



def _ingest_summary(
    history: History,
    lock: threading.RLock,
    summary: np.ndarray,
    fields: tuple[str, ...],
    scalars: np.ndarray,
) -> np.ndarray:
    """Take buckets and rows in step order; return the rows after the last bucket.

    One poll may hold rows between two summaries (a gap filled row by row, then live
    aggregates): each row not inside a bucket is appended as a row of its own, before the
    buckets that follow it, so every step is counted once and in order.
    """
    steps = np.asarray(scalars["step"], dtype=np.float64)
    firsts = np.asarray(summary["first"], dtype=np.float64)
    lasts = np.asarray(summary["last"], dtype=np.float64)
    m, pos, t = len(summary), 0, 0
    with lock:
        while t < m:
            k = int(np.searchsorted(steps, firsts[t], "left"))
            if k > pos:  # rows before this bucket, in no bucket
                history.append(np.asarray(scalars[pos:k]))
                pos = k
            u = t + 1
            while u < m and int(np.searchsorted(steps, firsts[u], "left")) == int(
                np.searchsorted(steps, lasts[u - 1], "right")
            ):
                u += 1  # no loose row between these buckets: take them together
            end = int(np.searchsorted(steps, lasts[u - 1], "right"))
            history.append_buckets(summary[t:u], fields)
            history.append_tail(np.asarray(scalars[pos:end]))
            pos, t = end, u
    return scalars[pos:]


def _rate(t: np.ndarray, s: np.ndarray, window_s: float) -> float:
    """Steps per second over the last ``window_s`` seconds of the records' times ``t`` and
    steps ``s`` (NaN times left out); NaN with fewer than two records in it."""
    ok = np.isfinite(t)
    t, s = t[ok], s[ok]
    if len(t) < 2:
        return math.nan
    keep = t >= t[-1] - window_s
    t, s = t[keep], s[keep]
    if len(t) < 2 or t[-1] <= t[0]:
        return math.nan
    return float((s[-1] - s[0]) / (t[-1] - t[0]))


def _robust_ema(v: np.ndarray, alpha: float, clamp: float) -> float:
    """The exponential moving average of the finite values ``v``, each first clamped to within
    ``clamp`` times their median of it (one wild value does not swing it)."""
    v = v[np.isfinite(v)]
    if not len(v):
        return math.nan
    med = float(np.median(v))
    lim = clamp * max(abs(med), 1e-12)
    v = np.clip(v, med - lim, med + lim)
    w = (1 - alpha) ** np.arange(len(v) - 1, -1, -1)
    return float((w * v).sum() / w.sum())
