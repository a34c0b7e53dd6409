"""Bounded history of a run's scalars: min/max buckets for the whole run, raw rows for the recent past.

A run can be 10 million steps long and the monitor must stay small, so the whole-run view is kept
as at most ``capacity`` buckets of ``2**k`` consecutive records, each with the min, max, finite sum
and counts of every tracked field. When the buckets fill up, neighbours merge and the bucket size
doubles. Min and max survive every merge, so a one-step spike stays visible at any zoom. The
latest ``tail`` records are also kept raw, for the 500-step view and the latest values.

Everything here is numpy over reshaped views: a huge batch (a recorded run) is reduced with a few
vectorised passes and never becomes Python objects. No UI library is imported.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from nnwatch.store.overview import block_stats
from nnwatch.store.schema import CHART_FIELDS, FieldName

#: Fields kept as whole-run buckets (what the charts draw: the store's one list).
BUCKET_FIELDS: tuple[str, ...] = CHART_FIELDS
#: Fields kept only for the recent past (latest values, rates, memory).
TAIL_FIELDS: tuple[str, ...] = BUCKET_FIELDS + (
    FieldName.CLIPPED,
    FieldName.NONFINITE_GRADS,
    "time",
    FieldName.STEP_TIME,
    FieldName.CUDA_ALLOCATED,
    FieldName.CUDA_RESERVED,
    FieldName.CUDA_PEAK,
    FieldName.CPU_PERCENT,
    FieldName.RSS,
    "lr",
    # what the measured updates did, for the updates pane's title (NaN on other steps)
    FieldName.UPDATE_FROZEN,
    FieldName.PARAMS_NO_GRAD,
    FieldName.PARAMS_UNOPTIMIZED,
    FieldName.WEIGHT_DRIFT,
)
#: Fields where NaN is not "not measured" but a real failure worth a marker.
NAN_IS_BAD = frozenset({"loss"})


def first_column(col: np.ndarray) -> np.ndarray | None:
    """A per-step field as one value per step: group 0 of a multi-column field (``lr`` holds one
    column per optimizer param group), or None when it has no column at all (a run watched with
    ``optimizer=None`` has 0 LR groups: "not measured", never an IndexError)."""
    if col.ndim < 2:
        return col
    if col.shape[1] == 0:
        return None
    return col[:, 0]


def extract(rows: np.ndarray, fields: tuple[str, ...]) -> np.ndarray:
    """A (len(fields), n) float64 matrix from structured rows; absent fields read as NaN."""
    n = len(rows)
    out = np.full((len(fields), n), np.nan)
    names = rows.dtype.names or ()
    for i, f in enumerate(fields):
        if f in names:
            col = first_column(rows[f])
            if col is not None:
                out[i] = col
    return out


@dataclass(frozen=True)
class Columns:
    """One field reduced to ``n`` chart columns: NaN where a column holds no measured value."""

    lo: np.ndarray
    hi: np.ndarray
    mean: np.ndarray
    bad: np.ndarray  # count of non-finite values (Inf, or NaN where NaN means a failure)
    weight: np.ndarray  # how many finite values each column summarises
    first_step: float
    last_step: float

    @property
    def n(self) -> int:
        return len(self.lo)


def reduce_columns(
    x: np.ndarray,
    lo: np.ndarray,
    hi: np.ndarray,
    total: np.ndarray,
    count: np.ndarray,
    bad: np.ndarray,
    ncols: int,
    x0: float,
    x1: float,
    x_last: np.ndarray | None = None,
) -> Columns:
    """Reduce points (or buckets) at positions ``x`` into ``ncols`` equal columns over [x0, x1].

    A point stands for the steps ``x .. x_last`` (default: its own step only). When the columns
    are narrower than that (a short run, or buckets of many steps), a column in which no point
    starts takes the values of the point that covers it, so a measured series draws as a line and
    not as dots with holes. A column whose points were all unmeasured (NaN) stays NaN: a gap, which
    the chart leaves blank.
    """
    ncols = max(1, int(ncols))
    out_lo = np.full(ncols, np.nan)
    out_hi = np.full(ncols, np.nan)
    out_sum = np.zeros(ncols)
    out_cnt = np.zeros(ncols)
    out_bad = np.zeros(ncols)
    last = x if x_last is None else x_last
    keep = (last >= x0) & (x <= x1)
    if keep.any():
        x, last, lo, hi, total, count, bad = (a[keep] for a in (x, last, lo, hi, total, count, bad))
        span = max(x1 - x0 + 1.0, 1.0)
        scale = ncols / span
        col = np.clip(np.floor((x - x0) * scale).astype(np.int64), 0, ncols - 1)
        if len(col) > 1 and np.any(np.diff(col) < 0):  # steps restarted: sort, stably
            order = np.argsort(col, kind="stable")
            col, last, lo, hi, total, count, bad = (
                a[order] for a in (col, last, lo, hi, total, count, bad)
            )
        starts = np.flatnonzero(np.r_[True, col[1:] != col[:-1]])
        cols = col[starts]
        out_lo[cols] = np.fmin.reduceat(lo, starts)
        out_hi[cols] = np.fmax.reduceat(hi, starts)
        out_sum[cols] = np.add.reduceat(total, starts)
        out_cnt[cols] = np.add.reduceat(count, starts)
        out_bad[cols] = np.add.reduceat(bad, starts)
        fill, filled_mean = _fill_holes(col, cols, last, lo, hi, total, count, ncols, x0, scale, out_lo, out_hi)  # fmt: skip
    else:
        fill = np.zeros(ncols, dtype=bool)
        filled_mean = np.full(ncols, np.nan)
    with np.errstate(invalid="ignore", divide="ignore"):
        mean = np.where(out_cnt > 0, out_sum / np.maximum(out_cnt, 1), np.nan)
    mean = np.where(fill, filled_mean, mean)
    return Columns(out_lo, out_hi, mean, out_bad, out_cnt, float(x0), float(x1))


def _fill_holes(
    col: np.ndarray,
    cols: np.ndarray,
    last: np.ndarray,
    lo: np.ndarray,
    hi: np.ndarray,
    total: np.ndarray,
    count: np.ndarray,
    ncols: int,
    x0: float,
    scale: float,
    out_lo: np.ndarray,
    out_hi: np.ndarray,
) -> tuple[np.ndarray, np.ndarray]:
    """Columns no point starts in, covered by the steps of the point before them: their lo and hi
    set in ``out_lo`` and ``out_hi``; returns which were filled and the mean each takes."""
    fill = np.zeros(ncols, dtype=bool)
    filled_mean = np.full(ncols, np.nan)
    end = np.clip(np.ceil((last + 1.0 - x0) * scale).astype(np.int64) - 1, 0, ncols - 1)
    if len(cols) >= ncols or not np.any(end > col):
        return fill, filled_mean
    empty = np.ones(ncols, dtype=bool)
    empty[cols] = False
    holes = np.flatnonzero(empty)
    owner = np.searchsorted(col, holes, side="right") - 1  # the last point starting before
    ok = owner >= 0
    holes, owner = holes[ok], owner[ok]
    reach = np.maximum.accumulate(end)  # a long bucket may reach past a shorter later one
    cover = reach[owner] >= holes
    # the value drawn is that of the last point starting at or before the hole
    holes, owner = holes[cover], owner[cover]
    out_lo[holes] = lo[owner]
    out_hi[holes] = hi[owner]
    fill[holes] = True
    with np.errstate(invalid="ignore", divide="ignore"):
        pmean = np.where(count > 0, total / np.maximum(count, 1), np.nan)
    filled_mean[holes] = pmean[owner]
    return fill, filled_mean


def raw_columns(
    steps: np.ndarray, values: np.ndarray, field: str, ncols: int, x0: float, x1: float
) -> Columns:
    """``reduce_columns`` for raw values (each point its own bucket, one step wide)."""
    finite = np.isfinite(values)
    bad = np.isinf(values) | (np.isnan(values) if field in NAN_IS_BAD else False)
    v = np.where(finite, values, np.nan)
    return reduce_columns(
        steps, v, v, np.where(finite, values, 0.0), finite.astype(np.float64),
        np.asarray(bad, dtype=np.float64), ncols, x0, x1,
    )  # fmt: skip


def columns_of(rows: np.ndarray, fields: tuple[str, ...], block: int = 16_384) -> list[np.ndarray]:
    """Each field as a contiguous 1-D array in its own dtype (NaN where the rows lack it).

    Rows are walked in cache-sized blocks, copying every field out of a block before moving on:
    one pass over memory instead of one per field, which matters for a 10M-row log.
    """
    n = len(rows)
    names = rows.dtype.names or ()
    outs: list[np.ndarray] = []
    present: list[tuple[np.ndarray, str]] = []
    for f in fields:
        base = rows.dtype.fields[f][0] if f in names else None  # type: ignore[index]
        if base is not None and (not base.shape or base.shape[0] > 0):
            out = np.empty(n, dtype=base.base if base.shape else base)
            present.append((out, f))
        else:  # absent, or a field with no column at all (0 LR groups): not measured
            out = np.full(n, np.nan)
        outs.append(out)
    for i in range(0, n, block):
        sub = rows[i : i + block]
        for out, f in present:
            out[i : i + len(sub)] = first_column(sub[f])  # LR group 0 for ``lr``
    return outs


def _reduce_rows(x: np.ndarray, nan_is_bad: bool) -> tuple[np.ndarray, ...]:
    """Reduce each row of ``x`` (k, b) with the store's :func:`~nnwatch.store.overview.block_stats`:
    min, max, finite sum, finite count, and the non-finite count (Inf, and NaN where NaN is a
    failure rather than "not measured")."""
    lo, hi, total, cnt, nan, inf = (a[0] for a in block_stats(x[None]))
    return lo, hi, total, cnt, inf + nan if nan_is_bad else inf


class History:
    """Whole-run buckets plus a raw tail. Not thread-safe: the owner (``RunState``) locks."""

    def __init__(self, capacity: int = 2048, tail: int = 4096) -> None:
        if capacity < 4 or capacity % 2:
            raise ValueError("capacity must be an even number >= 4")
        self.capacity = capacity
        self.bucket = 1  # records per bucket, a power of two
        self.nb = 0  # buckets in use
        self.fill = 0  # records in the last bucket
        self.rows = 0  # records seen
        F, C = len(BUCKET_FIELDS), capacity
        self._lo = np.full((F, C), np.nan)
        self._hi = np.full((F, C), np.nan)
        self._sum = np.zeros((F, C))
        self._cnt = np.zeros((F, C))
        self._bad = np.zeros((F, C))
        self._nan_bad = np.array([f in NAN_IS_BAD for f in BUCKET_FIELDS])[:, None]
        self.tail_size = tail
        self._tail = np.full((len(TAIL_FIELDS), tail), np.nan)
        self._tail_n = 0  # valid rows in the ring
        self._tail_pos = 0  # next write position
        self._fi = {f: i for i, f in enumerate(BUCKET_FIELDS)}
        self._ti = {f: i for i, f in enumerate(TAIL_FIELDS)}

    # -- writing -----------------------------------------------------------------------------
    def reserve(self, rows: int) -> None:
        """Pick the bucket size for ``rows`` more records now, so a bulk load never re-merges."""
        while self.rows + rows > self.bucket * self.capacity:
            self._coarsen()

    def append(self, rows: np.ndarray) -> None:
        n = len(rows)
        if n == 0:
            return
        self._append_tail(rows)
        # one contiguous column per field, in the file's own dtype (float32 reduces twice as fast)
        cols = columns_of(rows, BUCKET_FIELDS)
        self.rows += n
        pos = 0
        if self.nb and self.fill < self.bucket:  # top up the partial last bucket
            k = min(n, self.bucket - self.fill)
            self._merge_into(self.nb - 1, [c[:k] for c in cols])
            self.fill += k
            pos = k
        while pos < n:
            rest = n - pos
            need = math.ceil(rest / self.bucket)
            if self.nb + need > self.capacity:
                self._coarsen()
                if self.nb and self.fill < self.bucket:  # coarsening left the last one partial
                    k = min(rest, self.bucket - self.fill)
                    self._merge_into(self.nb - 1, [c[pos : pos + k] for c in cols])
                    self.fill += k
                    pos += k
                continue
            full = rest // self.bucket
            b = self.bucket
            if full:
                self._write_buckets(
                    self.nb, [c[pos : pos + full * b].reshape(full, b) for c in cols]
                )
                self.nb += full
                self.fill = b
                pos += full * b
            if pos < n:
                self._write_buckets(self.nb, [c[pos:n].reshape(1, n - pos) for c in cols])
                self.nb += 1
                self.fill = n - pos
                pos = n

    def append_buckets(self, buckets: np.ndarray, fields: tuple[str, ...]) -> None:
        """Take pre-reduced buckets (``nnwatch.store.overview`` records over ``fields``) as if
        their rows had been appended: a remote run's overview or live aggregates. The raw tail is
        not touched; give it the recent rows with ``append_tail``."""
        m = len(buckets)
        if not m:
            return
        col = {f: i for i, f in enumerate(fields)}
        F = len(BUCKET_FIELDS)
        lo, hi = np.full((F, m), np.nan), np.full((F, m), np.nan)
        total, cnt, bad = np.zeros((F, m)), np.zeros((F, m)), np.zeros((F, m))
        rows = buckets["rows"].astype(np.int64)
        for i, f in enumerate(BUCKET_FIELDS):
            if f == "step":
                lo[i], hi[i] = buckets["first"], buckets["last"]
                cnt[i] = rows
                total[i] = (buckets["first"] + buckets["last"]) / 2 * rows
                continue
            j = col.get(f)
            if j is None:
                continue
            lo[i], hi[i] = buckets["lo"][:, j], buckets["hi"][:, j]
            cnt[i] = buckets["finite"][:, j]
            total[i] = np.nan_to_num(buckets["mean"][:, j].astype(np.float64)) * cnt[i]
            bad[i] = buckets["inf"][:, j] + (buckets["nan"][:, j] if f in NAN_IS_BAD else 0.0)
        self.reserve(int(rows.sum()))
        for t in range(m):
            r = int(rows[t])
            while r > self.bucket:
                self._coarsen()
            if self.nb and self.fill + r <= self.bucket:  # fits the partial last bucket
                j = self.nb - 1
                self._lo[:, j] = np.fmin(self._lo[:, j], lo[:, t])
                self._hi[:, j] = np.fmax(self._hi[:, j], hi[:, t])
                self._sum[:, j] += total[:, t]
                self._cnt[:, j] += cnt[:, t]
                self._bad[:, j] += bad[:, t]
                self.fill += r
            else:
                if self.nb == self.capacity:
                    self._coarsen()
                j = self.nb
                self._lo[:, j], self._hi[:, j] = lo[:, t], hi[:, t]
                self._sum[:, j], self._cnt[:, j], self._bad[:, j] = (
                    total[:, t],
                    cnt[:, t],
                    bad[:, t],
                )
                self.nb += 1
                self.fill = r
            self.rows += r

    def append_tail(self, rows: np.ndarray) -> None:
        """Raw rows for the recent past only (their buckets came with ``append_buckets``)."""
        if len(rows):
            self._append_tail(rows)

    def _write_buckets(self, at: int, blocks: list[np.ndarray]) -> None:
        """Reduce each field's (k, b) block into buckets ``at .. at+k``."""
        k = blocks[0].shape[0]
        for i, block in enumerate(blocks):
            lo, hi, total, cnt, bad = _reduce_rows(block, bool(self._nan_bad[i, 0]))
            self._lo[i, at : at + k] = lo
            self._hi[i, at : at + k] = hi
            self._sum[i, at : at + k] = total
            self._cnt[i, at : at + k] = cnt
            self._bad[i, at : at + k] = bad

    def _merge_into(self, j: int, parts: list[np.ndarray]) -> None:
        for i, part in enumerate(parts):
            lo, hi, total, cnt, bad = _reduce_rows(part.reshape(1, -1), bool(self._nan_bad[i, 0]))
            self._lo[i, j] = np.fmin(self._lo[i, j], lo[0])
            self._hi[i, j] = np.fmax(self._hi[i, j], hi[0])
            self._sum[i, j] += total[0]
            self._cnt[i, j] += cnt[0]
            self._bad[i, j] += bad[0]

    def _coarsen(self) -> None:
        """Merge neighbouring buckets pairwise: half as many buckets, each twice as long."""
        nb = self.nb
        if nb == 0:
            self.bucket *= 2
            return
        half = (nb + 1) // 2
        for arr, op in (
            (self._lo, np.fmin),
            (self._hi, np.fmax),
            (self._sum, np.add),
            (self._cnt, np.add),
            (self._bad, np.add),
        ):
            a = arr[:, 0:nb:2].copy()
            b = arr[:, 1:nb:2]
            a[:, : b.shape[1]] = op(a[:, : b.shape[1]], b)
            arr[:, :half] = a
            arr[:, half:nb] = np.nan if arr is self._lo or arr is self._hi else 0.0
        self.fill = self.fill if nb % 2 else self.bucket + self.fill
        self.bucket *= 2
        self.nb = half

    def _append_tail(self, rows: np.ndarray) -> None:
        T = self.tail_size
        rows = rows[-T:]
        vals = extract(rows, TAIL_FIELDS)
        n = vals.shape[1]
        end = self._tail_pos + n
        if end <= T:
            self._tail[:, self._tail_pos : end] = vals
        else:
            k = T - self._tail_pos
            self._tail[:, self._tail_pos :] = vals[:, :k]
            self._tail[:, : n - k] = vals[:, k:]
        self._tail_pos = end % T
        self._tail_n = min(T, self._tail_n + n)

    # -- reading -----------------------------------------------------------------------------
    def tail(self, field: str, n: int | None = None) -> np.ndarray:
        """The last ``n`` raw values of ``field`` (oldest first), at most ``tail_size``."""
        n = self._tail_n if n is None else min(n, self._tail_n)
        if n <= 0:
            return np.zeros(0)
        row = self._tail[self._ti[field]]
        idx = (self._tail_pos - n + np.arange(n)) % self.tail_size
        values: np.ndarray = row[idx]
        return values

    def latest(self, field: str) -> float:
        if self._tail_n == 0:
            return math.nan
        return float(self._tail[self._ti[field], (self._tail_pos - 1) % self.tail_size])

    def latest_finite(self, field: str) -> float:
        """The most recent measured (finite) value of ``field`` in the tail, else NaN."""
        vals = self.tail(field)
        ok = np.flatnonzero(np.isfinite(vals))
        return float(vals[ok[-1]]) if len(ok) else math.nan

    @property
    def first_step(self) -> float:
        return float(self._lo[0, 0]) if self.nb else math.nan

    @property
    def last_step(self) -> float:
        return self.latest("step")

    @property
    def tail_first_step(self) -> float:
        s = self.tail("step")
        return float(s[0]) if len(s) else math.nan

    def total(self, field: str) -> float:
        """Sum of the finite values of ``field`` over the whole run."""
        return float(self._sum[self._fi[field], : self.nb].sum())

    def bad_total(self, field: str) -> int:
        return int(self._bad[self._fi[field], : self.nb].sum())

    def measured(self, field: str) -> bool:
        """Whether any value of ``field`` was ever measured (a run without AMP has none)."""
        return bool(self._cnt[self._fi[field], : self.nb].sum() > 0)

    def columns(
        self, field: str, ncols: int, x0: float | None = None, x1: float | None = None
    ) -> Columns:
        """``field`` over steps [x0, x1] (default: the whole run) as ``ncols`` columns.

        Raw values are used when the tail covers the range, buckets otherwise.
        """
        if self.nb == 0:
            return reduce_columns(*(np.zeros(0),) * 6, ncols, 0.0, 1.0)
        x0 = self.first_step if x0 is None else x0
        x1 = self.last_step if x1 is None else x1
        if x0 >= self.tail_first_step:
            return raw_columns(self.tail("step"), self.tail(field), field, ncols, x0, x1)
        i = self._fi[field]
        nb = self.nb
        return reduce_columns(
            self._lo[0, :nb], self._lo[i, :nb], self._hi[i, :nb], self._sum[i, :nb],
            self._cnt[i, :nb], self._bad[i, :nb], ncols, x0, x1, x_last=self._hi[0, :nb],
        )  # fmt: skip

    @property
    def nbytes(self) -> int:
        """Memory held, which does not grow with the run."""
        return sum(
            a.nbytes for a in (self._lo, self._hi, self._sum, self._cnt, self._bad, self._tail)
        )
