"""A plain-text line chart, so a curve can be read in any terminal, log file or CI output.

Deliberately free of rich/textual: the checks run headless (in CI, over SSH, inside a pipe).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence


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

    def tx(x: float) -> float:
        return math.log10(x) if log_x else x

    x_lo, x_hi = tx(points[0][0]), tx(points[-1][0])
    x_lo, x_hi = min(x_lo, x_hi), max(x_lo, x_hi)
    span = (x_hi - x_lo) or 1.0
    y_lo = min(y for _, y in points)
    y_top = max(y for _, y in points) if y_max is None else y_max
    y_top = max(y_top, y_lo + 1e-12)

    def col(x: float) -> int:
        return min(width - 1, max(0, round((tx(x) - x_lo) / span * (width - 1))))

    def row(y: float) -> int:
        frac = (min(y, y_top) - y_lo) / (y_top - y_lo)
        return min(height - 1, max(0, round(frac * (height - 1))))

    grid = [[" "] * width for _ in range(height)]
    for x in (marks or {}).values():
        if x is None or not math.isfinite(x) or (log_x and x <= 0):
            continue
        if not x_lo - 1e-9 <= tx(x) <= x_hi + 1e-9:
            continue  # off the chart: listed in the legend only
        c = col(x)
        for r in range(height):
            grid[r][c] = "|"
    buckets: dict[int, list[float]] = {}
    for x, y in points:
        buckets.setdefault(col(x), []).append(y)
    for c, vals in buckets.items():
        grid[row(sum(vals) / len(vals))][c] = "*"

    label_w = max(len(_fmt(y_top)), len(_fmt(y_lo)), len(y_label))
    lines = []
    for r in range(height - 1, -1, -1):
        if r == height - 1:
            label = _fmt(y_top)
        elif r == 0:
            label = _fmt(y_lo)
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
    for name, x in (marks or {}).items():
        if x is None or not math.isfinite(x):
            continue
        shown = x > 0 and x_lo - 1e-9 <= tx(x) <= x_hi + 1e-9 if log_x else x_lo <= x <= x_hi
        legend.append(f"{'|' if shown else '(off the chart)'} {name} {_fmt(x)}")
    if legend:
        lines.append(" " * (label_w + 2) + "   ".join(legend))
    return "\n".join(lines)
