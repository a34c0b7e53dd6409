"""The ranks pane: one row per rank of a distributed job, built for 64 ranks and more.

Each row: rank, host, step, lag behind the leading rank, steps/s, loss, grad norm, memory and
status. Above the table a heat strip draws every rank's usual step time as one cell, coloured
against the job's median, so one straggler among 256 ranks stands out at a glance; under it the
job-level findings (the rank that died first or holds the job, stragglers with their host, a rank
whose loss or grad norm is far from the others', the first non-finite rank) and, while the job is
stuck, where its ranks are (their stacks, folded, in one line). Hosts that could not
be reached are listed as such, never hidden, and ranks no reader has seen are named in ranges.

``s`` cycles the sort (worst first by default: stopped, then non-finite, then lagging), the arrow
keys move the cursor and Enter opens that rank's full dashboard (``RanksPane.RankChosen``). The
rows come from a collector thread (``JobMonitor``, rank 0's job summary, or the SSH fan-out); the
pane only lays out what :meth:`RanksPane.show` was given.
"""

from __future__ import annotations

import io
import math
from typing import Any, ClassVar

import numpy as np
from rich.console import Console, Group
from rich.style import Style
from rich.table import Table
from rich.text import Text
from textual.app import RenderResult
from textual.binding import Binding, BindingType
from textual.message import Message

from nnwatch.sources.job_stacks import group, span
from nnwatch.store.schema import FieldName
from nnwatch.tui import format as fmt
from nnwatch.tui.widgets.base import Palette, Pane

COLUMNS = ("RANK", "HOST", "STEP", "LAG", "STEPS/S", "LOSS", "GRAD NORM", "MEM", "STATUS")
BAD = frozenset({"nan", "hung", "crashed", "lost", "killed", "exited", "frozen", "stopped",
                 "victim", "unreachable"})  # fmt: skip
#: A rank that is fine itself but held up by another one.
HELD = frozenset({"behind", "waiting"})
#: Sort orders ``s`` cycles through: (name, key on a row).
SORTS: tuple[str, ...] = ("worst", "rank", "lag", "steps/s", "loss", "grad norm", "memory", "host")
_SEVERITY = {"first": 0, "holds": 1}
HEAT = "█"


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


def unseen_ranges(world_size: int, seen: set[int], most: int = 64) -> list[str]:
    """The ranks of ``range(world_size)`` not in ``seen``, as ranges (see :func:`missing_ranges`),
    from the seen ranks alone: a job that says it has a million ranks costs what it shows. At
    most ``most`` ranges, then how many more."""
    out: list[str] = []
    start = 0
    for r in sorted(x for x in seen if 0 <= x < world_size):
        if r > start:
            out.append(f"{start}-{r - 1}" if r - 1 > start else f"{start}")
        start = r + 1
    if start < world_size:
        out.append(f"{start}-{world_size - 1}" if world_size - 1 > start else f"{start}")
    return out if len(out) <= most else [*out[:most], f"... and {len(out) - most} more ranges"]


def _nan_last(x: float | None, reverse: bool = False) -> float:
    if x is None or not math.isfinite(x):
        return math.inf
    return -x if reverse else x


def sort_rows(rows: tuple[Any, ...], order: str) -> list[Any]:
    """The rows in ``order`` (one of :data:`SORTS`); unknown values last, ties by rank."""
    def worst(r: Any) -> tuple[float, ...]:
        bad = 0 if r.role in _SEVERITY else 1 if r.status in BAD else 2 if r.status in HELD else 3
        return (bad, _SEVERITY.get(r.role, 9), -float(r.behind), float(r.rank))

    keys: dict[str, Any] = {
        "worst": worst,
        "rank": lambda r: r.rank,
        "lag": lambda r: (-r.behind, r.rank),
        "steps/s": lambda r: (_nan_last(r.steps_per_s), r.rank),  # slowest first
        "loss": lambda r: (_nan_last(r.loss, reverse=True), r.rank),  # highest first
        "grad norm": lambda r: (_nan_last(r.grad_norm, reverse=True), r.rank),
        "memory": lambda r: (_nan_last(getattr(r, "memory", math.nan), reverse=True), r.rank),
        "host": lambda r: (r.host, r.rank),
    }
    return sorted(rows, key=keys.get(order, keys["rank"]))


