"""The updates pane: what the optimizer did to each layer's weights at the last measured update.

The classic check, shown for every parameter-owning layer at once: the norm of the change the
update made, over the norm of the weights. About 1e-3 is healthy; 1e-5 and below the layer
barely learns; 1e-1 and above it is thrown around; an update of 0, or none at all, and it does
not learn. The ratio is drawn as a dot on a log strip from 1e-7 to 1 with the healthy band
(1e-4..1e-2) marked, a line from the band to a dot outside it, coloured by how many decades
away it is. Beside it: the ratio, the weight norm, and the share of elements whose gradient was
not zero that the update left bit for bit unchanged (an update rounded away, as in bf16).

A loss curve shows that a run does not learn; this pane shows which layers, and how: weights
pinned by decay, updates that round away, a layer the optimizer never reaches.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from rich.style import Style
from rich.text import Text
from textual.app import ComposeResult, RenderResult

from nnwatch.store.schema import FieldName, RunSchema
from nnwatch.tui import format as fmt
from nnwatch.tui.widgets.base import Palette, Pane, PaneContext
from nnwatch.tui.widgets.layers import matches
from nnwatch.tui.widgets.rows import RowTable, row_bindings

STRIP_DECADES = (-7, 0)  # the strip runs from 1e-7 to 1
BAND = (1e-4, 1e-2)  # healthy: about 1e-3, a decade either way (green on the strip)
LIMITS = (1e-5, 1e-1)  # beyond these the layer barely learns / is thrown around (red)
FROZEN_SHOWN = 0.03  # the unchanged share is shown above this
FROZEN_RED = 0.25
COLUMNS = ("#", "layer", "kind", "", "upd/w", "weight", "frozen")
WIDE_WIDTHS = (3, 18, 10, 0, 7, 7, 6)  # the strip (0 here) takes what is left
NARROW_WIDTHS = (2, 14, 8, 0, 6, 6, 6)
RIGHT = frozenset({0, 4, 5, 6})
STRIP_MIN, STRIP_MAX = 15, 50
NARROW_BELOW = 92  # pane widths below this draw the narrow columns (as the layers pane does)


@dataclass(frozen=True)
class UpdateRow:
    """One layer's update, as shown (NaN: not updated at this step)."""

    index: int  # the layer's number in the layers pane
    name: str
    kind: str
    weight: float
    update: float
    frozen: float

    @property
    def ratio(self) -> float:
        """Update norm over weight norm; NaN when there was no finite update."""
        if not math.isfinite(self.update):
            return math.inf if self.update == math.inf else math.nan
        if not math.isfinite(self.weight):
            return math.nan if math.isnan(self.weight) else 0.0
        if self.weight > 0:
            return self.update / self.weight
        return math.inf if self.update > 0 else 0.0

    @property
    def decades_off(self) -> float:
        """How many decades the ratio lies outside the healthy band (0 inside it, Inf for an
        update of 0 or none)."""
        r = self.ratio
        if not r > 0:  # 0 or NaN: it does not learn
            return math.inf
        if r < BAND[0]:
            return math.log10(BAND[0] / r)
        if r > BAND[1]:
            return math.log10(r / BAND[1])
        return 0.0

    @property
    def verdict(self) -> str:
        """``none`` (no update), ``slow`` (below 1e-5, 0 included), ``fast`` (above 1e-1),
        ``low`` / ``high`` (outside the band, inside the limits) or ``ok``."""
        r = self.ratio
        if math.isnan(r):
            return "none"
        if r < LIMITS[0]:
            return "slow"
        if r > LIMITS[1]:
            return "fast"
        if r < BAND[0]:
            return "low"
        return "high" if r > BAND[1] else "ok"


def ratio_style(row: UpdateRow, pal: Palette) -> Style:
    off = row.decades_off
    return pal.success if off == 0 else pal.warning if off <= 1 else pal.error


