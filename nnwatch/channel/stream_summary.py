"""The overview mode of the ``subscribe`` stream: what a far monitor needs, in bounded bytes.

A monitor that subscribes with ``overview: true`` does not get the run's whole history. It gets
one ``summary`` message: the run log's multi-resolution summaries (``nnwatch.store.overview``) at
the finest level that fits ``buckets`` (its screen), together with the last ``window`` rows at full
resolution. That is "caught up": the overview of every step plus full resolution for the recent
window the panes show. Older full-resolution ranges are fetched on demand (``fetch`` requests on
the same connection), and every step fetched equals the log.

Live following is in proportion to the screen, not to the step rate: when more than
``live_points`` rows per second arrive, each period's rows go out as aggregate buckets (min, max,
mean, counts per series) with the last row of each bucket, in one ``summary`` message; the
detectors run at full resolution on the trainer host anyway, and their findings come as events.

Messages (binary only; payloads are zlib-compressed when that helps)::

    {"type": "summary", "buckets": m, "rows": r, "fields": [...], "live": bool, "bytes": B}
        m bucket records (store.overview.bucket_dtype), then r scalars rows
    {"type": "scalars" | "layers", "fetch": id, ...}   rows a fetch asked for
    {"type": "fetched", "id": id, "rows": n, "first": s0, "last": s1}   the fetch is complete

Requests from the monitor, one JSON object per line (at most ``MAX_REQUEST`` bytes)::

    {"op": "fetch", "id": 3, "first": 1000, "last": 1500}   log rows with first <= step <= last
    {"op": "keepalive"}
"""

from __future__ import annotations

import json
import zlib
from pathlib import Path
from typing import Any

import numpy as np

from nnwatch.store import overview as ov
from nnwatch.store.runlog import LAYERS_FILE, SCALARS_FILE, map_log_rows
from nnwatch.store.schema import CHART_FIELDS, FieldName, RunMeta

MAX_REQUEST = 4096
#: The most rows one fetch returns (a zoomed view needs a few thousand).
MAX_FETCH_ROWS = 200_000
DEFAULT_BUCKETS = 1024
DEFAULT_WINDOW = 4096
#: Series a live aggregate carries (what the charts draw); the last row of each bucket has all.
LIVE_FIELDS = CHART_FIELDS


def summary_bytes(buckets: np.ndarray, fields: tuple[str, ...], rows: np.ndarray,
                  **extra: Any) -> bytes:  # fmt: skip
    """One ``summary`` message: buckets and raw rows in one payload, so they arrive together."""
    raw = np.ascontiguousarray(buckets).tobytes() + np.ascontiguousarray(rows).tobytes()
    head: dict[str, Any] = {"type": "summary", "buckets": int(len(buckets)),
                            "rows": int(len(rows)), "fields": list(fields), **extra}  # fmt: skip
    packed = zlib.compress(raw, 6)
    if len(packed) < len(raw):
        head["zlib"] = True
        raw = packed
    head["bytes"] = len(raw)
    return (json.dumps(head) + "\n").encode() + raw


def decode_summary(
    msg: dict[str, Any], scalar_dtype: np.dtype
) -> tuple[np.ndarray, tuple[str, ...], np.ndarray]:
    """(buckets, their fields, scalars rows) of a ``summary`` message the client read."""
    fields = tuple(str(f) for f in msg.get("fields") or ())
    dtype = ov.bucket_dtype(len(fields))
    raw = msg.get("raw") or b""
    m, r = int(msg.get("buckets") or 0), int(msg.get("rows") or 0)
    if len(raw) != m * dtype.itemsize + r * scalar_dtype.itemsize:
        raise ValueError("a summary message of the wrong size")
    buckets = np.frombuffer(raw, dtype=dtype, count=m).copy()
    rows = np.frombuffer(raw, dtype=scalar_dtype, count=r, offset=m * dtype.itemsize).copy()
    return buckets, fields, rows


def map_log(run_dir: Path, meta: RunMeta) -> tuple[np.ndarray, np.ndarray]:
    """(scalars, layer rows) of the run log, memory-mapped without reading them: a 10M-step log
    opens in milliseconds. (``load_run`` also verifies every block's checksum, a pass over the
    whole file; the rows a monitor fetches are the log's bytes as they are.)"""
    schema = meta.schema
    return (map_log_rows(run_dir / SCALARS_FILE, schema.scalar_dtype()),
            map_log_rows(run_dir / LAYERS_FILE, schema.layer_row_dtype()))  # fmt: skip


