"""The ``o`` chooser: which run to overlay on the charts. The same list as the run picker (live
runs first, then finished and crashed ones still on disk, with their findings), read off the UI
thread, without the run already on screen. Enter answers with the chosen ``RunInfo``."""

from __future__ import annotations

import os
import threading
from collections.abc import Callable
from typing import Any

from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Vertical
from textual.screen import ModalScreen
from textual.widgets import DataTable, Label

from nnwatch.tui.picker import RUN_COLUMNS, list_with_findings, run_cells
from nnwatch.tui.screens.dialogs import dialog_css

NO_OTHER_RUN = (
    "No other run to compare with: runs appear here once a script calls nnwatch.watch() and "
    "steps, and finished runs while their directory is kept."
)


def _same_dir(a: object, b: object) -> bool:
    try:
        return os.path.realpath(str(a)) == os.path.realpath(str(b))
    except (OSError, ValueError):
        return False


class CompareScreen(ModalScreen[Any]):
    """Lists the runs to overlay; dismisses with a ``RunInfo``, or None on Escape."""

    DEFAULT_CSS = (
        dialog_css("CompareScreen")
        + """
    CompareScreen .dialog { width: 96%; max-width: 150; height: auto; max-height: 90%; }
    CompareScreen DataTable { height: auto; max-height: 20; }
    """
    )
    BINDINGS = [
        Binding("escape,q", "cancel", "cancel", id="compare.cancel"),
        Binding("enter", "choose", "overlay", id="compare.choose", priority=True),
    ]

    def __init__(self, lister: Callable[[], list[Any]], exclude: list[object]) -> None:
        super().__init__()
        self.lister = lister
        self.exclude = [e for e in exclude if e is not None]
        self.runs: list[Any] = []
        self.findings: dict[str, int | None] = {}  # run directory -> findings count, as shown
        self.listed = False  # the first listing came back (for tests)

    def compose(self) -> ComposeResult:
        with Vertical(classes="dialog"):
            yield Label("Overlay a run on the loss and grad charts", classes="title")
            table: DataTable[Text | str] = DataTable(id="compare-runs", cursor_type="row")
            table.add_columns(*RUN_COLUMNS)
            yield table
            yield Label("reading the runs…", id="compare-hint", classes="hint")

    def on_mount(self) -> None:
        self.query_one(DataTable).focus()

        def work() -> None:
            runs, counts, error = list_with_findings(self.lister)
            runs = [r for r in runs if not any(_same_dir(r.run_dir, e) for e in self.exclude)]
            try:
                self.app.call_from_thread(self._show, runs, counts, error)
            except Exception:  # noqa: BLE001 - the screen or the app is gone
                pass

        threading.Thread(target=work, name="nnwatch-compare-list", daemon=True).start()

    def _show(self, runs: list[Any], counts: dict[str, int | None], error: str) -> None:
        if not self.is_attached:
            return
        self.runs, self.findings = runs, counts
        table = self.query_one(DataTable)
        table.clear()
        for r in runs:
            table.add_row(*run_cells(r, counts.get(str(r.run_dir))))
        live = sum(1 for r in runs if getattr(r, "live", False))
        hint = error or (
            f"{live} live, {len(runs) - live} on disk. Enter: overlay · Esc: cancel"
            if runs
            else NO_OTHER_RUN
        )
        self.query_one("#compare-hint", Label).update(hint)
        self.listed = True

    def action_choose(self) -> None:
        table = self.query_one(DataTable)
        if self.runs and 0 <= table.cursor_row < len(self.runs):
            self.dismiss(self.runs[table.cursor_row])

    def action_cancel(self) -> None:
        self.dismiss(None)
