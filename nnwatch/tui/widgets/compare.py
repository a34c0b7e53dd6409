"""What the chart panes share to draw a second run over the main one (``o``): the step window
both runs are drawn in, the overlaid run's series as a trace, and the legend naming both runs.

Alignment is by step: both runs are reduced into the same columns over the same step range, so a
column holds the same steps in each. Steps one run never reached stay blank for it (a gap, never
a bridge), and the chart's robust range covers the bulk of both series (``Plot.robust_also``).
"""

from __future__ import annotations

import math

from textual.markup import escape  # border titles are Textual markup

from nnwatch.tui import format as fmt
from nnwatch.tui.scalar_history import Columns
from nnwatch.tui.widgets.base import PaneContext
from nnwatch.tui.widgets.chart import Trace

LABEL_WIDE, LABEL_COMPACT = 24, 10


def chart_window(ctx: PaneContext) -> tuple[float, float]:
    """The steps the charts show. With an overlay the whole-run view spans both runs (a short
    run beside a long one shows where it stands); the 500-step zoom follows the main run."""
    x0, x1 = ctx.state.window(ctx.zoomed, ctx.cursor)
    ov = ctx.overlay
    if ov is None or ctx.zoomed:
        return x0, x1
    first, last = ov.state.step_bounds()
    if not math.isfinite(first):
        return x0, x1
    main_first, _ = ctx.state.step_bounds()
    if not math.isfinite(main_first):
        return first, max(last, first + 1)
    return min(x0, first), max(x1, last)


def overlay_columns(
    ctx: PaneContext, field: str, ncols: int, x0: float, x1: float
) -> Columns | None:
    ov = ctx.overlay
    if ov is None:
        return None
    return ov.state.columns(field, ncols, x0, x1, ov.source)


def overlay_trace(cols: Columns, ctx: PaneContext) -> Trace:
    """The overlaid run's min/max envelope, in its own colour; ``solo`` so that in a cell both
    runs cross, its dots are not mistaken for the main run's."""
    return Trace(cols.lo.copy(), cols.hi.copy(), ctx.palette.overlay, solo=True)


def overlay_value(ctx: PaneContext, field: str, measured: bool = False) -> float:
    """The overlaid run's value at the cursor step (or its latest), for the legend."""
    ov = ctx.overlay
    if ov is None:
        return math.nan
    return ov.state.value_at(field, ctx.cursor, ov.source, measured=measured)


def legend(ctx: PaneContext, main_value: float, other_value: float, compact: bool) -> str:
    """``━ main 2.31  ━ other 2.45`` in the two runs' colours (Textual markup, for a title);
    narrow: ``━ 2.31 ━ other 2.45``, the main run being named in the header."""
    ov = ctx.overlay
    if ov is None:
        return ""
    width = LABEL_COMPACT if compact else LABEL_WIDE
    mine = escape(fmt.shorten_middle(ov.main_label or ctx.state.meta.name, width))
    theirs = escape(fmt.shorten_middle(ov.label, width))
    color = ctx.palette.overlay.color
    hexcolor = color.triplet.hex if color is not None and color.triplet is not None else "magenta"
    theirs_part = f"[{hexcolor}]━ {theirs} {fmt.num(other_value)}[/]"
    if compact:  # the header names the main run; its colour key is enough here
        return f"[$primary]━[/] {fmt.num(main_value)} {theirs_part}"
    return f"[$primary]━ {mine}[/] {fmt.num(main_value)}  {theirs_part}"


def run_labels(main: str, other: str, main_pid: int, other_pid: int) -> tuple[str, str]:
    """Names for the legend that tell two runs apart, even two runs of the same script."""
    if main != other:
        return main, other
    return f"{main}:{main_pid}", f"{other}:{other_pid}"
