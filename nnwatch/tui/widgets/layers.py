"""The layers pane: one row per layer in forward order, with the share of dead (exactly zero)
outputs as a bar coloured by severity, the activation std and max |x|, the layer's gradient norm,
and its non-finite count. A filter narrows the rows by name or kind.

The table is a ``RowTable`` (``rows.py``), drawn by hand: it is rebuilt at every sampled step of a
run that may have hundreds of layers and only ever renders the rows that are on screen.
"""

from __future__ import annotations

import fnmatch
import math
from dataclasses import dataclass

import numpy as np
from rich.style import Style
from rich.text import Text
from textual import events
from textual.app import ComposeResult, RenderResult
from textual.binding import Binding
from textual.markup import escape
from textual.widgets import Input

from nnwatch.store.schema import FieldName
from nnwatch.tui import format as fmt
from nnwatch.tui.widgets.base import Palette, Pane, PaneContext
from nnwatch.tui.widgets.gpu import bar
from nnwatch.tui.widgets.rows import RowTable, row_bindings

COLUMNS = ("#", "layer", "kind", "dead", "std", "max|x|", "grad", "nonfin")
WIDE_WIDTHS = (3, 18, 10, 16, 7, 7, 7, 6)
NARROW_WIDTHS = (2, 14, 8, 11, 6, 6, 6, 4)
RIGHT = frozenset({0, 4, 5, 6, 7})  # numbers align right
DEAD_RED = 0.8  # above this share of zero outputs a layer is (nearly) dead: red
DEAD_YELLOW = 0.5


def dead_style(frac: float, pal: Palette) -> Style:
    if not math.isfinite(frac):
        return pal.muted
    return pal.error if frac > DEAD_RED else pal.warning if frac > DEAD_YELLOW else pal.success


def matches(filter_text: str, name: str, kind: str) -> bool:
    """Case-insensitive match on the layer name or its module kind: a substring, or a glob when
    the text holds ``*``, ``?`` or ``[`` (``blocks.*.act``, ``*.mlp.*``) matched on the whole."""
    f = filter_text.strip().lower()
    if not f:
        return True
    if any(c in f for c in "*?["):
        return fnmatch.fnmatchcase(name.lower(), f) or fnmatch.fnmatchcase(kind.lower(), f)
    return f in name.lower() or f in kind.lower()


@dataclass(frozen=True)
class LayerRow:
    """One layer's numbers, as shown (NaN: not measured at this step)."""

    index: int
    name: str
    kind: str
    dead: float
    std: float
    maxabs: float
    grad: float
    nonfinite: float
    #: the layer whose weight this one shares (a language model's tied head): its gradient is
    #: in that layer's row
    tied_to: str = ""

    @property
    def bad(self) -> bool:
        return (math.isfinite(self.nonfinite) and self.nonfinite > 0) or (
            math.isfinite(self.dead) and self.dead > DEAD_RED
        )


