"""The ``?`` screen: every key binding with its id (what a keymap remaps), its current key, what it
does, and whether it is available for this run; plus how to remap keys."""

from __future__ import annotations

from collections.abc import Callable, Sequence

from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Vertical
from textual.screen import ModalScreen
from textual.widgets import DataTable, Label

from nnwatch.tui.screens.dialogs import dialog_css

REMAP_HINT = (
    "Remap keys with NNWATCH_KEYS, binding ids to keys, e.g. "
    "NNWATCH_KEYS='snapshot=S,quit=ctrl+q' (or --keys, or a JSON file at "
    "~/.config/nnwatch/keys.json)."
)


class HelpScreen(ModalScreen[None]):
    DEFAULT_CSS = (
        dialog_css("HelpScreen")
        + """
    HelpScreen .dialog { width: 112; height: auto; max-height: 95%; }
    HelpScreen DataTable { height: auto; max-height: 24; overflow-x: hidden; }
    """
    )
    BINDINGS = [Binding("escape,question_mark,q", "close", "close", id="help.close")]

    def __init__(
        self,
        bindings: Sequence[Binding],
        key_of: Callable[[Binding], str],
        available: Callable[[Binding], str],
    ) -> None:
        super().__init__()
        self.bindings_shown = list(bindings)
        self.key_of = key_of
        self.available = available

    def compose(self) -> ComposeResult:
        with Vertical(classes="dialog"):
            yield Label("nnwatch keys", classes="title")
            table: DataTable[Text | str] = DataTable(id="help-table", cursor_type="row")
            table.add_columns("key", "id", "does", "now")
            for b in self.bindings_shown:
                note = self.available(b)
                table.add_row(
                    Text(self.key_of(b), style="bold"),
                    b.id or "",
                    b.tooltip or b.description,
                    Text(note, style="italic dim") if note else "",
                )
            yield table
            yield Label(REMAP_HINT, classes="hint")
            yield Label("Esc or ? closes this help.", classes="hint")

    def action_close(self) -> None:
        self.dismiss(None)
