"""A plain-text line chart, so a curve can be read in any terminal, log file or CI output.

Deliberately free of rich/textual: the checks run headless (in CI, over SSH, inside a pipe).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass


def _fmt(v: float) -> str:
    if v == 0 or not math.isfinite(v):
        return str(v)
    return f"{v:.0e}" if abs(v) < 1e-2 or abs(v) >= 1e3 else f"{v:.3g}"


def line_chart(
    xs: Sequence[float],
    ys: Sequence[float],
    *,
    width: int = 60,
    height: int = 12,
    log_x: bool = True,
    y_max: float | None = None,
    marks: Mapping[str, float] | None = None,
    y_label: str = "",
) -> str:
    """Draw ``ys`` against ``xs`` with ``*``; each entry of ``marks`` draws a ``|`` column at an x.

    The x axis is logarithmic by default (learning rates). Values above ``y_max`` are drawn at the
    top row. Returns the chart as lines joined by newlines, with y labels on the left and the
    x range plus a legend for the marks below.
    """
    points = [
        (float(x), float(y))
        for x, y in zip(xs, ys, strict=True)
        if math.isfinite(y) and math.isfinite(x) and (x > 0 or not log_x)
    ]
    if not points or width < 8 or height < 3:
        return "(nothing to plot)"
    frame = _Frame.around(points, width, height, log_x, y_max)
    grid = frame.draw(points, marks or {})
    return frame.text(grid, marks or {}, y_label)


@dataclass(frozen=True)
class _Frame:
    """The chart's axes: where an x falls in a column and a y in a row."""

    width: int
    height: int
    log_x: bool
    x_lo: float
    x_hi: float
    y_lo: float
    y_top: float

    @classmethod
    def around(
        cls, points: list[tuple[float, float]], width: int, height: int, log_x: bool, y_max: float | None
    ) -> _Frame:
        x_lo, x_hi = (math.log10(p[0]) if log_x else p[0] for p in (points[0], points[-1]))
        y_lo = min(y for _, y in points)
        y_top = max(y for _, y in points) if y_max is None else y_max
        y_top = max(y_top, y_lo + 1e-12)
        return cls(width, height, log_x, min(x_lo, x_hi), max(x_lo, x_hi), y_lo, y_top)

    def tx(self, x: float) -> float:
        return math.log10(x) if self.log_x else x

    def col(self, x: float) -> int:
        span = (self.x_hi - self.x_lo) or 1.0
        return min(self.width - 1, max(0, round((self.tx(x) - self.x_lo) / span * (self.width - 1))))

    def row(self, y: float) -> int:
        frac = (min(y, self.y_top) - self.y_lo) / (self.y_top - self.y_lo)
        return min(self.height - 1, max(0, round(frac * (self.height - 1))))

    def draw(self, points: list[tuple[float, float]], marks: Mapping[str, float]) -> list[list[str]]:
        """The marks' columns, then one ``*`` per column at the mean of its points."""
        grid = [[" "] * self.width for _ in range(self.height)]
        for x in marks.values():
            if x is None or not math.isfinite(x) or (self.log_x and x <= 0):
                continue
            if not self.x_lo - 1e-9 <= self.tx(x) <= self.x_hi + 1e-9:
                continue  # off the chart: listed in the legend only
            c = self.col(x)
            for r in range(self.height):
                grid[r][c] = "|"
        buckets: dict[int, list[float]] = {}
        for x, y in points:
            buckets.setdefault(self.col(x), []).append(y)
        for c, vals in buckets.items():
            grid[self.row(sum(vals) / len(vals))][c] = "*"
        return grid

    def text(self, grid: list[list[str]], marks: Mapping[str, float], y_label: str) -> str:
        """The grid with its y labels, the x axis and its range, and the marks' legend."""
        width, height, log_x, x_lo, x_hi = self.width, self.height, self.log_x, self.x_lo, self.x_hi
        label_w = max(len(_fmt(self.y_top)), len(_fmt(self.y_lo)), len(y_label))
        lines = []
        for r in range(height - 1, -1, -1):
            if r == height - 1:
                label = _fmt(self.y_top)
            elif r == 0:
                label = _fmt(self.y_lo)
            elif r == height // 2 and y_label:
                label = y_label
            else:
                label = ""
            lines.append(f"{label:>{label_w}} |" + "".join(grid[r]).rstrip())
        lines.append(" " * label_w + " +" + "-" * width)
        lo_txt = _fmt(10**x_lo if log_x else x_lo)
        hi_txt = _fmt(10**x_hi if log_x else x_hi)
        lines.append(" " * (label_w + 2) + lo_txt + hi_txt.rjust(width - len(lo_txt)))
        legend = []
        for name, x in marks.items():
            if x is None or not math.isfinite(x):
                continue
            shown = x > 0 and x_lo - 1e-9 <= self.tx(x) <= x_hi + 1e-9 if log_x else x_lo <= x <= x_hi
            legend.append(f"{'|' if shown else '(off the chart)'} {name} {_fmt(x)}")
        if legend:
            lines.append(" " * (label_w + 2) + "   ".join(legend))
        return "\n".join(lines)
