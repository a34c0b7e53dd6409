"""Small modal dialogs: a yes/no confirmation before anything that steers training, and the clip
threshold input. Both answer through ``dismiss`` so the caller gets a plain value back."""

from __future__ import annotations

import math

from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, Vertical
from textual.screen import ModalScreen
from textual.validation import Function
from textual.widgets import Button, Input, Label


def dialog_css(screen: str) -> str:
    """The shared dialog look, for one screen class (a screen's DEFAULT_CSS is scoped to it)."""
    return DIALOG_CSS.replace("DialogScreen", screen)


DIALOG_CSS = """
DialogScreen { align: center middle; background: $background 60%; }
.dialog {
    width: 64; max-width: 95%; height: auto;
    border: thick $accent; background: $surface; padding: 1 2;
}
.dialog .title { text-style: bold; width: 1fr; margin-bottom: 1; }
.dialog .hint { color: $text-muted; width: 1fr; }
.dialog .buttons { height: auto; width: 1fr; align-horizontal: right; margin-top: 1; }
.dialog Button { margin-left: 2; min-width: 10; }
.dialog Input { margin: 1 0 0 0; }
"""


class ConfirmScreen(ModalScreen[bool]):
    """Ask before steering a live run: Enter/y confirms, Escape/n cancels."""

    DEFAULT_CSS = dialog_css("ConfirmScreen")
    BINDINGS = [
        Binding("y", "answer(True)", "yes", id="confirm.yes"),
        Binding("n,escape", "answer(False)", "no", id="confirm.no"),
    ]

    def __init__(self, question: str, detail: str = "", *, confirm_label: str = "Yes") -> None:
        super().__init__()
        self.question = question
        self.detail = detail
        self.confirm_label = confirm_label

    def compose(self) -> ComposeResult:
        with Vertical(classes="dialog"):
            yield Label(self.question, classes="title")
            if self.detail:
                yield Label(self.detail, classes="hint")
            with Horizontal(classes="buttons"):
                yield Button("No", id="no")
                yield Button(self.confirm_label, id="yes", variant="warning")

    def on_mount(self) -> None:
        self.query_one("#yes", Button).focus()

    def on_button_pressed(self, event: Button.Pressed) -> None:
        self.dismiss(event.button.id == "yes")

    def action_answer(self, yes: bool) -> None:
        self.dismiss(yes)


def parse_clip(text: str) -> float | None:
    """A clip threshold: a positive finite number. None when the text is not one."""
    try:
        value = float(text.strip())
    except ValueError:
        return None
    return value if math.isfinite(value) and value > 0 else None


class ClipScreen(ModalScreen[float | None]):
    """Type a new max-norm for gradient clipping; Escape cancels."""

    DEFAULT_CSS = dialog_css("ClipScreen")
    BINDINGS = [Binding("escape", "cancel", "cancel", id="clip.cancel")]

    def __init__(self, current: float) -> None:
        super().__init__()
        self.current = current

    def compose(self) -> ComposeResult:
        now = "not set" if not math.isfinite(self.current) else f"{self.current:g}"
        with Vertical(classes="dialog"):
            yield Label("Set the gradient clip threshold (max norm)", classes="title")
            yield Label(f"Current: {now}. It applies from the next optimizer step.", classes="hint")
            yield Input(
                value="" if not math.isfinite(self.current) else f"{self.current:g}",
                placeholder="e.g. 1.0",
                id="clip-value",
                validators=[Function(lambda t: parse_clip(t) is not None, "a positive number")],
                validate_on=["changed", "submitted"],
            )
            yield Label("", id="clip-error", classes="hint")
            with Horizontal(classes="buttons"):
                yield Button("Cancel", id="cancel")
                yield Button("Set", id="set", variant="primary")

    def on_mount(self) -> None:
        self.query_one(Input).focus()

    def _submit(self) -> None:
        value = parse_clip(self.query_one(Input).value)
        if value is None:
            self.query_one("#clip-error", Label).update("Enter a positive number, such as 1.0")
            return
        self.dismiss(value)

    def on_input_submitted(self, event: Input.Submitted) -> None:
        event.stop()
        self._submit()

    def on_button_pressed(self, event: Button.Pressed) -> None:
        if event.button.id == "set":
            self._submit()
        else:
            self.dismiss(None)

    def action_cancel(self) -> None:
        self.dismiss(None)