class LayerTable(RowTable):
    """The layers' rows: Up/Down/PgUp/PgDn/Home/End move; ``/`` jumps to the filter; Escape gives
    the keys back to the dashboard."""

    DEFAULT_CSS = """
    LayerTable { height: 1fr; }
    """
    BINDINGS = [
        *row_bindings("layers"),
        Binding("slash", "focus_filter", "filter", id="layers.filter", show=False),
    ]

    def table_columns(self) -> tuple[tuple[str, ...], tuple[int, ...], frozenset[int]]:
        return COLUMNS, NARROW_WIDTHS if self.narrow else WIDE_WIDTHS, RIGHT

    def _moved(self) -> None:
        self.refresh()
        for pane in self.ancestors:
            if isinstance(pane, LayersPane):
                pane.update_caption()

    def action_focus_filter(self) -> None:
        self.screen.query_one("#layer-filter", Input).focus()

    def cells(self, row: LayerRow) -> list[Text]:
        r, pal = row, self.palette
        ds = dead_style(r.dead, pal)
        dead = bar(r.dead, 6 if self.narrow else 10, ds, pal.bar_empty)
        dead.append(f" {fmt.percent(r.dead):>4}", style=ds)
        nf_bad = math.isfinite(r.nonfinite) and r.nonfinite > 0
        nf = Text(
            fmt.count(r.nonfinite) if math.isfinite(r.nonfinite) else fmt.NA_TEXT,
            style=(pal.error + Style(bold=True)) if nf_bad else pal.muted,
        )
        widths = NARROW_WIDTHS if self.narrow else WIDE_WIDTHS
        name = fmt.shorten_middle(r.name, widths[1])  # "h.0…c_fc": the block and the leaf stay
        return [
            Text(str(r.index), style=pal.muted),
            Text(name, style=pal.error if r.bad else pal.text),
            Text(r.kind, style=pal.muted),
            dead,
            Text(fmt.num(r.std)),
            Text(fmt.num(r.maxabs)),
            Text(f"={r.tied_to}"[: widths[6]], style=pal.muted)
            if r.tied_to and not math.isfinite(r.grad)
            else Text(fmt.num(r.grad)),
            nf,
        ]


