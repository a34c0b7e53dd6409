"""The loss pane: the whole history (or the last 500 steps) as a min/max envelope, its EMA, and the
ln(K) line a classifier starts at, so "is it learning at all?" is answered at a glance."""

from __future__ import annotations

import math

import numpy as np
from rich.style import Style
from textual.app import RenderResult

from nnwatch.tui import format as fmt
from nnwatch.tui.model import ZOOM_STEPS
from nnwatch.tui.scalar_history import Columns
from nnwatch.tui.widgets.base import Pane
from nnwatch.tui.widgets.chart import (
    GUTTER,
    OFF_BOTTOM,
    OFF_TOP,
    Plot,
    Rule,
    Trace,
    ema_columns,
    render_plot,
    trace_from,
)
from nnwatch.tui.widgets.compare import (
    chart_window,
    legend,
    overlay_columns,
    overlay_trace,
    overlay_value,
)

EMA_ALPHA = 0.02  # per step: an EMA over roughly the last 100 steps


def cursor_column(cursor: float | None, x0: float, x1: float, pw: int) -> int | None:
    if cursor is None or not math.isfinite(cursor):
        return None
    col = int((cursor - x0) * pw / max(x1 - x0 + 1.0, 1.0))
    return col if 0 <= col < pw else None


def bad_markers(cols: Columns, pw: int, glyph: str, style: Style) -> dict[int, tuple[str, Style]]:
    """Marker-row glyphs over the cell columns whose dot columns held a non-finite value."""
    out: dict[int, tuple[str, Style]] = {}
    for dot in np.flatnonzero(cols.bad > 0):
        out[int(dot) // 2] = (glyph, style)
    return {c: m for c, m in out.items() if c < pw}


def off_scale(plot: Plot) -> bool:
    """Whether the robust range cut a column off (its marker is on the marker row)."""
    return any(glyph in (OFF_TOP, OFF_BOTTOM) for glyph, _ in plot.markers.values())


def x_labels(x0: float, x1: float) -> tuple[str, str]:
    return (fmt.count(x0), fmt.count(x1))


def window_caption(zoomed: bool, log: bool, cursor: float | None, compact: bool = False) -> str:
    if compact:
        span = f"last {ZOOM_STEPS}" if zoomed else "all"
        return f"{span} · {'log' if log else 'lin'}" + ("" if cursor is None else " · cursor")
    span = f"last {ZOOM_STEPS}" if zoomed else "whole run"
    where = "" if cursor is None else f" · cursor {fmt.count(cursor)}"
    return f"{span} · {'log' if log else 'linear'}{where}"


class LossPane(Pane):
    key = "loss"
    redraw_on = frozenset({"cursor", "log_scale", "overlay", "zoomed"})

    def build(self) -> RenderResult:
        st, view, pal = self.ctx.state, self.ctx, self.ctx.palette
        w, h = self.size
        pw = max(w - GUTTER, 1)
        x0, x1 = chart_window(self.ctx)
        cols = st.columns("loss", 2 * pw, x0, x1, self.ctx.source)
        ema = ema_columns(cols, EMA_ALPHA)
        k = st.meta.num_classes
        rules = [Rule(math.log(k), pal.muted)] if k and k > 1 else []
        traces = [trace_from(cols, pal.primary), Trace(ema, ema, pal.accent, solo=True)]
        other = overlay_columns(self.ctx, "loss", 2 * pw, x0, x1)
        markers = bad_markers(cols, pw, "✕", pal.error)
        if other is not None:
            traces.append(overlay_trace(other, self.ctx))
            for c, m in bad_markers(other, pw, "✕", pal.overlay).items():
                markers.setdefault(c, m)
        plot = Plot(
            traces=traces,
            rules=rules,
            markers=markers,
            cursor=cursor_column(view.cursor, x0, x1, pw),
            log=view.log_scale,
            x_labels=x_labels(x0, x1),
            robust=True,
            robust_also=(2,) if other is not None else (),
        )
        value = st.value_at("loss", view.cursor, self.ctx.source)
        ema_now = st.ema("loss", EMA_ALPHA) if view.cursor is None else _last_finite(ema)
        compact = w < 56
        if other is not None:  # the legend names both runs, in their colours
            both = legend(self.ctx, value, overlay_value(self.ctx, "loss"), compact)
            title = f"[b]Loss[/b] {both}"
            if not compact:
                title += f"  [$accent]━ ema {fmt.num(ema_now)}[/]"
        else:
            title = f"[b]Loss[/b] {fmt.num(value)}  [$accent]━ ema {fmt.num(ema_now)}[/]"
            if k and k > 1 and not compact:
                title += f"  [$foreground-muted]┄ ln({k}) {fmt.num(math.log(k))}[/]"
        self.border_title = title
        picture = render_plot(plot, w, h, pal.muted)
        capped = off_scale(plot)
        caption = window_caption(view.zoomed, view.log_scale, view.cursor, compact)
        self.border_subtitle = (
            "▲ off scale (g: log) · " if capped and not compact else ""
        ) + caption
        return picture


def _last_finite(a: np.ndarray) -> float:
    ok = np.flatnonzero(np.isfinite(a))
    return float(a[ok[-1]]) if len(ok) else math.nan