def strip_pos(ratio: float, width: int) -> int:
    """The cell of ``ratio`` on a strip of ``width`` cells (clamped to its ends)."""
    lo, hi = STRIP_DECADES
    x = (math.log10(ratio) - lo) / (hi - lo) if ratio > 0 else -1.0
    return min(max(round(x * (width - 1)), 0), width - 1)


def strip(row: UpdateRow, width: int, pal: Palette) -> Text:
    """The ratio on the log strip: the band marked, a dot (an arrow past an end), and a line from
    the band to a dot outside it, so that far from the band reads as long."""
    r = row.ratio
    if math.isnan(r):
        return Text("no update".center(width), style=pal.error)
    b0, b1 = strip_pos(BAND[0], width), strip_pos(BAND[1], width)
    band = Style(color=pal.success.color, dim=True)
    chars = ["─" if b0 <= i <= b1 else "·" for i in range(width)]
    styles = [band if b0 <= i <= b1 else pal.bar_empty for i in range(width)]
    style = ratio_style(row, pal)
    at = strip_pos(r, width)
    way = range(at + 1, b0) if at < b0 else range(b1 + 1, at) if at > b1 else range(0)
    for i in way:
        chars[i], styles[i] = "━", style  # the way from the band to the dot
    lo, hi = STRIP_DECADES
    past = r < 10.0**lo or r > 10.0**hi
    chars[at] = ("◀" if r < 10.0**lo else "▶") if past else "●"
    styles[at] = style + Style(bold=True)
    out = Text()
    for ch, st in zip(chars, styles, strict=True):
        out.append(ch, style=st)
    return out


