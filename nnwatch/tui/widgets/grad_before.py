"""The grad norms of the steps before a snapshot, beside its batch: did the norm climb for fifty
steps, or did one batch blow it up? Same chart as the dashboard (robust range, ``g`` for log,
unmeasured steps as gaps), with the snapshot's own step under the cursor column."""

from __future__ import annotations

import math

import numpy as np
from rich.text import Text
from textual.app import RenderResult
from textual.widget import Widget

from nnwatch.tui import format as fmt
from nnwatch.tui.widgets.base import Palette
from nnwatch.tui.widgets.chart import GUTTER, Plot, Trace, render_plot


def per_dot_column(
    steps: np.ndarray, values: np.ndarray, first: int, last: int, d: int
) -> np.ndarray:
    """Each step's value spread over the dot columns it covers (NaN where it was not measured)."""
    out = np.full(d, np.nan)
    n = last - first + 1
    for s, v in zip(steps, values, strict=True):
        a = int((s - first) * d / n)
        b = max(a + 1, int((s - first + 1) * d / n))
        out[a:b] = v
    return out


class GradBeforeChart(Widget):
    """Renders what ``show`` was given; the screen calls ``show`` again on resize or ``g``."""

    DEFAULT_CSS = """
    GradBeforeChart {
        border: round $panel-lighten-2;
        border-title-color: $text;
        border-subtitle-color: $text-muted;
        padding: 0 1;
        height: 1fr;
    }
    """

    def __init__(self, *, id: str | None = None) -> None:
        super().__init__(id=id)
        self.steps = np.zeros(0, dtype=np.int64)
        self.values = np.zeros(0)
        self.step = 0
        self.bad_last = False
        self.log_axis = False
        self.palette = Palette.from_variables({})
        self.border_title = "[b]Grad norm before the snapshot[/b]"

    def show(
        self,
        steps: np.ndarray,
        values: np.ndarray,
        step: int,
        *,
        bad_last: bool,
        log: bool,
        palette: Palette,
    ) -> None:
        self.steps, self.values, self.step = steps, values, step
        self.bad_last, self.log_axis, self.palette = bad_last, log, palette
        before = values[steps < step] if len(steps) else values
        fin = before[np.isfinite(before)]
        last = float(fin[-1]) if len(fin) else math.nan
        self.border_title = (
            f"[b]Grad norm[/b] before step {fmt.count(step)}: last {fmt.num(last)}"
            + (f" · max {fmt.num(float(fin.max()))}" if len(fin) else "")
        )
        span = f"steps {fmt.count(steps[0])}-{fmt.count(steps[-1])}" if len(steps) else "no steps"
        self.border_subtitle = f"{span} · {'log' if log else 'linear'} (g)"
        self.refresh()

    def render(self) -> RenderResult:
        w, h = self.size
        pal = self.palette
        if not len(self.steps):
            return Text("no grad-norm history for this snapshot", style=pal.muted)
        pw = max(w - GUTTER, 1)
        first, last = int(self.steps[0]), int(max(self.steps[-1], self.step))
        vals = per_dot_column(self.steps, self.values, first, last, 2 * pw)
        n = last - first + 1
        cursor = min(int((self.step - first) * pw / n), pw - 1)
        markers = {cursor: ("✕", pal.error)} if self.bad_last else {}
        plot = Plot(
            traces=[Trace(vals, vals, pal.primary)],
            markers=markers,
            cursor=cursor,
            log=self.log_axis,
            x_labels=(fmt.count(first), fmt.count(last)),
            robust=True,
        )
        return render_plot(plot, w, h, pal.muted, empty="no measured grad norm")
