"""``RowTable``: the hand-drawn, scrolling table of one row per layer that the layers and updates
panes share: a header line, the rows that are on screen, a cursor while focused.

It is a small widget rather than Textual's DataTable because it is rebuilt at every sampled step
of a run that may have hundreds of layers, and it only ever renders the rows that are on screen,
which keeps a monitor following 1,000 steps/s well under its CPU budget. A subclass says what its
columns are (``table_columns``) and how one row is drawn (``cells``); the first three columns are the
index, the layer's name and its kind, and the cursor row names its layer in full over the kind.
"""

from __future__ import annotations

from typing import Any

from rich.style import Style
from rich.text import Text
from textual import events
from textual.app import RenderResult
from textual.binding import Binding
from textual.widget import Widget

from nnwatch.tui import format as fmt
from nnwatch.tui.widgets.base import Palette


def row_bindings(prefix: str) -> list[Binding]:
    """The moving keys of a table, with ids under ``prefix`` (``layers.up``...) to remap them."""
    return [
        Binding("up", "move(-1)", "up", id=f"{prefix}.up", show=False),
        Binding("down", "move(1)", "down", id=f"{prefix}.down", show=False),
        Binding("pageup", "page(-1)", "page up", id=f"{prefix}.page_up", show=False),
        Binding("pagedown", "page(1)", "page down", id=f"{prefix}.page_down", show=False),
        Binding("home", "move(-1000000)", "first", id=f"{prefix}.first", show=False),
        Binding("end", "move(1000000)", "last", id=f"{prefix}.last", show=False),
        Binding("escape", "leave", "back", id=f"{prefix}.leave", show=False),
    ]


class RowTable(Widget, can_focus=True):
    """Rows drawn by hand. Up/Down/PgUp/PgDn/Home/End move; Escape gives the keys back to the
    dashboard. Subclasses give ``table_columns`` and ``cells``, and may draw their own ``header_line``."""

    DEFAULT_CSS = """
    RowTable { height: 1fr; }
    """

    def __init__(self, *, id: str | None = None) -> None:
        super().__init__(id=id)
        self.rows: list[Any] = []  # each with a ``name``
        self.cursor_row = 0
        self.top = 0  # first row on screen
        self.narrow = False
        self.palette = Palette.from_variables({})

    # -- what a subclass says ----------------------------------------------------------------
    def table_columns(self) -> tuple[tuple[str, ...], tuple[int, ...], frozenset[int]]:
        """The column labels, their widths, and which of them align right (numbers)."""
        raise NotImplementedError

    def cells(self, row: Any) -> list[Text]:
        """The cells of one row, as drawn."""
        raise NotImplementedError

    def header_line(self) -> Text:
        """The header line: the labels, in bold."""
        labels, widths, right = self.table_columns()
        out = Text(no_wrap=True, overflow="crop", end="")
        head_style = self.palette.text + Style(bold=True)
        for i, (label, w) in enumerate(zip(labels, widths, strict=True)):
            head = label[:w]
            out.append((head.rjust(w) if i in right else head.ljust(w)) + " ", style=head_style)
        return out

    def cursor_cells(self) -> int | None:
        """How many leading cells of the cursor row are drawn reversed (None: the whole row)."""
        return None

    def _moved(self) -> None:
        """The cursor or the rows on screen moved (a pane's caption may name them)."""
        self.refresh()

    # -- data ------------------------------------------------------------------------------
    def set_rows(
        self, rows: list[Any], palette: Palette, narrow: bool, keep_in_view: int | None
    ) -> None:
        self.rows = rows
        self.palette = palette
        self.narrow = narrow
        if keep_in_view is not None and not self.has_focus:
            self.cursor_row = keep_in_view  # unattended: keep the worst layer on screen
        self.cursor_row = min(max(self.cursor_row, 0), max(len(rows) - 1, 0))
        self._scroll_to_cursor()
        self.refresh()

    def row_texts(self, name: str) -> list[Text]:
        """The cells of one layer's row, as drawn (for tests and screen readers of the code)."""
        for r in self.rows:
            if r.name == name:
                return self.cells(r)
        raise KeyError(name)

    @property
    def row_count(self) -> int:
        return len(self.rows)

    # -- navigation ------------------------------------------------------------------------
    @property
    def _visible(self) -> int:
        return max(self.size.height - 1, 1)  # one line for the header

    def _scroll_to_cursor(self) -> None:
        vis = self._visible
        if self.cursor_row < self.top:
            self.top = self.cursor_row
        elif self.cursor_row >= self.top + vis:
            self.top = self.cursor_row - vis + 1
        self.top = min(max(self.top, 0), max(len(self.rows) - vis, 0))

    def action_move(self, delta: int) -> None:
        self.cursor_row = min(max(self.cursor_row + delta, 0), max(len(self.rows) - 1, 0))
        self._scroll_to_cursor()
        self._moved()

    def action_page(self, pages: int) -> None:
        self.action_move(pages * self._visible)

    def on_mouse_scroll_down(self, event: events.MouseScrollDown) -> None:
        self.top = min(self.top + 3, max(len(self.rows) - self._visible, 0))
        self._moved()

    def on_mouse_scroll_up(self, event: events.MouseScrollUp) -> None:
        self.top = max(self.top - 3, 0)
        self._moved()

    def on_focus(self) -> None:
        self._moved()  # a caption may name the cursor row in full while the rows have focus

    def on_blur(self) -> None:
        self._moved()

    def on_resize(self) -> None:
        self._scroll_to_cursor()

    def action_leave(self) -> None:
        self.screen.set_focus(None)

    # -- drawing ---------------------------------------------------------------------------
    def render(self) -> RenderResult:
        _, widths, right = self.table_columns()
        out = self.header_line()
        vis = self._visible
        cursor_style = Style(reverse=True) if self.has_focus else None
        for k, r in enumerate(self.rows[self.top : self.top + vis]):
            out.append("\n")
            line = Text(no_wrap=True, overflow="crop")
            cells, row_widths = self.cells(r), list(widths)
            at_cursor = cursor_style is not None and self.top + k == self.cursor_row
            if at_cursor and len(r.name) > widths[1]:
                # the cursor row names its layer in full, over the kind column if need be
                room = widths[1] + 1 + widths[2]
                cells[1] = Text(fmt.shorten_middle(r.name, room), style=cells[1].style)
                cells[2] = Text("")
                row_widths[1], row_widths[2] = room, -1
            for i, (cell, w) in enumerate(zip(cells, row_widths, strict=True)):
                if w < 0:
                    continue  # merged into the column before
                cell.truncate(w, overflow="ellipsis")
                pad = " " * (w - cell.cell_len)
                line.append_text(Text(pad) + cell if i in right else cell + Text(pad))
                line.append(" ")
            if cursor_style is not None and at_cursor:
                line.stylize(cursor_style, 0, self.cursor_cells())
            out.append_text(line)
        return out
