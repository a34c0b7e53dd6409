"""The run picker that ``nnwatch`` opens with no arguments: live runs from the registry first, then
finished and crashed runs still on disk, each with its status and how many findings the detectors
wrote (from its ``events.jsonl``, re-read only when the file grew). Enter picks one; the caller then
opens the dashboard on it. The list refreshes itself every two seconds, off the UI thread."""

from __future__ import annotations

import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any, ClassVar

from rich.text import Text
from textual.app import App, ComposeResult
from textual.binding import Binding, BindingType
from textual.widgets import DataTable, Footer, Label

from nnwatch.sources.remote import RemoteRun
from nnwatch.store.findings_count import findings_count
from nnwatch.store.paths import default_root
from nnwatch.store.registry import list_runs, recorded_runs
from nnwatch.tui import format as fmt
from nnwatch.tui.lost_terminal import watch_terminal
from nnwatch.tui.run_sources import source_for

__all__ = ["RunPickerApp", "default_lister", "findings_count", "list_with_findings", "source_for"]

STATE_STYLE = {
    "running": "bold green",
    "starting": "green",
    "paused": "bold yellow",
    "hung": "bold yellow",
    "finished": "cyan",
    "crashed": "bold red",
}
EMPTY_HELP = (
    "No runs found yet. Runs appear here once a training script calls nnwatch.watch(model, "
    "optimizer) and steps; this list refreshes itself. Try `nnwatch demo exploding`."
)


def default_lister() -> list[Any]:
    """Live runs (registry), then runs on disk without an entry, newest first in each group."""
    root = default_root()
    live = list_runs(root)
    seen = {str(Path(r.run_dir).resolve()) for r in live}
    on_disk = []
    for where in (root, root / "runs"):
        for r in recorded_runs(where):
            key = str(Path(r.run_dir).resolve())
            if key not in seen:
                seen.add(key)
                on_disk.append(r)
    live.sort(key=lambda r: -r.started)
    on_disk.sort(key=lambda r: -r.started)
    return live + on_disk


#: The columns of a run list (the picker, and the chooser of a run to overlay).
RUN_COLUMNS = (
    "name", "status", "findings", "step", "steps/s", "pid", "host", "rank", "age", "directory",
)  # fmt: skip


def run_cells(r: Any, findings: int | None) -> tuple[Text | str, ...]:
    """One run's row: its name, state, findings count and progress."""
    return (
        Text(r.name, style="bold"),
        Text(r.state, style=STATE_STYLE.get(r.state, "")),
        _findings_cell(findings),
        Text(fmt.count(r.step), justify="right"),
        Text(fmt.si(r.steps_per_s), justify="right"),
        str(r.pid),
        r.host,
        f"{r.rank}/{r.world_size}",
        fmt.duration(r.age),
        Text(str(r.run_dir), style="dim"),
    )


def list_with_findings(
    lister: Callable[[], list[Any]],
) -> tuple[list[Any], dict[str, int | None], str]:
    """The runs, their findings counts by run directory, and an error for the screen (or "").
    Reads files: call it off the UI thread."""
    try:
        runs = lister()
        return runs, {str(r.run_dir): _count(r) for r in runs}, ""
    except Exception as exc:  # noqa: BLE001 - shown on screen, never raised
        return [], {}, f"cannot list runs: {exc}"


def _count(run: Any) -> int | None:
    """A run's findings: as its host counted them (a run listed over ssh), else from its file."""
    if isinstance(run, RemoteRun):
        return run.findings
    return findings_count(run.run_dir)


class RunPickerApp(App[Any]):
    """Returns the chosen ``RunInfo`` (or None when the user quits)."""

    TITLE = "nnwatch"
    CSS = """
    Screen { layout: vertical; }
    #title { height: 1; padding: 0 1; background: $panel; text-style: bold; width: 1fr; }
    #runs { height: 1fr; }
    #hint { height: auto; padding: 0 1; color: $text-muted; width: 1fr; }
    """
    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("enter", "pick", "open", id="picker.open", priority=True),
        Binding("r", "refresh", "refresh", id="picker.refresh"),
        Binding("q,escape", "quit", "quit", id="picker.quit"),
    ]

    def __init__(
        self,
        lister: Callable[[], list[Any]] = default_lister,
        refresh_s: float = 2.0,
        title: str = "nnwatch · pick a run (Enter opens it)",
    ) -> None:
        super().__init__()
        self.lister = lister
        self.refresh_s = refresh_s
        self.heading = title
        self.runs: list[Any] = []
        self.findings: dict[str, int | None] = {}  # run directory -> findings count, as shown
        self._busy = threading.Lock()

    def compose(self) -> ComposeResult:
        yield Label(self.heading, id="title")
        table: DataTable[Text | str] = DataTable(id="runs", cursor_type="row", zebra_stripes=True)
        table.add_columns(*RUN_COLUMNS)
        yield table
        yield Label("", id="hint")
        yield Footer(compact=True, show_command_palette=False)

    def on_mount(self) -> None:
        self.query_one(DataTable).focus()
        self.action_refresh()
        self.set_interval(self.refresh_s, self.action_refresh)
        watch_terminal(self)

    def action_refresh(self) -> None:
        if not self._busy.acquire(blocking=False):
            return

        def work() -> None:
            try:
                runs, counts, error = list_with_findings(self.lister)
            finally:
                self._busy.release()
            self.call_from_thread(self._show, runs, error, counts)

        threading.Thread(target=work, name="nnwatch-picker", daemon=True).start()

    def _show(
        self, runs: list[Any], error: str, counts: dict[str, int | None] | None = None
    ) -> None:
        counts = counts or {}
        self.findings = counts
        table = self.query_one(DataTable)
        keep = table.cursor_row
        self.runs = runs
        table.clear()
        for r in runs:
            table.add_row(*run_cells(r, counts.get(str(r.run_dir))))
        if runs:
            table.move_cursor(row=min(keep, len(runs) - 1))
        live = sum(1 for r in runs if getattr(r, "live", False))
        hint = error or (
            f"{live} live, {len(runs) - live} on disk. Enter: open · r: refresh · q: quit"
            if runs
            else EMPTY_HELP
        )
        self.query_one("#hint", Label).update(hint)

    def action_pick(self) -> None:
        table = self.query_one(DataTable)
        if self.runs and 0 <= table.cursor_row < len(self.runs):
            self.exit(self.runs[table.cursor_row])

    def on_data_table_row_selected(self, event: DataTable.RowSelected) -> None:
        self.action_pick()


def _findings_cell(n: int | None) -> Text:
    if n is None:
        return Text(fmt.NA_TEXT, justify="right", style="dim")
    return Text(str(n), justify="right", style="bold yellow" if n else "dim")
