"""A run far away, followed in bounded bytes: an overview first, detail fetched on demand.

:class:`SummarisedSource` is a :class:`ConnectedSource` that subscribes in the stream's overview
mode (``nnwatch.channel.stream_summary``): it receives the run's summaries sized to the screen
and the recent window at full resolution (that is "caught up", whatever the run's length), then
live rows, or aggregates of them when the trainer steps faster than ``live_points`` per second.
It is :class:`~nnwatch.tui.recorded_reads.Seekable`: when the monitor shows a range it holds no rows for
(the cursor moved back in a long run), ``scalars_between`` fetches that range from the trainer
host's log, at full resolution, on the same connection.

A pause asked through this source holds until it is lifted, renewed by the source's command
connection itself (:mod:`nnwatch.channel.pause`), whether or not anyone polls.
"""

from __future__ import annotations

import threading
import time
from collections import OrderedDict
from pathlib import Path
from typing import Any

import numpy as np

from nnwatch.channel import stream_summary as summ
from nnwatch.sources.base import SourceError, SourceUpdate
from nnwatch.sources.live import ConnectedSource, concat_rows
from nnwatch.store import overview as ov
from nnwatch.store.record_split import schema_dtypes
from nnwatch.store.schema import FieldName

#: How long a fetch may take before the monitor draws what it holds instead.
FETCH_TIMEOUT = 5.0
FETCH_CACHE = 16