def heat_strip(rows: tuple[Any, ...], pal: Palette, width: int) -> list[Text]:
    """One cell per rank (by rank), coloured by its step time against the job's median: a
    straggler is a red cell among green ones; a stopped rank is a red ✕, an unknown one grey."""
    ordered = sorted(rows, key=lambda r: r.rank)
    times = np.asarray([getattr(r, FieldName.STEP_TIME, math.nan) for r in ordered], dtype=np.float64)
    ok = np.isfinite(times)
    med = float(np.median(times[ok])) if ok.any() else math.nan
    cells = Text()
    for r, t in zip(ordered, times, strict=True):
        if r.status in BAD and r.status != "nan":
            cells.append("✕", style=pal.error + Style(bold=True))
        elif not math.isfinite(t) or not math.isfinite(med) or med <= 0:
            cells.append("·", style=pal.muted)
        else:
            ratio = t / med
            style = pal.success if ratio < 1.2 else pal.warning if ratio < 1.5 else pal.error
            cells.append(HEAT, style=style)
    label = f"step time by rank (median {fmt.num(med * 1e3) if math.isfinite(med) else '–'} ms): "
    room = max(16, width - len(label))
    lines = [Text(label, style=pal.muted) + cells[:room]]
    pad = " " * len(label)
    for at in range(room, len(cells), room):
        lines.append(Text(pad) + cells[at : at + room])
    return lines


def memory(x: float) -> str:
    if not math.isfinite(x) or x <= 0:
        return "–"
    for unit, scale in (("G", 1 << 30), ("M", 1 << 20), ("K", 1 << 10)):
        if x >= scale:
            return f"{x / scale:.1f}{unit}"
    return f"{x:.0f}B"


