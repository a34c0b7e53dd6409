"""Multi-resolution summaries of every series in the run log, kept beside it (``overview.bin``).

A monitor far from the trainer cannot load 10 million rows to draw one screen. The trainer host
therefore keeps, for every scalar field of the log, the min, max, mean, last value and the counts
of finite, NaN and Inf values per bucket of rows, at a few levels: buckets of 2**8 rows, then each
level 8 times coarser (2**11, 2**14, 2**17, 2**20). A monitor takes the finest level that fits its
screen (a few hundred buckets whatever the run length) and fetches finer detail when it needs it.

Cost to the trainer: :class:`OverviewWriter` is a run-log observer, so it runs in the log's writer
thread with the rows of each drain (never in the training thread). It reduces whole blocks with
numpy and appends each completed bucket once: O(1) amortised per row, a few hundred bytes per 256
rows on disk. Partial buckets are never written; a reader completes them from the log's last rows.

File layout: a 64-byte header (magic ``NNWOVR1``, field count, scalar row size, CRC32 of the field
names), then fixed-size bucket records in the order they completed, each with its level, index in
that level, row count, step range, the stats and a CRC32 of its own bytes. A reader validates every
record (checksum, contiguous indices, row counts, and the step range against the log itself) and,
when anything is wrong, rebuilds the summaries from the log and says so in plain words.
"""

from __future__ import annotations

import os
import struct
import zlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

import numpy as np

from nnwatch.store.paths import open_for_append
from nnwatch.store.safe_read import held_size, open_file
from nnwatch.store.schema import FieldName

OVERVIEW_FILE = "overview.bin"
MAGIC = b"NNWOVR1\0"
HEADER_SIZE = 64
_HEADER = struct.Struct("<8sIII")  # magic, fields, scalar row size, crc32 of the field names
BASE_LOG2 = 8  # level 0 buckets hold 256 rows
FACTOR_LOG2 = 3  # each level 8 times coarser
LEVELS = 5  # 2**8 .. 2**20 rows per bucket
STATS = ("lo", "hi", "mean", "final", "finite", "nan", "inf")


def bucket_rows(level: int) -> int:
    return 1 << (BASE_LOG2 + FACTOR_LOG2 * level)


def series_fields(scalar_dtype: np.dtype) -> tuple[str, ...]:
    """Every numeric field of a scalars row (multi-column fields by their first column)."""
    out = []
    for name in scalar_dtype.names or ():
        base = scalar_dtype.fields[name][0]  # type: ignore[index]
        if base.shape and base.shape[0] == 0:
            continue  # e.g. lr with 0 param groups: no column at all
        if np.issubdtype(base.base if base.shape else base, np.number):
            out.append(name)
    return tuple(out)


def bucket_dtype(nfields: int) -> np.dtype:
    """One bucket record; the same layout on disk and on the wire."""
    f = (nfields,)
    return np.dtype([
        ("level", "<u4"), ("index", "<u4"), ("rows", "<u4"), ("crc", "<u4"),
        ("first", "<f8"), ("last", "<f8"),
        ("lo", "<f4", f), ("hi", "<f4", f), ("mean", "<f4", f), ("final", "<f4", f),
        ("finite", "<f4", f), ("nan", "<f4", f), ("inf", "<f4", f),
    ])  # fmt: skip


def _names_crc(fields: tuple[str, ...]) -> int:
    return zlib.crc32(",".join(fields).encode())


def columns(rows: np.ndarray, fields: tuple[str, ...]) -> np.ndarray:
    """A (fields, n) float64 matrix of ``rows`` (scalars rows or whole records)."""
    out = np.empty((len(fields), len(rows)))
    for i, f in enumerate(fields):
        col = rows[f]
        out[i] = col[:, 0] if col.ndim > 1 else col
    return out


