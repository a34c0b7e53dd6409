"""Bounded memory of a run's own past, so that detectors judge a run against itself.

Fixed thresholds misfire on runs whose natural scale is unusual (a stable gradient norm of 5000 is
fine; a loss that is always noisy is fine). Detectors therefore compare the present with robust
statistics of the run's history: the median and the MAD (median absolute deviation) resist the
very outliers that are being looked for, where a mean and a standard deviation would chase them.
Every buffer here has a fixed size, so a run of ten million steps costs what a run of a thousand does.
"""

from __future__ import annotations

import math
from bisect import bisect_left, bisect_right, insort
from collections import deque
from typing import TYPE_CHECKING, cast

import numpy as np

from nnwatch.diagnosis.observed import Observations

if TYPE_CHECKING:
    from nnwatch.diagnosis.row import Row

MAD_TO_SIGMA = 1.4826  # MAD * this estimates the standard deviation of normal data


class Ring:
    """A fixed-size ring of floats (NaN when empty); ``values()`` returns oldest to newest."""

    __slots__ = ("_buf", "_count", "_next")

    def __init__(self, size: int) -> None:
        self._buf = np.full(int(size), np.nan)
        self._count = 0
        self._next = 0

    def push(self, value: float) -> None:
        self._buf[self._next] = value
        self._next = (self._next + 1) % self._buf.size
        self._count += 1

    def __len__(self) -> int:
        return min(self._count, self._buf.size)

    @property
    def total(self) -> int:
        """How many values were ever pushed (the ring keeps only the last ``size``)."""
        return self._count

    def last(self) -> float:
        return float(self._buf[self._next - 1]) if self._count else math.nan

    def values(self, last: int | None = None) -> np.ndarray:
        n = len(self)
        if last is not None:
            n = min(n, int(last))
        if n == 0:
            return np.zeros(0)
        end = self._next
        start = end - n
        if start >= 0:
            return cast("np.ndarray", self._buf[start:end].copy())
        return np.concatenate((self._buf[start:], self._buf[:end]))

    def clear(self) -> None:
        self._buf.fill(np.nan)
        self._count = 0
        self._next = 0


class SortedWindow:
    """The last ``size`` values in arrival order and in sorted order, updated in O(log n) + a short
    memmove per push, so that a detector's median over a window costs O(1) per row instead of a
    sort. Finite values only (NaN has no place in a sorted list)."""

    __slots__ = ("_order", "_sorted", "size")

    def __init__(self, size: int) -> None:
        self.size = int(size)
        self._order: deque[float] = deque()
        self._sorted: list[float] = []

    def push(self, value: float) -> None:
        if len(self._order) == self.size:
            old = self._order.popleft()
            del self._sorted[bisect_left(self._sorted, old)]
        self._order.append(value)
        insort(self._sorted, value)

    def __len__(self) -> int:
        return len(self._order)

    def median(self) -> float:
        s = self._sorted
        n = len(s)
        if n == 0:
            return math.nan
        h = n // 2
        return s[h] if n % 2 else 0.5 * (s[h - 1] + s[h])

    def last(self) -> float:
        return self._order[-1] if self._order else math.nan

    def values(self) -> list[float]:
        """Oldest to newest."""
        return list(self._order)

    def quantile(self, q: float) -> float:
        """The q-quantile by linear interpolation (numpy's default), as :func:`quantile`."""
        s = self._sorted
        n = len(s)
        if n == 0:
            return math.nan
        pos = q * (n - 1)
        lo = int(pos)
        hi = min(lo + 1, n - 1)
        return s[lo] + (s[hi] - s[lo]) * (pos - lo)

    def count_above(self, x: float) -> int:
        """How many values are strictly greater than ``x``."""

        return len(self._sorted) - bisect_right(self._sorted, x)

    def clear(self) -> None:
        self._order.clear()
        self._sorted.clear()


def median(values: list[float]) -> float:
    """Median of a short list. ``sorted`` on a Python list is ~20x cheaper than ``np.median`` on
    the few dozen values detectors look at, and detectors run once per training step."""
    n = len(values)
    if n == 0:
        return math.nan
    s = sorted(values)
    h = n // 2
    return s[h] if n % 2 else 0.5 * (s[h - 1] + s[h])


def quantile(values: list[float], q: float) -> float:
    """The q-quantile by linear interpolation (numpy's default), for short lists."""
    n = len(values)
    if n == 0:
        return math.nan
    s = sorted(values)
    pos = q * (n - 1)
    lo = int(pos)
    hi = min(lo + 1, n - 1)
    return s[lo] + (s[hi] - s[lo]) * (pos - lo)


def median_sigma(x: np.ndarray) -> tuple[float, float]:
    """Robust centre and spread (MAD scaled to a standard deviation) of the finite values of ``x``."""
    vals = [v for v in x.tolist() if math.isfinite(v)]
    if not vals:
        return math.nan, math.nan
    med = median(vals)
    return med, MAD_TO_SIGMA * median([abs(v - med) for v in vals])


