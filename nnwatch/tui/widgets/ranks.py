"""The ranks pane: one row per rank of a distributed job (step, steps/s, loss, grad norm, status),
so that a straggler or a rank gone NaN stands out at a glance, and the rank being watched is marked.
When a rank stopped, the first one is marked and the others read "stopped" (by the launcher); while
a dead or frozen rank holds the job, the live ones read "waiting", and one line under the table
says who holds whom since when (``nnwatch.store.job_health``).

The rows come from ``JobMonitor.poll()`` in a collector thread (``RankCollector``), which hands the
``JobView`` to :meth:`RanksPane.show`; the pane only lays out what it was given.
"""

from __future__ import annotations

import io
import math
from typing import Any

from rich.console import Console, Group
from rich.style import Style
from rich.table import Table
from rich.text import Text
from textual.app import RenderResult

from nnwatch.tui import format as fmt
from nnwatch.tui.widgets.base import Palette, Pane

COLUMNS = ("RANK", "HOST", "STEP", "STEPS/S", "LOSS", "GRAD NORM", "STATUS")
BAD = frozenset({"nan", "hung", "crashed", "lost", "killed", "exited", "frozen", "stopped"})
#: A rank that is fine itself but held up by another one.
HELD = frozenset({"behind", "waiting"})


def status_style(status: str, pal: Palette) -> Style:
    """Red for a rank that stopped being useful, yellow for one falling behind or held up."""
    if status in BAD:
        return pal.error + Style(bold=True)
    if status in HELD:
        return pal.warning + Style(bold=True)
    if status in ("live", "running"):
        return pal.success
    return pal.muted


def missing_ranges(ranks: tuple[int, ...]) -> list[str]:
    """(2, 3, 4, 7) -> ["2-4", "7"]: ranks on other nodes, in as few words as possible."""
    out: list[str] = []
    start = prev = None
    for r in sorted(ranks):
        if start is not None and prev is not None and r == prev + 1:
            prev = r
            continue
        if start is not None:
            out.append(f"{start}-{prev}" if prev != start else f"{start}")
        start = prev = r
    if start is not None:
        out.append(f"{start}-{prev}" if prev != start else f"{start}")
    return out


class RanksPane(Pane):
    key = "ranks"

    DEFAULT_CSS = """
    RanksPane {
        height: auto;
        max-height: 12;
    }
    """

    def __init__(self, ctx: Any, *, id: str | None = None, classes: str | None = None) -> None:
        super().__init__(ctx, id=id, classes=classes)
        self.view: Any = None  # the latest nnwatch.sources.job_monitor.JobView
        self.border_title = "ranks"

    def show(self, view: Any) -> None:
        """Take a new job view (UI thread) and draw it."""
        self.view = view
        self.redraw()

    def build(self) -> RenderResult:
        pal = self.ctx.palette
        view = self.view
        watching = self.ctx.state.meta.rank
        if view is None:
            world = self.ctx.state.meta.world_size
            return Text(f"looking for the other ranks of this {world}-rank job…", style=pal.muted)
        job = view.job
        self.border_subtitle = f"[ ] switch rank · {len(job.runs)}/{job.world_size} ranks here"
        table = Table(box=None, padding=(0, 1), expand=False, show_edge=False)
        for c in COLUMNS:
            table.add_column(c, style=pal.text, header_style=pal.muted + Style(bold=True),
                             justify="left" if c in ("RANK", "HOST", "STATUS") else "right")  # fmt: skip
        table.add_column("", style=pal.muted)
        origin = set(view.nan_origin)
        stops = getattr(view, "stops", None)
        told = stops.ranks if stops is not None else {}
        for row in view.rows:
            mark = "▶ " if row.rank == watching else "  "
            rank = Text(f"{mark}{row.rank}", style=Style(bold=row.rank == watching))
            status = Text(row.status, style=status_style(row.status, pal))
            if row.rank in told:
                role = told[row.rank]
                lead = role.role in ("first", "holds")
                note = Text(role.short, style=pal.error + Style(bold=True) if lead else pal.muted)
            elif row.rank in origin:
                note = Text("← first NaN", style=pal.error + Style(bold=True))
            else:
                note = Text(row.note, style=pal.muted)
            table.add_row(
                rank,
                row.host,
                fmt.count(row.step),
                fmt.num(row.steps_per_s),
                self._value(row.loss, row, pal),
                self._value(row.grad_norm, row, pal),
                status,
                note,
            )
        lines = [Text(f"  rank {span}: other node", style=pal.muted) for span in missing_ranges(job.missing)]  # fmt: skip
        if stops is not None and stops.summary:
            lines.insert(0, Text(f"  {stops.summary}", style=pal.error + Style(bold=True)))
        return Group(table, *lines) if lines else table

    @staticmethod
    def _value(x: float, row: Any, pal: Palette) -> Text:
        """A number; on a rank that went non-finite, its NaN/inf is shown as such, in red."""
        if row.nonfinite_step is not None and not math.isfinite(x):
            return Text("nan" if math.isnan(x) else fmt.num(x), style=pal.error + Style(bold=True))
        return Text(fmt.num(x))

    @property
    def text(self) -> str:
        """The rows as plain text (tests, and anyone embedding the monitor)."""
        console = Console(width=max(self.size.width, 80), file=io.StringIO(), record=True)
        console.print(self._picture)
        return console.export_text()