def strip_scale(width: int) -> str:
    """The strip's header: 1e-3, 1e-5 and 1e-1 over their cells, the ends where they fit (the
    healthy 1e-3 first)."""
    line = [" "] * width
    labels = [(-3, "1e-3"), (-5, "1e-5"), (-1, "1e-1"), (-7, "1e-7"), (0, "1")]  # by rank
    for exp, label in labels:
        at = strip_pos(10.0**exp, width)
        start = min(max(at - len(label) // 2, 0), width - len(label))
        span = range(max(start - 1, 0), min(start + len(label) + 1, width))
        if start < 0 or any(line[i] != " " for i in span):
            continue  # too narrow for this one
        line[start : start + len(label)] = label
    return "".join(line)


def share(x: float) -> str:
    """A share that may be small but not nothing: 0.4% is "<1%", not "0%"."""
    return "<1%" if 0 < x < 0.01 else fmt.percent(x)


def param_layers(schema: RunSchema) -> list[tuple[int, str, str]]:
    """(number in the layers pane, name, kind) of each parameter-owning layer, in the layers
    pane's order: the watched layers first (forward order), then those that only own parameters."""
    owners = set(schema.param_layer_names)
    watched = set(schema.layer_names)
    out = [
        (i, n, k)
        for i, (n, k) in enumerate(zip(schema.layer_names, schema.layer_kinds, strict=False))
        if n in owners
    ]
    extra = [n for n in schema.param_layer_names if n not in watched]
    out += [(schema.num_layers + j, n, "params") for j, n in enumerate(extra)]
    return out


class UpdateTable(RowTable):
    """The layers' updates, one row each; while there are none, a message in their place."""

    DEFAULT_CSS = """
    UpdateTable { height: 1fr; }
    """
    BINDINGS = [*row_bindings("updates")]

    def __init__(self, *, id: str | None = None) -> None:
        super().__init__(id=id)
        self.notice: Text | None = None

    def widths(self) -> tuple[int, ...]:
        base = NARROW_WIDTHS if self.narrow else WIDE_WIDTHS
        room = self.size.width - sum(base) - len(base)
        return (*base[:3], min(max(room, STRIP_MIN), STRIP_MAX), *base[4:])

    def table_columns(self) -> tuple[tuple[str, ...], tuple[int, ...], frozenset[int]]:
        return COLUMNS, self.widths(), RIGHT

    def header_line(self) -> Text:
        out = super().header_line()
        widths = self.widths()
        at = sum(widths[:3]) + 3
        scale = strip_scale(widths[3])
        out = out[:at] + Text(scale, style=self.palette.muted) + out[at + widths[3] :]
        out.no_wrap, out.overflow, out.end = True, "crop", ""
        return out

    def cursor_cells(self) -> int | None:
        return sum(self.widths()[:3]) + 3  # the strip keeps its colours: the name shows the row

    def _moved(self) -> None:
        self.refresh()
        for pane in self.ancestors:
            if isinstance(pane, UpdatesPane):
                pane.update_caption()

    def cells(self, row: UpdateRow) -> list[Text]:
        r, pal = row, self.palette
        widths = self.widths()
        style = ratio_style(r, pal)
        frozen = Text("")
        if math.isfinite(r.frozen) and r.frozen > FROZEN_SHOWN:
            frozen = Text(share(r.frozen), style=pal.error if r.frozen > FROZEN_RED else pal.warning)
        bad = r.verdict in ("none", "slow", "fast")
        return [
            Text(str(r.index), style=pal.muted),
            Text(fmt.shorten_middle(r.name, widths[1]), style=pal.error if bad else pal.text),
            Text(r.kind, style=pal.muted),
            strip(r, widths[3], pal),
            Text(fmt.num_fit(r.ratio, widths[4]), style=style),
            Text(fmt.num_fit(r.weight, widths[5])),
            frozen,
        ]

    def render(self) -> RenderResult:
        if self.notice is not None:
            return self.notice
        return super().render()


@dataclass(frozen=True)
class Summary:
    """The counts the title gives, over every layer (the filter only narrows the rows)."""

    layers: int
    slow: int
    fast: int
    none: int

    @classmethod
    def of(cls, rows: list[UpdateRow]) -> Summary:
        verdicts = [r.verdict for r in rows]
        return cls(len(rows), verdicts.count("slow"), verdicts.count("fast"), verdicts.count("none"))

    def title(self, narrow: bool) -> str:
        parts: list[str] = []
        off = self.slow + self.fast
        if off:
            why = [f"{n} {w}" for n, w in ((self.slow, "slow"), (self.fast, "fast")) if n]
            detail = "" if narrow else f" ({', '.join(why)})"
            parts.append(f"[$error]{off} of {self.layers} outside 1e-5..1e-1{detail}[/]")
        if self.none:
            parts.append(f"[$error]{self.none} no update[/]")
        if not off and not self.none and self.layers:
            every = f"all {self.layers}" if self.layers > 1 else "1"
            parts.append(f"[$success]{every} within 1e-5..1e-1[/]")
        return " · ".join(parts)


class UpdatesPane(Pane):
    """Each parameter-owning layer's update/weight ratio at the last measured update."""

    key = "updates"
    redraw_on = frozenset({"cursor", "layer_filter"})

    DEFAULT_CSS = """
    UpdatesPane { padding: 0 1; }
    """

    def __init__(
        self, ctx: PaneContext, *, id: str | None = None, classes: str | None = None
    ) -> None:
        super().__init__(ctx, id=id, classes=classes)
        self.shown_rows: list[str] = []  # layer names in the table, for tests
        self.step: int | None = None  # the step whose update is shown

    def compose(self) -> ComposeResult:
        yield UpdateTable(id="update-table")

    def focus_rows(self) -> None:
        self.query_one(UpdateTable).focus()

    def build(self) -> RenderResult:
        found = self.query(UpdateTable)
        if not found:  # not mounted yet, or no more (at exit): draw on a later tick
            self.redraw_later()
            return Text("")
        if not self.display:
            return Text("")  # hidden behind the layers: drawn when shown (``u``)
        table = found.first()
        st, view, pal = self.ctx.state, self.ctx, self.ctx.palette
        schema = st.meta.schema
        narrow = self.size.width < NARROW_BELOW
        self.border_title, self.step, self.shown_rows = "[b]Updates[/b]", None, []
        layers = param_layers(schema)
        row = st.update_row(view.cursor, self.ctx.source)
        message = self._message(schema, layers, row is None)
        if message is not None:
            table.notice = Text(message, style=pal.muted)
            table.set_rows([], pal, narrow, None)
            self.update_caption()
            return Text("")
        assert row is not None
        index = st.param_index
        weight, update, frozen = (
            row[FieldName.WEIGHT_LAYER], row[FieldName.UPDATE_LAYER], row[FieldName.FROZEN_LAYER]
        )
        rows = [
            UpdateRow(number, name, kind, *(float(a[index[name]]) for a in (weight, update, frozen)))
            for number, name, kind in layers
        ]
        shown = [r for r in rows if matches(view.layer_filter, r.name, r.kind)]
        self.step = int(row["step"])
        self.shown_rows = [r.name for r in shown]
        worst = max(shown, key=lambda r: r.decades_off, default=None)
        keep = shown.index(worst) if worst is not None and worst.decades_off > 1 else None
        table.notice = None
        table.set_rows(shown, pal, narrow, keep)
        self.border_title = self._title(Summary.of(rows), len(shown), narrow)
        self.update_caption()
        return Text("")

    @staticmethod
    def _message(schema: RunSchema, layers: list[tuple[int, str, str]], no_row: bool) -> str | None:
        """What the pane says in place of rows, or None when it has rows to show."""
        if FieldName.UPDATE_LAYER not in (schema.layer_dtype().names or ()):
            return (
                f"This run was recorded by an older nnwatch (schema {schema.version}), before "
                "updates were recorded: the weight and update norms of each layer are recorded "
                "from schema 4 on. Record the run again with this nnwatch to see them."
            )
        if not layers:
            return "None of this model's layers owns a trainable parameter."
        if no_row:
            return (
                "No measured update yet at or before this step. Updates are measured on the "
                "steps whose layer statistics are sampled (every layer_interval steps)."
            )
        return None

    def _title(self, summary: Summary, shown: int, narrow: bool) -> str:
        st, view = self.ctx.state, self.ctx
        at = float(self.step) if self.step is not None else None
        title = f"[b]Updates[/b] @ step {fmt.count(self.step)}"
        verdict = summary.title(narrow)
        if verdict:
            title += f" · {verdict}"
        frozen = st.value_at(FieldName.UPDATE_FROZEN, at, self.ctx.source, measured=True)
        if math.isfinite(frozen) and frozen > FROZEN_SHOWN:
            colour = "$error" if frozen > FROZEN_RED else "$warning"
            title += f" · [{colour}]unchanged {share(frozen)}[/]"
        unset = ((FieldName.PARAMS_NO_GRAD, "no grad"), (FieldName.PARAMS_UNOPTIMIZED, "not optimized"))
        for field, label in unset:
            value = st.value_at(field, at, self.ctx.source, measured=True)
            if math.isfinite(value) and value > 0:
                title += f" · [$warning]{label} {share(value)}[/]"
        if view.layer_filter.strip() and shown < summary.layers:
            title += f" · [$accent]{shown} of {summary.layers} shown[/]"
        return title

    def update_caption(self) -> None:
        """The subtitle: the rows on screen, the weights' distance from the start, the keys."""
        table = self.query_one(UpdateTable)
        shown, vis = len(table.rows), table._visible
        parts = []
        if shown > vis:
            parts.append(f"rows {table.top + 1}-{min(table.top + vis, shown)} of {shown}")
        if self.step is not None and self.size.width >= NARROW_BELOW:
            drift = self.ctx.state.value_at(
                FieldName.WEIGHT_DRIFT, float(self.step), self.ctx.source, measured=True
            )
            if math.isfinite(drift):
                parts.append(f"‖w−w₀‖ {fmt.num(drift)}")
        parts.append("u: layers" if table.notice is not None else "healthy ≈1e-3 · u: layers")
        self.border_subtitle = " · ".join(parts)
        if table.has_focus and 0 <= table.cursor_row < len(table.rows):
            self.border_subtitle = f"{table.rows[table.cursor_row].name} · {self.border_subtitle}"
