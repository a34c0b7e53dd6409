"""The ``e`` screen: every event the monitor kept (findings with their evidence and remedy,
snapshots, commands), newest first, each message wrapped to the screen's width so nothing is cut
off. Enter moves the step cursor to the selected event; ``d`` opens it in full (the whole message,
every piece of evidence, the remedy); ``i`` on a snapshot opens the snapshot inspector."""

from __future__ import annotations

import json
from collections.abc import Callable

from rich.style import Style
from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Vertical, VerticalScroll
from textual.screen import ModalScreen
from textual.widgets import DataTable, Label, Static

from nnwatch.store.events import Event, FindingEvent, SnapshotTaken
from nnwatch.tui import format as fmt
from nnwatch.tui.screens.dialogs import dialog_css
from nnwatch.tui.widgets.base import Palette
from nnwatch.tui.widgets.events import describe, kind_of, label_style


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
        Binding("d", "details", "details", id="events.details"),
        Binding("i", "inspect", "inspect snapshot", id="events.inspect"),
    ]

    def __init__(
        self,
        events: list[Event],
        palette: Palette,
        total: int,
        inspect: Callable[[SnapshotTaken], bool] | None = None,
    ) -> None:
        super().__init__()
        self.events = list(reversed(events))  # newest first
        self.palette = palette
        self.total = total
        self.inspect = inspect  # opens the snapshot inspector on a snapshot event

    def compose(self) -> ComposeResult:
        kept = len(self.events)
        with Vertical(classes="dialog"):
            more = f" (the newest {kept} of {self.total} are kept)" if self.total > kept else ""
            yield Label(
                f"Events: {kept}{more}. Enter: go to the step · d: details · i: inspect a snapshot"
                " · Esc: back",
                classes="title",
            )
            table: DataTable[Text | str] = DataTable(id="events-table", cursor_type="row")
            msg_w, layer_w = self.column_widths(self.app.size.width)
            table.add_column("step", width=9)
            table.add_column("what", width=5)
            table.add_column("layer", width=layer_w)
            table.add_column("message", width=msg_w)
            for ev in self.events:
                label, layer, msg, _remedy = describe(ev)
                table.add_row(
                    Text(fmt.count(ev.step), justify="right"),
                    Text(label, style=label_style(label, self.palette)),
                    Text(fmt.shorten_middle(layer, layer_w)),
                    Text(msg),  # wraps: the row is as tall as its message
                    height=None,
                )
            yield table
            yield Static("", id="event-detail")

    @staticmethod
    def column_widths(screen_width: int) -> tuple[int, int]:
        """(message, layer) column widths that fill 95% of the screen without a sideways scroll."""
        inner = int(screen_width * 0.95) - 6 - 2  # the dialog's border and padding, a scrollbar
        layer_w = 16 if inner >= 100 else 10
        return max(inner - 9 - 5 - layer_w - 4 * 2, 16), layer_w

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
        text.append(kind_of(ev), style=pal.text + Style(bold=True))
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
        self.dismiss(self.events[table.cursor_row].step)

    def _selected(self) -> Event | None:
        row = self.query_one(DataTable).cursor_row
        return self.events[row] if self.events and 0 <= row < len(self.events) else None

    def action_details(self) -> None:
        ev = self._selected()
        if ev is None:
            return

        def done(step: int | None) -> None:
            if step is not None:
                self.dismiss(step)

        self.app.push_screen(EventDetailScreen(ev, self.palette, self.inspect), done)

    def action_inspect(self) -> None:
        ev = self._selected()
        if ev is None:
            return
        if not isinstance(ev, SnapshotTaken):
            self.notify(
                "This event is not a snapshot; pick a SNAP row (or press i on the dashboard for "
                "the snapshot at the step cursor).",
                title="inspect",
                severity="warning",
                timeout=4,
            )
            return
        if self.inspect is not None:
            self.inspect(ev)

    def action_close(self) -> None:
        self.dismiss(None)


class EventDetailScreen(ModalScreen[int | None]):
    """One event in full: the whole message, every piece of evidence, the remedy."""

    DEFAULT_CSS = (
        dialog_css("EventDetailScreen")
        + """
    EventDetailScreen .dialog { width: 90%; max-width: 120; height: auto; max-height: 90%; }
    EventDetailScreen #event-full { height: auto; }
    EventDetailScreen VerticalScroll { height: auto; max-height: 100%; }
    """
    )
    BINDINGS = [
        Binding("escape,d,q", "close", "back", id="event.close"),
        Binding("enter,g", "jump", "go to step", id="event.jump"),
        Binding("i", "inspect", "inspect snapshot", id="event.inspect"),
    ]

    def __init__(
        self,
        event: Event,
        palette: Palette,
        inspect: Callable[[SnapshotTaken], bool] | None = None,
    ) -> None:
        super().__init__()
        self.event = event
        self.palette = palette
        self.inspect = inspect

    def compose(self) -> ComposeResult:
        ev, pal = self.event, self.palette
        label, layer, msg, remedy = describe(ev)
        with VerticalScroll(classes="dialog"):
            yield Label(f"{label} · {kind_of(ev)} · step {fmt.count(ev.step)}", classes="title")
            yield Static(self.full_text(ev, pal, label, layer, msg, remedy), id="event-full")
            keys = "Enter: go to the step · Esc: back"
            if isinstance(ev, SnapshotTaken):
                keys = "i: inspect the batch · " + keys
            yield Label(keys, classes="hint")

    @staticmethod
    def full_text(
        ev: Event, pal: Palette, label: str, layer: str, msg: str, remedy: str
    ) -> Text:
        text = Text()
        if layer:
            text.append("layer     ", style=pal.muted)
            text.append(layer + "\n", style=pal.text + Style(bold=True))
        text.append("message   ", style=pal.muted)
        text.append(str(ev.get("summary") or msg) + "\n")
        evidence = ev.get("evidence")
        if isinstance(evidence, dict) and evidence:
            text.append("evidence\n", style=pal.muted)
            width = max(len(str(k)) for k in evidence)
            for k, v in evidence.items():
                value = fmt.num(v) if isinstance(v, float) else json.dumps(v, default=str)
                text.append(f"  {str(k):<{width}}  {value}\n")
        elif evidence:
            text.append("evidence  ", style=pal.muted)
            text.append(json.dumps(evidence, default=str) + "\n")
        if remedy:
            text.append("remedy    ", style=pal.muted)
            text.append(remedy + "\n", style=pal.success)
        if isinstance(ev, SnapshotTaken):
            text.append("path      ", style=pal.muted)
            text.append((ev.path or "?") + "\n")
            if ev.reason:
                text.append("reason    ", style=pal.muted)
                text.append(ev.reason + "\n")
        onset = ev.finding.onset_step if isinstance(ev, FindingEvent) else None
        if onset is not None and onset != ev.step:
            text.append("onset     ", style=pal.muted)
            text.append(f"step {fmt.count(onset)}\n")
        return text

    def action_jump(self) -> None:
        self.dismiss(self.event.step)

    def action_inspect(self) -> None:
        if isinstance(self.event, SnapshotTaken) and self.inspect is not None:
            self.inspect(self.event)

    def action_close(self) -> None:
        self.dismiss(None)