class SummarisedSource(ConnectedSource):
    """Follow a run through its socket in the stream's overview mode (see the module doc)."""

    def __init__(
        self,
        socket: Path | str,
        *,
        buckets: int = summ.DEFAULT_BUCKETS,
        window: int = summ.DEFAULT_WINDOW,
        live_points: float = 250.0,
        **kwargs: Any,
    ) -> None:
        self.buckets, self.window, self.live_points = buckets, window, live_points
        self._summary: list[tuple[np.ndarray, tuple[str, ...]]] = []
        self._fetch_lock = threading.Lock()  # one fetch at a time
        self._read_lock = threading.Lock()  # whoever reads the subscription
        self._fetches: dict[int, dict[str, Any]] = {}
        self._fetch_id = 0
        self._cache: OrderedDict[tuple[float, float], tuple[np.ndarray, np.ndarray]] = OrderedDict()
        self.notices: list[str] = []
        #: raw rows taken in this poll since its last summary (a later summary covers their steps)
        self._uncovered: list[np.ndarray] = []
        #: messages held for the next poll, behind a summary of another field set
        self._backlog: list[dict[str, Any]] = []
        super().__init__(socket, **kwargs)

    def _subscribe_extra(self) -> dict[str, Any] | None:
        extra: dict[str, Any] = {"overview": True, "buckets": self.buckets, "window": self.window}
        if self.live_points > 0:
            extra["live_points"] = float(self.live_points)
        return extra

    # -- messages --------------------------------------------------------------------------------
    def _take(self, msg: dict[str, Any]) -> None:
        kind = msg.get("type")
        if "fetch" in msg and kind in ("scalars", "layers"):
            entry = self._fetches.get(msg["fetch"])
            if entry is not None:
                entry[kind].append(msg["rows"])
            return
        if kind == "fetched":
            entry = self._fetches.get(msg.get("id"))  # type: ignore[arg-type]
            if entry is not None:
                entry["error"] = str(msg.get("error") or "")
                entry["done"].set()
            return
        if kind == "notice":
            self.notices.append(str(msg.get("message") or ""))
            return
        if isinstance(msg.get("next_seq"), int):
            self._next_seq = int(msg["next_seq"])
        if kind == "summary":
            try:
                buckets, fields, rows = summ.decode_summary(msg, self._meta.schema.scalar_dtype())
            except ValueError:
                return
            keep = buckets["last"] > self._filter.last_scalar
            if self._uncovered:  # raw rows before these buckets in this poll: buckets of 1 row
                raw = np.concatenate(self._uncovered)
                self._uncovered = []
                self._summary.append((ov.reduce_rows(raw, fields, 1), fields))
            if keep.any():
                self._summary.append((buckets[keep], fields))
            self._pending[0].append(self._filter.scalars(rows))
            return
        before = len(self._pending[0])
        super()._take(msg)
        self._uncovered.extend(p for p in self._pending[0][before:] if len(p))

    def _read(self) -> None:
        """Take what has arrived, in order. A summary of other fields than one already taken
        (the overview's and the live aggregates' differ) waits, with all after it, for the next
        poll: one update carries one field set, and nothing may overtake it."""
        with self._read_lock:
            self._take_in_order(self._sub.poll(0.0))

    def _take_in_order(self, msgs: list[dict[str, Any]]) -> None:
        backlog, self._backlog = self._backlog, []
        for msg in [*backlog, *msgs]:
            if "fetch" in msg or msg.get("type") == "fetched":
                self._take(msg)  # a fetch's reply is not part of the stream's order
            elif self._backlog or self._other_fields(msg):
                self._backlog.append(msg)
            else:
                self._take(msg)

    def _other_fields(self, msg: dict[str, Any]) -> bool:
        if msg.get("type") != "summary" or not self._summary:
            return False
        fields = tuple(msg.get("fields") or ())
        return bool(fields) and fields != self._summary[0][1]

    def poll(self) -> SourceUpdate:
        if self._closed:
            raise SourceError("this source is closed")
        if self._sub.lost and self._sub.ended is None and self.auto_reconnect:
            self._retry()
        self._read()
        schema = self._meta.schema
        scalar_parts, layer_parts, events = self._pending
        self._pending = ([], [], [])
        self._uncovered = []
        summary: np.ndarray | None = None
        fields: tuple[str, ...] = ()
        if self._summary:
            fields = self._summary[0][1]
            same = [b for b, f in self._summary if f == fields]
            summary = np.concatenate(same) if len(same) > 1 else same[0]
            self._summary = [(b, f) for b, f in self._summary if f != fields]
        return SourceUpdate(
            scalars=concat_rows(scalar_parts, schema_dtypes(schema)[0]),
            layers=concat_rows(layer_parts, schema_dtypes(schema)[1]),
            events=events,
            status=self._status(),
            summary=summary,
            summary_fields=fields,
        )

    # -- Seekable: full resolution on demand -------------------------------------------------------
    def scalars_between(self, first_step: float, last_step: float) -> np.ndarray:
        got = self.fetch(first_step, last_step)
        return got[0] if got is not None else np.zeros(0, self._meta.schema.scalar_dtype())

    def layer_row_at(self, step: int) -> np.ndarray | None:
        got = self.fetch(float(step), float(step))
        if got is None or not len(got[1]):
            return None
        layers = got[1][got[1][FieldName.STEP] <= step]
        return layers[-1] if len(layers) else None

    def fetch(
        self, first_step: float, last_step: float, timeout: float = FETCH_TIMEOUT
    ) -> tuple[np.ndarray, np.ndarray] | None:
        """Log rows with ``first_step <= step <= last_step`` (and the layer row in force at
        ``first_step``) from the trainer host, or None when the link cannot answer in time."""
        key = (float(first_step), float(last_step))
        if key in self._cache:
            self._cache.move_to_end(key)
            return self._cache[key]
        with self._fetch_lock:
            if self._sub.lost:
                return None
            self._fetch_id += 1
            rid = self._fetch_id
            entry: dict[str, Any] = {"scalars": [], "layers": [], "done": threading.Event()}
            self._fetches[rid] = entry
            line = {"op": "fetch", "id": rid, "first": key[0], "last": key[1]}
            try:
                import json

                self._sub.sock.sendall((json.dumps(line) + "\n").encode())
                deadline = time.monotonic() + timeout
                while not entry["done"].is_set() and time.monotonic() < deadline:
                    if self._read_lock.acquire(blocking=False):  # nobody else reads: we do
                        try:
                            self._take_in_order(self._sub.poll(0.05))
                        finally:
                            self._read_lock.release()
                    else:
                        entry["done"].wait(0.05)
            except OSError:
                return None
            finally:
                self._fetches.pop(rid, None)
            if not entry["done"].is_set() or entry.get("error"):
                return None
        dtypes = schema_dtypes(self._meta.schema)
        got = (concat_rows(entry["scalars"], dtypes[0]), concat_rows(entry["layers"], dtypes[1]))
        self._cache[key] = got
        while len(self._cache) > FETCH_CACHE:
            self._cache.popitem(last=False)
        return got
