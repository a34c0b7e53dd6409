"""The AMP pane: GradScaler's loss scale on a log2 axis and the steps it skipped. A scale that
keeps halving means the gradients overflow fp16 again and again, long before the loss is NaN."""

from __future__ import annotations

import math

import numpy as np
from rich.style import Style
from rich.text import Text
from textual.app import RenderResult

from nnwatch.store.schema import FieldName
from nnwatch.tui import format as fmt
from nnwatch.tui.widgets.base import Pane
from nnwatch.tui.widgets.chart import GUTTER, Plot, render_plot, trace_from
from nnwatch.tui.widgets.loss import cursor_column, x_labels


def pow2_axis(
    lo: np.ndarray, hi: np.ndarray, rows: int
) -> tuple[tuple[float, float] | None, list[float]]:
    """Axis limits half a power of two beyond the data, and ticks at whole powers of two."""
    vals = np.concatenate([lo[np.isfinite(lo) & (lo > 0)], hi[np.isfinite(hi) & (hi > 0)]])
    if not len(vals):
        return None, []
    e_lo, e_hi = math.floor(math.log2(vals.min())), math.ceil(math.log2(vals.max()))
    if e_hi == e_lo:
        e_hi += 1
    exps = list(range(e_lo, e_hi + 1))
    stride = max(1, math.ceil(len(exps) / max(rows // 2, 1)))
    ticks = [2.0**e for e in exps[::-1][::stride]]
    return (2.0 ** (e_lo - 0.25), 2.0 ** (e_hi + 0.25)), ticks


class AmpPane(Pane):
    key = "amp"
    redraw_on = frozenset({"cursor", "zoomed"})

    def build(self) -> RenderResult:
        st, view, pal = self.ctx.state, self.ctx, self.ctx.palette
        src = self.ctx.source
        w, h = self.size
        with st.lock:
            measured = st.history.measured(FieldName.AMP_SCALE)
            skipped = st.history.total(FieldName.AMP_SKIPPED)
        if not measured:
            self.border_title = "[b]AMP[/b]"
            self.border_subtitle = ""
            text = Text("no GradScaler in this run", style=pal.muted, justify="center")
            return Text("\n" * max((h - 1) // 2, 0)) + text
        now = st.value_at(FieldName.AMP_SCALE, view.cursor, src)
        recent = st.recent_skips(1000)
        if h <= 2:  # the narrow layout: a one-line summary instead of a chart
            self.border_title = "[b]AMP[/b]"
            self.border_subtitle = ""
            line = Text("scale ", style=pal.muted)
            line.append(fmt.pow2(now), style=pal.primary + Style(bold=True))
            line.append("  skipped ", style=pal.muted)
            line.append(fmt.count(skipped), style=pal.warning if skipped else pal.text)
            if w >= 36:
                line.append(f" ({recent} in last 1k)", style=pal.muted)
            return line
        pw = max(w - GUTTER, 1)
        x0, x1 = st.window(view.zoomed, view.cursor)
        scale = st.columns(FieldName.AMP_SCALE, 2 * pw, x0, x1, src)
        skips = st.columns(FieldName.AMP_SKIPPED, 2 * pw, x0, x1, src)
        markers = {int(d) // 2: ("↓", pal.warning) for d in np.flatnonzero(skips.hi > 0)}
        limits, ticks = pow2_axis(scale.lo, scale.hi, max(h - 2, 1))
        plot = Plot(
            traces=[trace_from(scale, pal.primary)],
            markers={c: m for c, m in markers.items() if c < pw},
            cursor=cursor_column(view.cursor, x0, x1, pw),
            log=True,
            label=fmt.pow2,
            y_limits=limits,
            ticks=ticks,
            x_labels=x_labels(x0, x1),
        )
        self.border_title = f"[b]AMP scale[/b] {fmt.pow2(now)}"
        self.border_subtitle = f"skipped {fmt.count(skipped)} · {recent} in last 1k"
        return render_plot(plot, w, h, pal.muted)
