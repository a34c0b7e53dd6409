"""The ``e`` screen: every event the monitor kept (findings with their evidence and remedy,
snapshots, commands), newest first. Enter moves the step cursor to the selected event."""

from __future__ import annotations

import json
from typing import Any

from rich.style import Style
from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Vertical
from textual.screen import ModalScreen
from textual.widgets import DataTable, Label, Static

from nnwatch.tui import format as fmt
from nnwatch.tui.screens.dialogs import dialog_css
from nnwatch.tui.widgets.base import Palette
from nnwatch.tui.widgets.events import describe, label_style


class EventsScreen(ModalScreen[int | None]):
    DEFAULT_CSS = (
        dialog_css("EventsScreen")
        + """
    EventsScreen .dialog { width: 95%; height: 90%; }
    EventsScreen DataTable { height: 1fr; }
    EventsScreen #event-detail { height: auto; max-height: 8; margin-top: 1; }
    EventsScreen DataTable { overflow-x: hidden; }
    """
    )
    BINDINGS = [
        Binding("escape,e,q", "close", "close", id="events.close"),
        Binding("enter", "jump", "go to step", id="events.jump"),
    ]

    def __init__(self, events: list[dict[str, Any]], palette: Palette, total: int) -> None:
        super().__init__()
        self.events = list(reversed(events))  # newest first
        self.palette = palette
        self.total = total

    def compose(self) -> ComposeResult:
        kept = len(self.events)
        with Vertical(classes="dialog"):
            more = f" (the newest {kept} of {self.total} are kept)" if self.total > kept else ""
            yield Label(
                f"Events: {kept}{more}. Enter: go to the event's step. Esc: back.", classes="title"
            )
            table: DataTable[Text | str] = DataTable(id="events-table", cursor_type="row")
            table.add_columns("step", "what", "layer", "message")
            for ev in self.events:
                label, layer, msg, _remedy = describe(ev)
                table.add_row(
                    Text(fmt.count(ev.get("step")), justify="right"),
                    Text(label, style=label_style(label, self.palette)),
                    layer,
                    msg,
                )
            yield table
            yield Static("", id="event-detail")

    def on_mount(self) -> None:
        table = self.query_one(DataTable)
        table.focus()
        self._show_detail(0)

    def on_data_table_row_highlighted(self, event: DataTable.RowHighlighted) -> None:
        self._show_detail(event.cursor_row)

    def on_data_table_row_selected(self, event: DataTable.RowSelected) -> None:
        self.action_jump()

    def _show_detail(self, row: int) -> None:
        if not self.events or not 0 <= row < len(self.events):
            return
        ev = self.events[row]
        _label, _layer, msg, remedy = describe(ev)
        pal = self.palette
        text = Text()
        text.append(str(ev.get("kind") or ev.get("type", "")), style=pal.text + Style(bold=True))
        text.append(f"  {msg}")
        if remedy:
            text.append("\nremedy: ", style=pal.muted)
            text.append(remedy, style=pal.success)
        evidence = ev.get("evidence")
        if evidence:
            text.append("\nevidence: ", style=pal.muted)
            text.append(json.dumps(evidence, default=str))
        self.query_one("#event-detail", Static).update(text)

    def action_jump(self) -> None:
        table = self.query_one(DataTable)
        if not self.events:
            self.dismiss(None)
            return
        step = self.events[table.cursor_row].get("step")
        self.dismiss(int(step) if isinstance(step, int | float) else None)

    def action_close(self) -> None:
        self.dismiss(None)