class RanksPane(Pane):
    key = "ranks"
    can_focus = True

    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("s", "cycle_sort", "sort ranks"),
        Binding("up", "cursor(-1)", "previous rank", show=False),
        Binding("down", "cursor(1)", "next rank", show=False),
        Binding("enter", "open_rank", "open rank"),
    ]

    DEFAULT_CSS = """
    RanksPane {
        height: auto;
        max-height: 20;
    }
    """

    class RankChosen(Message):
        """Enter on a row: open that rank's full dashboard."""

        def __init__(self, rank: int) -> None:
            super().__init__()
            self.rank = rank

    def __init__(self, ctx: Any, *, id: str | None = None, classes: str | None = None) -> None:
        super().__init__(ctx, id=id, classes=classes)
        self.view: Any = None  # the latest nnwatch.sources.job_monitor.JobView
        self.border_title = "ranks"
        self.sort = "worst"
        self.cursor = 0  # index into the sorted rows
        self.max_rows = 12

    def show(self, view: Any) -> None:
        """Take a new job view (UI thread) and draw it. Its height follows its rows (``auto``),
        so the layout is done again: a pane sized for "looking for the other ranks…" stayed one
        line high in the dashboard, its rows hidden."""
        self.view = view
        self.redraw()
        self.refresh(layout=True)

    # -- keys ----------------------------------------------------------------------------------
    def action_cycle_sort(self) -> None:
        self.sort = SORTS[(SORTS.index(self.sort) + 1) % len(SORTS)]
        self.cursor = 0
        self.redraw()

    def action_cursor(self, delta: int) -> None:
        n = len(self.view.rows) if self.view is not None else 0
        self.cursor = max(0, min(n - 1, self.cursor + delta)) if n else 0
        self.redraw()

    def action_open_rank(self) -> None:
        """Open the rank under the cursor: the app's ``switch_rank`` when it has one (no wiring
        needed), and a ``RankChosen`` message for anyone else embedding the pane."""
        row = self.selected
        if row is None:
            return
        switch = getattr(self.app, "switch_rank", None)
        if callable(switch):
            switch(int(row.rank))
        self.post_message(self.RankChosen(int(row.rank)))

    @property
    def selected(self) -> Any:
        """The row under the cursor, or None."""
        if self.view is None or not self.view.rows:
            return None
        rows = sort_rows(self.view.rows, self.sort)
        return rows[min(self.cursor, len(rows) - 1)]

    # -- drawing ---------------------------------------------------------------------------------
    def build(self) -> RenderResult:
        pal = self.ctx.palette
        view = self.view
        if view is None:
            world = self.ctx.state.meta.world_size
            return Text(f"looking for the other ranks of this {world}-rank job…", style=pal.muted)
        job = view.job
        rows = sort_rows(view.rows, self.sort)
        seen = {r.rank for r in view.rows}
        via = {"summary": " via rank 0's job summary", "ssh": " via ssh"}.get(getattr(view, "via", ""), "")
        self.border_subtitle = (
            f"s sort: {self.sort} · ↑↓ Enter open · [ ] switch · {len(seen)}/{job.world_size} ranks{via}"
        )
        head = self._head(view, pal)
        room = max(2, self.max_rows - len(head))
        self.cursor = min(self.cursor, max(0, len(rows) - 1))
        start = max(0, min(self.cursor - room // 2, len(rows) - room))
        shown = rows[start : start + room]
        table = self._table(view, shown, start, pal)
        tail: list[Text] = []
        if len(rows) > len(shown):
            tail.append(Text(f"  rows {start + 1}-{start + len(shown)} of {len(rows)} "
                             f"(sorted by {self.sort}; ↑↓ to scroll)", style=pal.muted))  # fmt: skip
        for host, why in getattr(view, "unreachable", ()):
            tail.append(Text(f"  host {host}: unreachable ({why}); its ranks are not shown",
                             style=pal.error + Style(bold=True)))  # fmt: skip
        tail += [Text(f"  rank {span}: other node", style=pal.muted) for span in unseen_ranges(job.world_size, seen)]  # fmt: skip
        return Group(*head, table, *tail)

    def _head(self, view: Any, pal: Palette) -> list[Text]:
        """Above the table: the heat strip, the view's note, its findings or stop, the stacks."""
        width = max(self.size.width - 2, 60)
        head: list[Text] = []
        if len(view.rows) > 1:
            head += heat_strip(view.rows, pal, width)
        note = getattr(view, "note", "")
        if note:
            head.append(Text(f"  {note}", style=pal.warning))
        findings = getattr(view, "findings", ())
        stops = getattr(view, "stops", None)
        if findings:
            for f in findings[:4]:
                style = pal.error + Style(bold=True) if f.severity == "error" else pal.warning
                head.append(Text(f"  {f.summary}", style=style))
        elif stops is not None and stops.summary:
            head.append(Text(f"  {stops.summary}", style=pal.error + Style(bold=True)))
        stacks = getattr(view, "stacks", ())
        if stacks:  # the job is stuck: where each rank is, in one line (the job view has them all)
            where = "; ".join(f"{span(g.ranks)} in {g.where}" for g in group(stacks)[:3])
            head.append(Text(f"  stacks: {where} (`nnwatch stacks` prints them)", style=pal.warning))
        return head

    def _table(self, view: Any, shown: list[Any], start: int, pal: Palette) -> Table:
        """The rows on screen, from ``start``: the watched rank marked, the cursor row reversed."""
        table = Table(box=None, padding=(0, 1), expand=False, show_edge=False)
        for c in COLUMNS:
            table.add_column(c, style=pal.text, header_style=pal.muted + Style(bold=True),
                             justify="left" if c in ("RANK", "HOST", "STATUS") else "right")  # fmt: skip
        table.add_column("", style=pal.muted)
        origin = set(view.nan_origin)
        stops = getattr(view, "stops", None)
        told = stops.ranks if stops is not None else {}
        watching = self.ctx.state.meta.rank
        focused = self.has_focus
        for i, row in enumerate(shown, start):
            mark = "▶ " if row.rank == watching else "  "
            cur = focused and i == self.cursor
            rank = Text(f"{mark}{row.rank}", style=Style(bold=row.rank == watching, reverse=cur))
            status = Text(row.status, style=status_style(row.status, pal))
            if row.rank in told:
                role = told[row.rank]
                lead = role.role in ("first", "holds")
                note_t = Text(role.short, style=pal.error + Style(bold=True) if lead else pal.muted)
            elif row.rank in origin:
                note_t = Text("← first NaN", style=pal.error + Style(bold=True))
            else:
                note_t = Text(row.note, style=pal.muted)
            lag = Text(fmt.count(row.behind) if row.behind else "0",
                       style=pal.warning if row.behind >= 2 else pal.text)  # fmt: skip
            table.add_row(
                rank, row.host, fmt.count(row.step), lag, fmt.num(row.steps_per_s),
                self._value(row.loss, row, pal), self._value(row.grad_norm, row, pal),
                memory(getattr(row, "memory", math.nan)), status, note_t,
            )  # fmt: skip
        return table

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
