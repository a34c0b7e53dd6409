"""The gradient-norm pane: the norm before clipping against the clip threshold, the norm after it,
how often clipping fired lately, and markers where the norm spiked: the usual first sign of an
explosion, several steps before the loss shows it."""

from __future__ import annotations

import math

import numpy as np
from textual.app import RenderResult

from nnwatch.store.schema import FieldName
from nnwatch.tui import format as fmt
from nnwatch.tui.scalar_history import Columns
from nnwatch.tui.widgets.base import Pane
from nnwatch.tui.widgets.chart import GUTTER, Plot, Trace, render_plot, trace_from
from nnwatch.tui.widgets.compare import (
    chart_window,
    legend,
    overlay_columns,
    overlay_trace,
    overlay_value,
)
from nnwatch.tui.widgets.loss import (
    bad_markers,
    cursor_column,
    off_scale,
    window_caption,
    x_labels,
)

SPIKE_FACTOR = 5.0  # a column whose max exceeds 5x the local median of means is a spike
SPIKE_WINDOW = 15


def spike_columns(
    cols: Columns, factor: float = SPIKE_FACTOR, window: int = SPIKE_WINDOW
) -> np.ndarray:
    """Dot columns whose maximum towers over the median level around them."""
    mean, hi = cols.mean, cols.hi
    n = len(mean)
    if n == 0 or not np.isfinite(mean).any():
        return np.zeros(0, dtype=np.int64)
    half = window // 2
    padded = np.pad(mean, half, mode="edge")
    win = np.lib.stride_tricks.sliding_window_view(padded, window)[:n]
    with np.errstate(all="ignore"):
        import warnings

        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)
            level = np.nanmedian(win, axis=1)
        return np.flatnonzero(
            np.isfinite(hi) & np.isfinite(level) & (hi > factor * level) & (level > 0)
        )


class GradPane(Pane):
    key = "grad"
    redraw_on = frozenset({"cursor", "log_scale", "overlay", "zoomed"})

    def build(self) -> RenderResult:
        st, view, pal = self.ctx.state, self.ctx, self.ctx.palette
        src = self.ctx.source
        w, h = self.size
        pw = max(w - GUTTER, 1)
        x0, x1 = chart_window(self.ctx)
        pre = st.columns(FieldName.GRAD_NORM, 2 * pw, x0, x1, src)
        post = st.columns(FieldName.GRAD_NORM_CLIPPED, 2 * pw, x0, x1, src)
        clip = st.value_at(FieldName.CLIP_THRESHOLD, view.cursor, src)
        thresholds = st.columns(FieldName.CLIP_THRESHOLD, 2 * pw, x0, x1, src)
        markers = bad_markers(pre, pw, "✕", pal.error)
        for dot in spike_columns(pre):
            markers.setdefault(int(dot) // 2, ("▼", pal.warning))
        traces = [
            # the threshold is a series, not a constant: `c` (or the script) can change it
            Trace(thresholds.lo, thresholds.hi, pal.error, solo=True, dotted=True),
            trace_from(pre, pal.primary),
            trace_from(post, pal.success),
        ]
        other = overlay_columns(self.ctx, FieldName.GRAD_NORM, 2 * pw, x0, x1)
        if other is not None:  # the other run's norm before clipping, as the main one's
            traces.append(overlay_trace(other, self.ctx))
            for c, m in bad_markers(other, pw, "✕", pal.overlay).items():
                markers.setdefault(c, m)
        plot = Plot(
            traces=traces,
            markers={c: m for c, m in markers.items() if c < pw},
            cursor=cursor_column(view.cursor, x0, x1, pw),
            log=view.log_scale,  # `g`, as for every chart; spikes never flatten the rest:
            robust=True,  # they go off scale (▲) and the bulk of the norms fills the plot
            robust_trace=1,
            robust_also=(3,) if other is not None else (),
            x_labels=x_labels(x0, x1),
        )
        self.border_title = self._title(clip, compact=w < 56, overlaid=other is not None)
        picture = render_plot(plot, w, h, pal.muted)
        compact = w < 56
        share = st.recent_clip_share(100)
        sub = window_caption(view.zoomed, view.log_scale, view.cursor, compact)
        if off_scale(plot) and not compact:
            sub = f"▲ off scale (g: log) · {sub}"
        if math.isfinite(share):
            clipped = (
                f"clip {fmt.percent(share)}/100"
                if compact
                else f"clipped {fmt.percent(share)} of last 100"
            )
            sub = f"{clipped} · {sub}"
        self.border_subtitle = sub
        return picture

    def _title(self, clip: float, *, compact: bool, overlaid: bool) -> str:
        """The norm at the cursor (beside the overlaid run's), after clipping, and the max."""
        st, view, src = self.ctx.state, self.ctx, self.ctx.source
        norm = st.value_at(FieldName.GRAD_NORM, view.cursor, src, measured=True)
        after = st.value_at(FieldName.GRAD_NORM_CLIPPED, view.cursor, src, measured=True)
        name = "Grad" if compact or overlaid else "Grad norm"
        if overlaid:
            theirs = overlay_value(self.ctx, FieldName.GRAD_NORM, measured=True)
            title = f"[b]{name}[/b] {legend(self.ctx, norm, theirs, compact)}"
        else:
            title = f"[b]{name}[/b] {fmt.num(norm)}"
        if math.isfinite(after) and not compact and not overlaid:
            title += f"  [$success]━ clipped {fmt.num(after)}[/]"
        if math.isfinite(clip):
            title += f"  [$error]┄ max {fmt.num(clip)}[/]"
        return title