def first_row_after(scalars: np.ndarray, step: float) -> int:
    """Index of the first log row whose step is after ``step`` (steps ascend in a log)."""
    return int(np.searchsorted(np.asarray(scalars[FieldName.STEP]), step, side="right"))


def overview_since(
    run_dir: Path, scalars: np.ndarray, first_row: int, max_buckets: int
) -> tuple[np.ndarray, tuple[str, ...], str]:
    """Buckets for log rows ``first_row ..``: from ``overview.bin`` when it is sound (the whole
    run), else reduced from the rows themselves; and a warning in words when the file was bad."""
    if first_row == 0:
        summaries, why = ov.load(run_dir, scalars)
        return ov.since(summaries, scalars, 0, max_buckets), summaries.fields, why
    fields = ov.series_fields(scalars.dtype)
    n = len(scalars) - first_row
    size = 1 << max(0, int(np.ceil(np.log2(max(1.0, n / max_buckets)))))
    return ov.reduce_rows(scalars[first_row:], fields, size), fields, ""


class LiveAggregator:
    """Collects live scalars rows and says what to send each period: the rows themselves while
    they are few, else aggregate buckets of a power-of-two size plus the last row of each."""

    def __init__(self, live_points: float, fields: tuple[str, ...]) -> None:
        self.live_points = live_points
        self.fields = fields
        self.parts: list[np.ndarray] = []

    def add(self, rows: np.ndarray) -> None:
        if len(rows):
            self.parts.append(rows)

    def flush(self, period: float) -> tuple[np.ndarray | None, np.ndarray]:
        """(buckets or None, rows): None when the rows go as they are."""
        if not self.parts:
            return None, np.zeros(0)
        rows = np.concatenate(self.parts) if len(self.parts) > 1 else self.parts[0]
        self.parts = []
        allowed = max(1, int(self.live_points * period))
        if len(rows) <= allowed:
            return None, rows
        size = 1 << int(np.ceil(np.log2(len(rows) / allowed)))
        buckets = ov.reduce_rows(rows, self.fields, size)
        ends = np.minimum(np.arange(size - 1, len(rows) + size - 1, size), len(rows) - 1)
        return buckets, rows[ends]


class Requests:
    """Request lines a monitor sends on its stream connection, parsed with bounded memory."""

    def __init__(self) -> None:
        self.buf = b""
        self.pending: list[dict[str, Any]] = []
        self.keepalives = 0

    def feed(self, data: bytes) -> None:
        self.buf += data
        while b"\n" in self.buf:
            line, self.buf = self.buf.split(b"\n", 1)
            try:
                obj = json.loads(line)
            except ValueError:
                continue
            if not isinstance(obj, dict):
                continue
            if obj.get("op") == "keepalive":
                self.keepalives += 1
            elif obj.get("op") == "fetch":
                self.pending.append(obj)
        if len(self.buf) > MAX_REQUEST:  # no newline in sight: not a request of ours
            self.buf = b""


def fetch_rows(
    scalars: np.ndarray, layers: np.ndarray, request: dict[str, Any]
) -> tuple[np.ndarray, np.ndarray] | str:
    """The log rows a ``fetch`` asks for, or why not (in words)."""
    first, last = request.get("first"), request.get("last")
    if not isinstance(first, (int, float)) or not isinstance(last, (int, float)) or last < first:
        return "fetch needs numbers first <= last"
    steps = np.asarray(scalars[FieldName.STEP])
    i0 = int(np.searchsorted(steps, first, side="left"))
    i1 = min(int(np.searchsorted(steps, last, side="right")), i0 + MAX_FETCH_ROWS)
    rows = np.array(scalars[i0:i1])
    lsteps = np.asarray(layers[FieldName.STEP])
    # the layer row in force at ``first`` too (the last sampled one at or before it)
    j0 = max(0, int(np.searchsorted(lsteps, first, side="right")) - 1)
    j1 = int(np.searchsorted(lsteps, last, side="right"))
    return rows, np.array(layers[j0 : max(j0, j1)])