def block_stats(blocks: np.ndarray) -> tuple[np.ndarray, ...]:
    """Per block (the last axis) of ``blocks``, shaped (series, k, b): the min and max of its
    finite values, their sum (float64) and count, and its NaN and Inf counts, each (series, k).

    Every min/max bucket of a run's history is made here: the buckets of ``overview.bin`` (remote
    monitors) and the TUI's whole-run history alike. Min and max survive every merge, so a
    one-step spike stays visible at any zoom. A series whose blocks are all finite (most) costs
    three passes; NaN and Inf take the slow path, series by series; a series that is all NaN (one
    this run never measures: no AMP, no CUDA) costs one.
    """
    s, k, b = blocks.shape
    lo, hi = np.full((s, k), np.nan), np.full((s, k), np.nan)
    total, nfin = np.zeros((s, k)), np.zeros((s, k))
    nan, inf = np.zeros((s, k)), np.zeros((s, k))
    sums = blocks.sum(axis=2, dtype=np.float64)
    easy = np.isfinite(sums).all(axis=1)
    if easy.any():
        e = blocks[easy]
        lo[easy], hi[easy], total[easy] = e.min(axis=2), e.max(axis=2), sums[easy]
        nfin[easy] = b
    hard = np.flatnonzero(~easy)
    if len(hard):
        h = blocks[hard]
        isnan = np.isnan(h)
        empty = isnan.all(axis=(1, 2))
        nan[hard[empty]] = b
        hard, h, isnan = hard[~empty], h[~empty], isnan[~empty]
    if len(hard):
        finite = np.isfinite(h)
        clean = np.where(finite, h, np.nan)
        nfin[hard] = finite.sum(axis=2)
        total[hard] = np.where(finite, h, 0.0).sum(axis=2, dtype=np.float64)
        lo[hard], hi[hard] = np.fmin.reduce(clean, axis=2), np.fmax.reduce(clean, axis=2)
        nan[hard] = isnan.sum(axis=2)
        inf[hard] = (~finite & ~isnan).sum(axis=2)
    return lo, hi, total, nfin, nan, inf


def reduce_blocks(
    x: np.ndarray, steps: np.ndarray, level: int, first_index: int, size: int = 0
) -> np.ndarray:
    """Buckets of ``size`` rows (default ``bucket_rows(level)``) from ``x`` (fields, n); rows past
    the last whole bucket are ignored."""
    fields, n = x.shape
    b = size or bucket_rows(level)
    k = n // b
    out = np.zeros(k, bucket_dtype(fields))
    if k == 0:
        return out
    blocks = x[:, : k * b].reshape(fields, k, b)
    lo, hi, total, nfin, nan, inf = block_stats(blocks)
    with np.errstate(invalid="ignore", divide="ignore"):
        mean = total / nfin
    out["level"] = level
    out["index"] = np.arange(first_index, first_index + k)
    out["rows"] = b
    s = steps[: k * b].reshape(k, b)
    out["first"] = s[:, 0]
    out["last"] = s[:, -1]
    out["lo"], out["hi"], out["mean"] = lo.T, hi.T, mean.T
    out["final"] = blocks[:, :, -1].T
    out["finite"], out["nan"], out["inf"] = nfin.T, nan.T, inf.T
    return out


def merge(buckets: np.ndarray, level: int, first_index: int = 0, group: int = 0) -> np.ndarray:
    """Merge consecutive groups of buckets (default: 8, the next level) into one bucket each; a
    trailing partial group gives a partial bucket."""
    group = group or (1 << FACTOR_LOG2)
    n = len(buckets)
    if n == 0:
        return cast("np.ndarray", buckets[:0].copy())
    starts = np.arange(0, n, group)
    out = np.zeros(len(starts), buckets.dtype)
    out["level"] = level
    out["index"] = np.arange(first_index, first_index + len(starts))
    out["rows"] = np.add.reduceat(buckets["rows"], starts)
    out["first"] = buckets["first"][starts]
    ends = np.minimum(starts + group, n) - 1
    out["last"] = buckets["last"][ends]
    out["lo"] = np.fmin.reduceat(buckets["lo"], starts, axis=0)
    out["hi"] = np.fmax.reduceat(buckets["hi"], starts, axis=0)
    fin = buckets["finite"].astype(np.float64)
    total = np.nan_to_num(buckets["mean"].astype(np.float64)) * fin
    nfin = np.add.reduceat(fin, starts, axis=0)
    with np.errstate(invalid="ignore", divide="ignore"):
        out["mean"] = np.where(nfin > 0, np.add.reduceat(total, starts, axis=0) / nfin, np.nan)
    out["final"] = buckets["final"][ends]
    out["finite"] = nfin
    out["nan"] = np.add.reduceat(buckets["nan"], starts, axis=0)
    out["inf"] = np.add.reduceat(buckets["inf"], starts, axis=0)
    return out