def finite_median(x: np.ndarray) -> float:
    return median([v for v in x.tolist() if math.isfinite(v)])


def linear_fit(x: np.ndarray) -> tuple[float, float, float]:
    """Least-squares line through ``x`` against 0..n-1: (slope, intercept, slope standard error).

    Closed form: ``np.polyfit`` costs ~50 us per call, too much for a per-step detector.
    """
    n = x.size
    t = np.arange(n, dtype=np.float64)
    tm = (n - 1) / 2.0
    sxx = float(n * (n * n - 1) / 12.0)
    xm = float(x.mean())
    slope = float(np.dot(t - tm, x - xm)) / sxx if sxx > 0 else 0.0
    icpt = xm - slope * tm
    if n <= 2 or sxx <= 0:
        return slope, icpt, math.inf
    resid = x - (icpt + slope * t)
    se = math.sqrt(max(float(np.dot(resid, resid)), 0.0) / (n - 2) / sxx)
    return slope, icpt, se


def lag1_autocorr(x: np.ndarray) -> float:
    """Lag-1 autocorrelation after removing a straight-line trend: near -1 for a zig-zag."""
    n = x.size
    if n < 4:
        return math.nan
    slope, icpt, _ = linear_fit(x)
    r = x - (icpt + slope * np.arange(n, dtype=np.float64))
    den = float(np.dot(r, r))
    if den <= 0.0:
        return math.nan
    return float(np.dot(r[1:], r[:-1]) / den)


class RunHistory:
    """The short memory all detectors share: recent losses and gradient norms, and the first losses.

    Updated after the detectors have seen a row, so that while a detector looks at step t the
    history holds steps before t.
    """

    SIZE = 512
    START = 5  # losses that define where the run started

    def __init__(self) -> None:
        self.loss = Ring(self.SIZE)
        """Finite losses only, oldest to newest."""
        self.log_grad = Ring(self.SIZE)
        """log10 of finite, positive global gradient norms."""
        self.first_losses: list[float] = []
        self.first_loss_step = -1
        self.rows = 0
        self.loss_seen = False
        self._last5: list[float] = []
        self.best_loss = math.inf
        """Lowest median of 5 consecutive losses so far: how far the run ever got."""
        self.obs = Observations()
        """Causes the records show outright (LR, cleared gradients, a loss independent of the
        weights, the clip), shared by every detector."""

    def push(self, row: Row) -> None:
        self.obs.push(row)
        loss = row.loss
        g = row.grad_norm
        self.rows += 1
        if math.isfinite(loss):
            self.loss.push(loss)
            self.loss_seen = True
            self._last5 = (self._last5 + [loss])[-5:]
            if len(self._last5) == 5:
                self.best_loss = min(self.best_loss, sorted(self._last5)[2])
            if len(self.first_losses) < self.START:
                if not self.first_losses:
                    self.first_loss_step = row.step
                self.first_losses.append(loss)
        if math.isfinite(g) and g > 0:
            self.log_grad.push(math.log10(g))

    @property
    def start_loss(self) -> float:
        """Median of the first few finite losses: the level the run started from."""
        return median(self.first_losses)

    def recent_loss(self, n: int = 10) -> float:
        return median(self.loss.values(n).tolist())

    def progress_since_start(self, n: int = 10) -> float:
        """Relative loss drop from the start to the median of the last ``n`` losses (0.3 = 30% lower)."""
        start = self.start_loss
        if not math.isfinite(start) or start == 0 or len(self.loss) < n:
            return math.nan
        return (start - self.recent_loss(n)) / abs(start)

    def learned(self, fraction: float = 0.1) -> bool:
        """The loss has at some point been ``fraction`` below where the run started."""
        start = self.start_loss
        if not math.isfinite(start) or start == 0 or not math.isfinite(self.best_loss):
            return False
        return (start - self.best_loss) / abs(start) >= fraction

    def recent_progress(self, n: int = 20) -> float:
        """Relative drop between the medians of the older and newer halves of the last ``n`` losses."""
        v = self.loss.values(n).tolist()
        if len(v) < n:
            return math.nan
        h = len(v) // 2
        a, b = median(v[:h]), median(v[h:])
        return (a - b) / abs(a) if a != 0 else math.nan


def kendall_tau(values: list[float]) -> float:
    """Kendall's tau of ``values`` against time: +1 always rising, -1 always falling, ~0 no trend.

    A rank statistic: one huge spike moves it no more than a small one, which is what a robust
    trend test needs. O(n^2), so only for the short windows detectors use (n <= ~24).
    """
    n = len(values)
    if n < 3:
        return math.nan
    s = 0
    for i in range(n - 1):
        a = values[i]
        for b in values[i + 1 :]:
            s += (b > a) - (b < a)
    return s / (n * (n - 1) / 2)