class LayersPane(Pane):
    key = "layers"
    redraw_on = frozenset({"cursor", "layer_filter"})

    DEFAULT_CSS = """
    LayersPane { padding: 0 1; }
    LayersPane #layer-filter {
        height: 1; border: none; padding: 0 1; margin: 0;
        background: $surface;
    }
    LayersPane #layer-filter:focus { background: $boost; }
    """

    def __init__(
        self, ctx: PaneContext, *, id: str | None = None, classes: str | None = None
    ) -> None:
        super().__init__(ctx, id=id, classes=classes)
        self.shown_rows: list[str] = []  # layer names currently in the table, for tests and help

    def compose(self) -> ComposeResult:
        yield Input(
            placeholder="filter: name, kind or glob (blocks.*.act) · Enter: rows · Esc: clear",
            id="layer-filter",
        )
        yield LayerTable(id="layer-table")

    def on_input_changed(self, event: Input.Changed) -> None:
        if event.input.id == "layer-filter":
            self.ctx.layer_filter = event.value  # this pane, the updates and the header redraw
            self.app.refresh_bindings()  # the footer offers Escape to clear it

    def on_input_submitted(self, event: Input.Submitted) -> None:
        self.query_one(LayerTable).focus()

    def on_key(self, event: events.Key) -> None:
        filter_input = self.query_one("#layer-filter", Input)
        if event.key == "escape" and self.screen.focused is filter_input:
            event.stop()
            self.clear_filter()  # Escape in the filter clears it ...
            self.screen.set_focus(None)  # ... and gives the keys back to the dashboard

    def clear_filter(self) -> None:
        """Show every layer again (Escape in the filter, or on the dashboard)."""
        self.query_one("#layer-filter", Input).value = ""
        self.ctx.layer_filter = ""  # at once, not only when Input.Changed arrives
        self.app.refresh_bindings()

    def focus_filter(self) -> None:
        """``l``: type to filter at once; Enter moves to the rows, Escape back to the dashboard."""
        self.query_one("#layer-filter", Input).focus()

    def focus_rows(self) -> None:
        self.query_one(LayerTable).focus()

    def build(self) -> RenderResult:
        st, view, pal = self.ctx.state, self.ctx, self.ctx.palette
        schema = st.meta.schema
        row = st.layer_row(view.cursor, self.ctx.source)
        entries = self._entries()
        rows: list[LayerRow] = []
        dying = nonfinite = 0
        problem: str | None = None  # the first non-finite layer, else the deadest above the line
        worst = DEAD_RED
        for r in self._rows(entries, row):
            name, kind = r.name, r.kind
            dying += int(math.isfinite(r.dead) and r.dead > DEAD_RED)
            nonfinite += int(math.isfinite(r.nonfinite) and r.nonfinite > 0)
            if math.isfinite(r.nonfinite) and r.nonfinite > 0:
                if worst < 2.0:  # the first non-finite layer outranks any dead one
                    problem, worst = name, 2.0
            elif math.isfinite(r.dead) and r.dead > worst:
                problem, worst = name, r.dead
            if matches(view.layer_filter, name, kind):
                rows.append(r)
        self.shown_rows = [r.name for r in rows]
        keep = self.shown_rows.index(problem) if problem in self.shown_rows else None
        found = self.query(LayerTable)
        if not found:  # the table is not mounted yet, or no more (at exit): draw on a later tick
            self.redraw_later()
            return Text("")
        table = found.first()
        table.set_rows(rows, pal, self.size.width < 92, keep)
        at = "" if row is None else f" @ step {fmt.count(float(row['step']))}"
        title = (
            f"[b]Layers[/b]{at} · {schema.num_layers}"
            if schema.num_layers
            else "[b]Layers[/b] · none of this model's modules is watched"
        )
        if view.layer_filter.strip():
            flt = escape(view.layer_filter.strip())
            title += f" · [$accent]filter '{flt}': {len(rows)} of {len(entries)}[/]"
        if dying:
            title += f" · [$error]{dying} >{DEAD_RED:.0%} dead[/]"
        if nonfinite:
            title += f" · [$error]{nonfinite} non-finite[/]"
        self.border_title = title
        self.update_caption()
        return Text("")

    def _entries(self) -> list[tuple[str, str]]:
        """Layers with activation statistics, then those that only own parameters (gradient
        rows), as (name, kind)."""
        schema = self.ctx.state.meta.schema
        grad_only = [n for n in schema.param_layer_names if n not in set(schema.layer_names)]
        entries = list(zip(schema.layer_names, schema.layer_kinds, strict=False))
        return entries + [(n, "params") for n in grad_only]

    def _rows(self, entries: list[tuple[str, str]], row: np.ndarray | None) -> list[LayerRow]:
        """One row per entry, from the per-layer stats ``row`` (NaN where it has none)."""
        st = self.ctx.state
        grad_index = st.param_index
        n_stat = len(st.meta.schema.layer_names)
        nan = math.nan
        tied = st.meta.extra.get("tied") or {}
        if not isinstance(tied, dict):
            tied = {}
        out: list[LayerRow] = []
        for i, (name, kind) in enumerate(entries):
            tied_to = str(tied.get(name, ""))
            if row is not None:
                gi = grad_index.get(name)
                grad = float(row[FieldName.GRAD_LAYER][gi]) if gi is not None else nan
                if i < n_stat:
                    r = LayerRow(
                        i, name, kind,
                        float(row[FieldName.ACT_ZERO][i]), float(row[FieldName.ACT_STD][i]),
                        float(row[FieldName.ACT_MAXABS][i]),
                        grad, float(row[FieldName.ACT_NONFINITE][i]), tied_to,
                    )  # fmt: skip
                else:
                    r = LayerRow(i, name, kind, nan, nan, nan, grad, nan, tied_to)
            else:
                r = LayerRow(i, name, kind, nan, nan, nan, nan, nan, tied_to)
            out.append(r)
        return out

    def update_caption(self) -> None:
        """The subtitle: which rows are on screen, the filter, the keys."""
        table = self.query_one(LayerTable)
        shown, vis = len(self.shown_rows), table._visible
        more = (
            f"rows {table.top + 1}-{min(table.top + vis, shown)} of {shown} · "
            if shown > vis
            else ""
        )
        flt = self.ctx.layer_filter
        self.border_subtitle = (
            f"{more}filter {flt!r}: {shown} shown" if flt else f"{more}l: focus  /: filter  u: updates"
        )
        if table.has_focus and 0 <= table.cursor_row < len(table.rows):
            full = table.rows[table.cursor_row].name  # the whole name of the cursor row
            self.border_subtitle = f"{full} · {self.border_subtitle}"