def _seal(buckets: np.ndarray) -> np.ndarray:
    """Set each record's CRC32 (computed with its crc field at 0)."""
    buckets["crc"] = 0
    raw = buckets.view(np.uint8).reshape(len(buckets), -1)
    buckets["crc"] = [zlib.crc32(r.data) for r in raw]
    return buckets


@dataclass
class Overview:
    """The summaries of rows ``0 .. rows`` of a log: ``levels[k]`` holds buckets of
    ``bucket_rows(k)`` rows, its last one partial when ``rows`` is not a multiple of that."""

    fields: tuple[str, ...]
    levels: list[np.ndarray]
    rows: int

    def level_for(self, max_buckets: int) -> int:
        """The finest level whose buckets fit ``max_buckets`` (the coarsest when none does)."""
        for k, buckets in enumerate(self.levels):
            if len(buckets) <= max_buckets:
                return k
        return len(self.levels) - 1


def build(scalars: np.ndarray, fields: tuple[str, ...] | None = None) -> Overview:
    """Summaries of ``scalars`` (log rows) at every level, computed from the rows in blocks."""
    fields = fields or series_fields(scalars.dtype)
    n = len(scalars)
    b0 = bucket_rows(0)
    parts = []
    block = b0 * 1024
    for i in range(0, n - n % b0, block):
        sub = scalars[i : min(i + block, n - n % b0)]
        parts.append(reduce_blocks(columns(sub, fields), np.asarray(sub[FieldName.STEP], np.float64), 0,
                                   i // b0))  # fmt: skip
    complete = np.concatenate(parts) if parts else np.zeros(0, bucket_dtype(len(fields)))
    return complete_with(fields, complete, {}, scalars)


def reduce_rows(rows: np.ndarray, fields: tuple[str, ...], size: int, level: int = 0,
                first_index: int = 0) -> np.ndarray:  # fmt: skip
    """Buckets of ``size`` consecutive ``rows`` (scalars rows or records), the last one partial."""
    n = len(rows)
    if not n:
        return np.zeros(0, bucket_dtype(len(fields)))
    x = columns(rows, fields)
    steps = np.asarray(rows[FieldName.STEP], np.float64)
    whole = n - n % size
    out = [reduce_blocks(x[:, :whole], steps[:whole], level, first_index, size)]
    if whole < n:  # a partial bucket: NaN-padded to a whole one, then its counts fixed
        pad = size - (n - whole)
        xp = np.concatenate([x[:, whole:], np.full((len(fields), pad), np.nan)], axis=1)
        sp = np.concatenate([steps[whole:], np.full(pad, steps[-1])])
        tail = reduce_blocks(xp, sp, level, first_index + whole // size, size)
        tail["rows"] = n - whole
        tail["nan"] -= pad
        tail["final"] = x[:, -1]
        out.append(tail)
    return np.concatenate(out)


def since(ov: Overview, scalars: np.ndarray, first_row: int, max_buckets: int) -> np.ndarray:
    """Buckets for log rows ``first_row ..`` sized to ``max_buckets``: the finest level that fits,
    its stored buckets where they start at or after ``first_row``, the rows before them reduced."""
    n = ov.rows
    if first_row >= n:
        return np.zeros(0, bucket_dtype(len(ov.fields)))
    for k in range(len(ov.levels)):
        b = bucket_rows(k)
        if (n - first_row) / b <= max_buckets or k == len(ov.levels) - 1:
            break
    start = -(-first_row // b)  # the first bucket of level k at or after first_row
    head = reduce_rows(scalars[first_row : min(start * b, n)], ov.fields, b, k)
    return np.concatenate([head, ov.levels[k][start:]])


def complete_with(
    fields: tuple[str, ...], level0: np.ndarray, stored: dict[int, np.ndarray], scalars: np.ndarray
) -> Overview:
    """Every level for the ``scalars`` rows, from complete level-0 buckets, any stored complete
    coarser buckets (trusted up to where they reach) and the rows after the last whole bucket."""
    n = len(scalars)
    b0 = bucket_rows(0)
    tail = reduce_rows(scalars[len(level0) * b0 : n], fields, b0, 0, len(level0))
    levels = [np.concatenate([level0, tail])]
    for k in range(1, LEVELS):
        below = levels[k - 1]
        per = 1 << FACTOR_LOG2
        have = stored.get(k, below[:0])
        have = have[: len(below) // per]  # never more than what the level below supports
        rest = merge(below[len(have) * per :], k, len(have))
        levels.append(np.concatenate([have, rest]))
    return Overview(fields, levels, n)


class OverviewWriter:
    """A run-log observer that keeps ``overview.bin`` up to date from the writer thread.

    Give it to ``RunLogWriter.observers``; it sees whole records after they were written. It stops
    for good (and leaves readers to rebuild from the log) after the log or its own file failed.
    """

    def __init__(self, run_dir: Path, scalar_dtype: np.dtype, log_writer: Any = None) -> None:
        self.path = Path(run_dir) / OVERVIEW_FILE
        self.fields = series_fields(scalar_dtype)
        self.scalar_dtype = scalar_dtype
        self.log_writer = log_writer
        self.failed: str | None = None
        self._held: list[np.ndarray] = []  # scalars bytes of rows not yet in a whole bucket
        self._held_rows = 0
        self._pending: list[np.ndarray] = [np.zeros(0, bucket_dtype(len(self.fields)))] * LEVELS
        self._count = [0] * LEVELS  # complete buckets per level
        fd = open_for_append(self.path)  # opened per write after this: no descriptor is held
        try:
            if os.fstat(fd).st_size == 0:
                head = _HEADER.pack(MAGIC, len(self.fields), scalar_dtype.itemsize,
                                    _names_crc(self.fields))  # fmt: skip
                _write_all(fd, head.ljust(HEADER_SIZE, b"\0"))
            else:  # an existing file is another run's: never append to it
                self.failed = f"{self.path} already exists"
        finally:
            os.close(fd)

    def __call__(self, records: np.ndarray) -> None:
        if self.failed is not None or not len(records):
            return
        if self.log_writer is not None and getattr(self.log_writer, "error", None) is not None:
            self.failed = "the run log failed"
            return
        # a record starts with its scalars row: copy those bytes out, and reduce whole buckets
        raw = np.ascontiguousarray(records).view(np.uint8).reshape(len(records), -1)
        self._held.append(raw[:, : self.scalar_dtype.itemsize].copy())
        self._held_rows += len(records)
        b0 = bucket_rows(0)
        if self._held_rows < b0:
            return  # most drains of a slow loop: a copy and nothing else
        held = np.concatenate(self._held) if len(self._held) > 1 else self._held[0]
        whole = len(held) - len(held) % b0
        self._held = [held[whole:]]
        self._held_rows = len(held) - whole
        scalars = np.ascontiguousarray(held[:whole]).view(self.scalar_dtype).reshape(-1)
        x = columns(scalars, self.fields)
        steps = np.asarray(scalars[FieldName.STEP], np.float64)
        out = [reduce_blocks(x[:, :whole], steps[:whole], 0, self._count[0])]
        self._count[0] += len(out[0])
        new = out[0]
        per = 1 << FACTOR_LOG2
        for k in range(1, LEVELS):
            pend = np.concatenate([self._pending[k], new]) if len(new) else self._pending[k]
            full = len(pend) - len(pend) % per
            self._pending[k] = pend[full:]
            if not full:
                break
            new = merge(pend[:full], k, self._count[k])
            self._count[k] += len(new)
            out.append(new)
        data = _seal(np.concatenate(out)).tobytes()
        try:
            fd = open_for_append(self.path)
            try:
                _write_all(fd, data)
            finally:
                os.close(fd)
        except OSError as exc:
            self.failed = f"cannot append to {self.path}: {exc.strerror or exc}"


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        n = os.write(fd, view)
        view = view[n:]


def read_stored(path: Path, fields: tuple[str, ...], scalar_size: int) -> dict[int, np.ndarray]:
    """The complete buckets of ``overview.bin`` by level. Raises ValueError (plain words) when the
    file is not one of this log, or any record is damaged or out of order."""
    with open_file(path) as fh:  # never a link or a FIFO; a hole at the end is no bucket
        data = fh.read(min(held_size(fh.fileno()), 1 << 34))
    if len(data) < HEADER_SIZE:
        raise ValueError(f"{path.name} is shorter than its header")
    magic, nf, row_size, names = _HEADER.unpack(data[: _HEADER.size])
    if magic != MAGIC:
        raise ValueError(f"{path.name} is not an nnwatch overview (bad magic)")
    if nf != len(fields) or row_size != scalar_size or names != _names_crc(fields):
        raise ValueError(f"{path.name} describes other fields than this run's log")
    dtype = bucket_dtype(len(fields))
    body = data[HEADER_SIZE:]
    body = body[: len(body) - len(body) % dtype.itemsize]  # a record cut short by a kill
    recs = np.frombuffer(body, dtype=dtype).copy()
    crc = recs["crc"].copy()
    recs["crc"] = 0
    raw = recs.view(np.uint8).reshape(len(recs), -1)
    bad = [i for i in range(len(recs)) if zlib.crc32(raw[i].data) != crc[i]]
    if bad:
        raise ValueError(f"{path.name}: {len(bad)} bucket(s) failed their checksum")
    recs["crc"] = crc
    out: dict[int, np.ndarray] = {}
    for k in range(LEVELS):
        lv = recs[recs["level"] == k]
        if not np.array_equal(lv["index"], np.arange(len(lv))) or (
            len(lv) and not (lv["rows"] == bucket_rows(k)).all()
        ):
            raise ValueError(f"{path.name}: level {k} is out of order")
        out[k] = lv
    if int((recs["level"] >= LEVELS).sum()):
        raise ValueError(f"{path.name} holds an unknown level")
    return out


def load(run_dir: Path, scalars: np.ndarray) -> tuple[Overview, str]:
    """The summaries of ``scalars`` (the run's log rows, as ``load_run`` maps them) and, when the
    stored ones could not be used, why (they were rebuilt from the log: slower, never wrong)."""
    fields = series_fields(scalars.dtype)
    path = Path(run_dir) / OVERVIEW_FILE
    if not path.exists():
        return build(scalars, fields), f"{path.name} is missing; built from the log"
    try:
        stored = read_stored(path, fields, scalars.dtype.itemsize)
        level0 = stored.get(0, np.zeros(0, bucket_dtype(len(fields))))
        b0 = bucket_rows(0)
        level0 = level0[: len(scalars) // b0]
        _check_against_log(level0, scalars)
        return complete_with(fields, level0, stored, scalars), ""
    except (OSError, ValueError) as exc:
        why = str(exc) if isinstance(exc, ValueError) else (exc.strerror or str(exc))
        return build(scalars, fields), f"{path.name} is unusable ({why}); rebuilt from the log"


def _check_against_log(level0: np.ndarray, scalars: np.ndarray) -> None:
    """Every bucket's step range against the log's own rows, and the last bucket's stats against
    a fresh reduction: a stale or foreign file is caught here."""
    if not len(level0):
        return
    b0 = bucket_rows(0)
    steps = np.asarray(scalars[FieldName.STEP], np.float64)
    n = len(level0)
    idx = np.arange(n) * b0
    if not (np.array_equal(level0["first"], steps[idx]) and
            np.array_equal(level0["last"], steps[idx + b0 - 1])):  # fmt: skip
        raise ValueError(f"{OVERVIEW_FILE} does not match the log's steps")
    fields = series_fields(scalars.dtype)
    last = scalars[(n - 1) * b0 : n * b0]
    fresh = reduce_blocks(columns(last, fields), steps[(n - 1) * b0 : n * b0], 0, n - 1)
    for stat in STATS:
        if not np.array_equal(fresh[stat], level0[stat][-1:], equal_nan=True):
            raise ValueError(f"{OVERVIEW_FILE} does not match the log's values")
