"""A small braille line chart that draws min/max envelopes, so that no spike is ever averaged away.

Each terminal cell holds a 2x4 grid of braille dots. A trace gives, for every dot column, the
lowest and highest value that column summarises; the chart fills the dots between them. A one-step
spike in a million-step run therefore still draws a full-height needle. Reference lines (ln K, the
clip threshold) are dotted, a cursor column is highlighted, and a marker row above the plot flags
spikes and non-finite values. ``render_plot`` is a pure function of arrays; ``ChartPane`` is the
widget base the chart panes share.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np
from rich.style import Style
from rich.text import Text

from nnwatch.tui import format as fmt
from nnwatch.tui.scalar_history import Columns

# dot bits of a braille cell, indexed [row 0..3][column 0..1]
_BITS = np.array([[0x01, 0x08], [0x02, 0x10], [0x04, 0x20], [0x40, 0x80]], dtype=np.int64)
GUTTER = 7  # y labels (6) and the axis line (1)
OFF_TOP, OFF_BOTTOM = "▲", "▽"  # marker-row glyphs of columns the robust range cut off


@dataclass(frozen=True)
class Trace:
    """One series as per-dot-column envelopes (NaN: nothing to draw in that column)."""

    lo: np.ndarray
    hi: np.ndarray
    style: Style
    solo: bool = False  # in cells it owns, show only its own dots (a thin line over a band)
    dotted: bool = False  # draw every other dot column only: a reference that changes over time


@dataclass(frozen=True)
class Rule:
    """A horizontal reference line, dotted, drawn under the traces."""

    value: float
    style: Style


@dataclass
class Plot:
    traces: list[Trace] = field(default_factory=list)
    rules: list[Rule] = field(default_factory=list)
    markers: dict[int, tuple[str, Style]] = field(default_factory=dict)  # cell column -> glyph
    cursor: int | None = None  # cell column of the step cursor
    log: bool = False
    label: Callable[[float], str] = lambda v: fmt.num_fit(v, GUTTER - 1)
    x_labels: tuple[str, str] = ("", "")
    y_min: float | None = None  # force the range to include this value (e.g. 0)
    y_limits: tuple[float, float] | None = None  # exact range in data units (overrides the above)
    ticks: list[float] | None = None  # label these values (at their rows) instead of 3 even rows
    #: The bulk of the data fills the plot: columns far outside the main trace's 5th-95th
    #: percentile band (an exploded loss at 1e35, a one-step grad spike) are cut off and marked
    #: "▲" (above) or "▽" (below) on the marker row, on a linear or a log axis alike. The first
    #: columns (the early steps: the initial loss, the warm-up norms) always stay in range.
    robust: bool = False
    robust_trace: int = 0  # which trace the robust range is taken from (the measured series)
    #: more measured series (an overlaid run): the range covers the bulk of each of them too
    robust_also: tuple[int, ...] = ()

    @property
    def robust_traces(self) -> list[int]:
        wanted = (self.robust_trace, *self.robust_also)
        return [i for i in dict.fromkeys(wanted) if 0 <= i < len(self.traces)]


def trace_from(cols: Columns, style: Style, *, use_mean: bool = False) -> Trace:
    """A trace from reduced columns. A column with no measured value stays NaN and draws nothing:
    gradient norms are measured on some steps only (the probe's cost budget), and a line drawn
    across the unmeasured ones would make a blow-up between two measurements look smooth."""
    lo = cols.mean.copy() if use_mean else cols.lo.copy()
    hi = cols.mean.copy() if use_mean else cols.hi.copy()
    return Trace(lo, hi, style)


def ema_columns(cols: Columns, steps_alpha: float, clamp: float = 10.0) -> np.ndarray:
    """An EMA over column means, with the per-column weight set by how many steps a column holds,
    so that it matches a per-step EMA of the same ``alpha`` sampled at column ends.

    Robust: each input is first clamped to within ``clamp`` times the EMA's own magnitude, so that
    one exploded step (a loss of 1e35) cannot poison the average for thousands of steps after.
    Columns with nothing measured are NaN (drawn as a gap); the average carries on after them.
    """
    out = np.full(cols.n, np.nan)
    acc = math.nan
    for i in range(cols.n):
        m, w = cols.mean[i], cols.weight[i]
        if not math.isfinite(m):
            continue  # nothing measured here: a gap in the average too, never a bridge
        if w <= 0:  # a column the previous point's steps reach into: same average
            out[i] = acc
            continue
        a = 1.0 - (1.0 - steps_alpha) ** w
        if math.isfinite(acc):
            lim = clamp * max(abs(acc), 1e-12)
            acc += a * (min(max(m, acc - lim), acc + lim) - acc)
        else:
            acc = m
        out[i] = acc
    return out


def _transform(v: np.ndarray, log: bool) -> np.ndarray:
    v = np.asarray(v, dtype=np.float64)
    if not log:
        return np.where(np.isfinite(v), v, np.nan)
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.where(np.isfinite(v) & (v > 0), np.log10(np.where(v > 0, v, 1.0)), np.nan)


def _untransform(t: float, log: bool) -> float:
    return 10.0**t if log else t


def y_range(plot: Plot) -> tuple[float, float] | None:
    if plot.y_limits is not None:
        lo, hi = _transform(np.array(plot.y_limits, dtype=np.float64), plot.log)
        if math.isfinite(lo) and math.isfinite(hi) and hi > lo:
            return float(lo), float(hi)
    vals = [_transform(t.lo, plot.log) for t in plot.traces]
    vals += [_transform(t.hi, plot.log) for t in plot.traces]
    flat = np.concatenate([v[np.isfinite(v)] for v in vals]) if vals else np.zeros(0)
    if not len(flat):
        return None
    lo, hi = float(flat.min()), float(flat.max())
    if plot.robust and plot.robust_traces:
        # the union of each measured series' own robust range: an overlaid run whose bulk lies
        # elsewhere (a diverged run beside a healthy one) stays on the plot, spikes still do not
        ranges = [robust_limits(plot.traces[i], plot.log, lo, hi) for i in plot.robust_traces]
        lo, hi = min(r[0] for r in ranges), max(r[1] for r in ranges)
    span = max(hi - lo, abs(hi) * 0.05, 1e-12)
    # a reference line joins the range only when it is near the data: ln(K) far above a zoomed-in
    # late-training loss would squash the curve into one row
    for r in _transform(np.array([r.value for r in plot.rules], dtype=np.float64), plot.log):
        if math.isfinite(r) and lo - span <= r <= hi + span:
            lo, hi = min(lo, r), max(hi, r)
    if plot.y_min is not None:
        m = float(_transform(np.array([plot.y_min]), plot.log)[0])
        if math.isfinite(m):
            lo = min(lo, m)
    if hi - lo < 1e-12:
        pad = abs(hi) * 0.05 or 0.5
        return lo - pad, hi + pad
    pad = (hi - lo) * 0.04
    low = lo - (pad if plot.y_min is None else 0.0)
    if not plot.log and lo >= 0 > low:
        low = 0.0  # never pad a non-negative series (a loss, a norm) below zero
    return low, hi + pad


#: A column is off scale when it lies further than this many bulk-widths outside the bulk.
OUTLIER_REACH = 0.5
EARLY_SHARE = 0.03  # the first 3% of the columns (at least 2) always stay on the plot
FENCE = 6.0  # ... and beyond this many interquartile ranges outside the middle half


def robust_limits(trace: Trace, log: bool, lo: float, hi: float) -> tuple[float, float]:
    """(lo, hi) narrowed to the bulk of ``trace`` when a few columns lie far outside it.

    The bulk is the 5th-95th percentile band of the trace's column lows and highs. Only values
    further than ``OUTLIER_REACH`` bulk-widths beyond it are cut; the range then ends at the
    furthest value that is not cut, so a smooth trend is never clipped, only isolated spikes and
    blow-ups (and a lasting blow-up, through far-out fences on the interquartile range). The first
    columns (the early steps) are always kept in range."""
    los, his = _transform(trace.lo, log), _transform(trace.hi, log)
    ok = np.isfinite(los) & np.isfinite(his)
    if ok.sum() < 8:
        return lo, hi
    lv, hv = los[ok], his[ok]
    b_lo, b_hi = float(np.percentile(lv, 5)), float(np.percentile(hv, 95))
    span = max(b_hi - b_lo, abs(b_hi) * 0.05, 1e-12)
    cut_hi, cut_lo = b_hi + OUTLIER_REACH * span, b_lo - OUTLIER_REACH * span
    # a blow-up that lasts (an exploded run: 1e24 for a fifth of the steps) is part of the
    # 5-95% band itself; far-out fences on the interquartile range still find the bulk
    q1, q3 = float(np.percentile(lv, 25)), float(np.percentile(hv, 75))
    iqr = q3 - q1
    if iqr > 0:
        cut_hi = min(cut_hi, q3 + FENCE * iqr)
        cut_lo = max(cut_lo, q1 - FENCE * iqr)
    first = np.flatnonzero(ok)[: max(2, int(EARLY_SHARE * ok.sum()))]
    early_lo, early_hi = float(los[first].min()), float(his[first].max())
    new_hi, new_lo = hi, lo
    if hi > cut_hi:
        kept = hv[hv <= cut_hi]
        new_hi = max(float(kept.max()) if len(kept) else b_hi, early_hi)
    if lo < cut_lo:
        kept = lv[lv >= cut_lo]
        new_lo = min(float(kept.min()) if len(kept) else b_lo, early_lo)
    return new_lo, new_hi


def render_plot(
    plot: Plot, width: int, height: int, muted: Style, empty: str = "no data yet"
) -> Text:
    """The chart as ``height`` lines of ``width`` cells (gutter, marker row, plot, x labels)."""
    width, height = max(width, 1), max(height, 1)
    text = Text(no_wrap=True, overflow="crop", end="")
    pw = width - GUTTER
    show_x = height >= 8 and any(plot.x_labels)
    ph = height - 1 - (1 if show_x else 0)  # the first row is for markers
    rng = y_range(plot)
    if pw < 4 or ph < 1 or rng is None:
        lines = [""] * height
        lines[min(height // 2, height - 1)] = empty.center(width)[:width]
        text.append("\n".join(lines), style=muted)
        return text
    y_lo, y_hi = rng
    if plot.robust:
        _mark_off_scale(plot, pw * 2, y_lo, y_hi)
    grid = _Grid(plot, ph, pw, y_lo, y_hi)
    bits, owner = grid.cells()
    _draw(text, plot, bits, owner, grid.styles, _y_labels(ph, y_lo, y_hi, plot), muted)
    if show_x:
        left, right = plot.x_labels
        text.append("\n")
        text.append(" " * (GUTTER - 1) + "└", style=muted)
        room = pw - len(left) - len(right)
        text.append(left + " " * max(room, 1) + right if room > 0 else left[:pw], style=muted)
    return text


def _mark_off_scale(plot: Plot, dots_wide: int, y_lo: float, y_hi: float) -> None:
    """Mark what the robust range cut off, the main series' marks first."""
    marked: set[int] = set()
    for i in plot.robust_traces:
        main = plot.traces[i]
        tops = _fit(_transform(main.hi, plot.log), dots_wide)
        bottoms = _fit(_transform(main.lo, plot.log), dots_wide)
        # an off-scale marker replaces a spike marker (it says more: the top is cut), never a
        # non-finite one
        for dots, glyph in (
            (np.flatnonzero(np.isfinite(tops) & (tops > y_hi)), OFF_TOP),
            (np.flatnonzero(np.isfinite(bottoms) & (bottoms < y_lo)), OFF_BOTTOM),
        ):
            for dot in dots:
                col = int(dot) // 2
                if col not in marked and plot.markers.get(col, ("",))[0] != "✕":
                    plot.markers[col] = (glyph, main.style)
        marked |= {c for c, (g, _) in plot.markers.items() if g in (OFF_TOP, OFF_BOTTOM)}


class _Grid:
    """The plot's traces and rules as braille bits per cell, each cell owned by one of them."""

    def __init__(self, plot: Plot, ph: int, pw: int, y_lo: float, y_hi: float) -> None:
        self.plot, self.ph, self.pw, self.y_lo, self.y_hi = plot, ph, pw, y_lo, y_hi
        self.P, self.D = ph * 4, pw * 2
        self.styles: list[Style] = [t.style for t in plot.traces] + [r.style for r in plot.rules]

    def to_px(self, v: np.ndarray) -> np.ndarray:
        t = _transform(v, self.plot.log)
        px: np.ndarray = np.round((self.y_hi - t) / (self.y_hi - self.y_lo) * (self.P - 1))
        return px

    def trace_bits(self, tr: Trace) -> np.ndarray:
        P, D = self.P, self.D
        top, bot = self.to_px(_fit(tr.hi, D)), self.to_px(_fit(tr.lo, D))
        ok = np.isfinite(top) & np.isfinite(bot)
        top = np.where(ok, np.clip(top, 0, P - 1), 0)
        bot = np.where(ok, np.clip(bot, 0, P - 1), -1)
        # connect each column to the one before it, so steep moves draw as lines, not dots; a
        # column with nothing measured (NaN) is left blank and breaks the line: a gap, not a bridge
        pt, pb = np.r_[np.nan, top[:-1]], np.r_[np.nan, bot[:-1]]
        pok = np.r_[False, ok[:-1]] & ok
        top = np.where(pok & (top > pb), pb, top)
        bot = np.where(pok & (bot < pt), pt, bot)
        rows = np.arange(P)[:, None]
        mask = (rows >= top[None, :]) & (rows <= bot[None, :]) & ok[None, :]
        if tr.dotted:
            mask[:, 1::2] = False
        return _cells(mask, self.ph, self.pw)

    def rule_bits(self, rule: Rule) -> np.ndarray:
        p = self.to_px(np.array([rule.value]))[0]
        mask = np.zeros((self.P, self.D), dtype=bool)
        if math.isfinite(p) and 0 <= p <= self.P - 1:
            mask[int(p), ::2] = True
        return _cells(mask, self.ph, self.pw)

    def cells(self) -> tuple[np.ndarray, np.ndarray]:
        """(bits, owner) per cell. A cell has one colour: that of the highest-priority trace in
        it (the last one), else of the first rule in it. It shows the dots of every trace in it,
        so no trace hides another's shape."""
        plot, ph, pw = self.plot, self.ph, self.pw
        cell_bits = [self.trace_bits(tr) for tr in plot.traces]
        rule_bits = [self.rule_bits(rule) for rule in plot.rules]
        stack = np.stack(cell_bits + rule_bits) if (cell_bits or rule_bits) else np.zeros((1, ph, pw))
        nt = len(cell_bits)
        owner = np.full((ph, pw), -1)
        for k in range(len(rule_bits) - 1, -1, -1):
            owner = np.where(stack[nt + k] > 0, nt + k, owner)
        for k in range(nt):
            owner = np.where(stack[k] > 0, k, owner)
        own_bits = np.take_along_axis(stack, np.maximum(owner, 0)[None], 0)[0]
        bits = np.where(owner >= 0, own_bits, 0)
        if nt:
            union = np.bitwise_or.reduce(stack[:nt].astype(np.int64), axis=0)
            solo = np.array([t.solo for t in plot.traces])
            shared = (owner >= 0) & (owner < nt) & ~solo[np.clip(owner, 0, nt - 1)]
            bits = np.where(shared, union, bits)
        return bits, owner


def _draw(
    text: Text,
    plot: Plot,
    bits: np.ndarray,
    owner: np.ndarray,
    styles: list[Style],
    labels: dict[int, str],
    muted: Style,
) -> None:
    """The marker row, then each plot row behind its y label."""
    ph, pw = bits.shape
    cursor_bg = Style(reverse=True)
    text.append(" " * GUTTER)
    line = [" "] * pw
    mstyles: list[Style | None] = [None] * pw
    for col, (glyph, st) in plot.markers.items():
        if 0 <= col < pw:
            line[col], mstyles[col] = glyph, st
    _append_runs(text, line, mstyles, plot.cursor, cursor_bg)
    for r in range(ph):
        text.append("\n")
        label = labels.get(r)
        text.append((label or "").rjust(GUTTER - 1)[: GUTTER - 1], style=muted)
        text.append("┤" if label else "│", style=muted)
        chars = [chr(0x2800 + int(b)) if b else " " for b in bits[r]]
        cstyles = [styles[o] if o >= 0 else None for o in owner[r]]
        _append_runs(text, chars, cstyles, plot.cursor, cursor_bg)


def _fit(v: np.ndarray, n: int) -> np.ndarray:
    """Pad or crop a per-dot-column array to exactly ``n`` columns."""
    if len(v) == n:
        return v.astype(np.float64)
    out = np.full(n, np.nan)
    out[: min(n, len(v))] = v[:n]
    return out


def _cells(mask: np.ndarray, ph: int, pw: int) -> np.ndarray:
    """(4*ph, 2*pw) dots -> (ph, pw) braille bit patterns."""
    cells: np.ndarray = (mask.reshape(ph, 4, pw, 2) * _BITS[None, :, None, :]).sum(axis=(1, 3))
    return cells


def _y_labels(ph: int, y_lo: float, y_hi: float, plot: Plot) -> dict[int, str]:
    def at(r: int) -> str:
        # the value at the middle of cell row r
        frac = (r * 4 + 1.5) / max(ph * 4 - 1, 1)
        return plot.label(_untransform(y_hi - frac * (y_hi - y_lo), plot.log))

    if plot.ticks:
        out: dict[int, str] = {}
        P = ph * 4
        for value in plot.ticks:
            t = _transform(np.array([value]), plot.log)[0]
            if not math.isfinite(t) or not y_lo <= t <= y_hi:
                continue
            row = int(round((y_hi - t) / (y_hi - y_lo) * (P - 1))) // 4
            if 0 <= row < ph and row not in out and row - 1 not in out and row + 1 not in out:
                out[row] = plot.label(value)
        return out
    out = {0: at(0)}
    if ph >= 2:
        out[ph - 1] = at(ph - 1)
    if ph >= 5:
        out[ph // 2] = at(ph // 2)
    return out


def _append_runs(
    text: Text,
    chars: list[str],
    styles: list[Style | None],
    cursor: int | None,
    cursor_style: Style,
) -> None:
    """Append one row, merging neighbouring cells of the same style into one span."""
    run: list[str] = []
    current: Style | None = None
    for i, (ch, st) in enumerate(zip(chars, styles, strict=True)):
        if cursor is not None and i == cursor:
            st = (st or Style()) + cursor_style
            if ch == " ":
                ch = "│"
        if st != current and run:
            text.append("".join(run), style=current)
            run = []
        current = st
        run.append(ch)
    if run:
        text.append("".join(run), style=current)
