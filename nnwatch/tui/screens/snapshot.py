"""The snapshot inspector: the failing batch, sample by sample, beside the grad norms before it.

Reached with ``i`` from the events list (on a snapshot) or from the dashboard (the snapshot at or
before the step cursor). The left table lists every sample with its label index, its loss (when a
model factory was given) and its first flag, flagged samples first in the cursor's path (``f``
shows only them); the right side shows the selected sample in full and the grad norms of the 50
steps before the snapshot. The report is read in a thread: loading torch and ``batch.pt`` must not
freeze the monitor of a live run.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from rich.style import Style
from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, Vertical
from textual.screen import Screen
from textual.widgets import DataTable, Footer, Label

from nnwatch.diagnosis.batch_report import BatchReport, ReportError, build_report, label_text
from nnwatch.tui import format as fmt
from nnwatch.tui.widgets.base import Palette
from nnwatch.tui.widgets.grad_before import GradBeforeChart
from nnwatch.tui.widgets.sample_view import SampleDetail, batch_range, describe_flags


class LogScale(Protocol):
    """The one view setting the inspector shares: the dashboard's pane context, whose charts
    then follow the inspector's ``g``."""

    log_scale: bool


@dataclass
class OwnScale:
    """The inspector's own log switch, opened apart from a dashboard."""

    log_scale: bool = False


class SnapshotScreen(Screen[None]):
    DEFAULT_CSS = """
    SnapshotScreen { layout: vertical; }
    SnapshotScreen #snap-title { height: 1; padding: 0 1; background: $panel; text-style: bold; width: 1fr; }
    SnapshotScreen #snap-flags { height: auto; max-height: 3; padding: 0 1; width: 1fr; }
    SnapshotScreen #snap-body { height: 1fr; }
    SnapshotScreen #samples { width: 2fr; min-width: 30; height: 1fr; }
    SnapshotScreen #snap-side { width: 3fr; }
    SnapshotScreen #grad-before { height: 1fr; min-height: 7; }
    """
    BINDINGS = [
        Binding("escape,q", "close", "back", id="snapshot.close"),
        Binding("f", "toggle_flagged", "flagged only", id="snapshot.flagged"),
        Binding("g", "toggle_log", "log", id="snapshot.log"),
    ]

    def __init__(
        self,
        path: str | Path,
        palette: Palette,
        view: LogScale | None = None,
        *,
        decode: Callable[[list[int]], str] | None = None,
        factory: Callable[[], Any] | None = None,
    ) -> None:
        super().__init__()
        self.path = Path(path)
        self.palette = palette
        self.view: LogScale = view or OwnScale()
        self.decode = decode
        self.factory = factory
        self.report: BatchReport | None = None
        self.error = ""
        self.flagged_only = False
        self.rows: list[int] = []  # sample index of each table row
        self.value_range = (0.0, 1.0)

    def compose(self) -> ComposeResult:
        yield Label(f"Snapshot {self.path}: loading…", id="snap-title")
        yield Label("", id="snap-flags")
        with Horizontal(id="snap-body"):
            table: DataTable[Text | str] = DataTable(id="samples", cursor_type="row")
            yield table
            with Vertical(id="snap-side"):
                yield SampleDetail(id="sample")
                yield GradBeforeChart(id="grad-before")
        yield Footer(compact=True, show_command_palette=False)

    def on_mount(self) -> None:
        self.query_one(DataTable).focus()
        self.run_worker(
            self._load, thread=True, name="nnwatch-snapshot-report", exit_on_error=False
        )

    def _load(self) -> None:
        try:
            report = build_report(self.path, decode=self.decode, factory=self.factory)
        except (ReportError, OSError) as exc:
            self.app.call_from_thread(self._failed, str(exc))
            return
        except Exception as exc:  # noqa: BLE001 - say it on the screen; never crash the monitor
            self.app.call_from_thread(self._failed, f"{type(exc).__name__}: {exc}")
            return
        self.app.call_from_thread(self._loaded, report)

    def _failed(self, message: str) -> None:
        self.error = message
        self.query_one("#snap-title", Label).update(f"Snapshot {self.path}")
        self.query_one("#snap-flags", Label).update(
            Text(f"cannot show this snapshot: {message}", style=self.palette.error)
        )

    def _loaded(self, report: BatchReport) -> None:
        self.report = report
        pal = self.palette
        self.value_range = batch_range(report) if report.kind == "image" else (0.0, 1.0)
        loss = _num(report.recorded_loss)
        grad = _num(report.recorded_grad_norm)
        self.query_one("#snap-title", Label).update(
            f"Snapshot step {fmt.count(report.step)}"
            + (f" ({report.reason})" if report.reason else "")
            + (f" · {report.run}" if report.run else "")
            + f" · {len(report.samples)} samples ({report.kind}) · loss {loss} · grad norm {grad}"
        )
        flags = Text()
        if report.batch_flags:
            flags.append("batch: ", style=pal.muted)
            flags.append("; ".join(report.batch_flags), style=pal.warning + Style(bold=True))
        else:
            flags.append("batch: no flag", style=pal.muted)
        flags.append(
            f"   inputs {report.input_desc} · targets {report.target_desc}", style=pal.muted
        )
        if report.notes:
            flags.append("\n" + " · ".join(report.notes), style=pal.muted)
        self.query_one("#snap-flags", Label).update(flags)
        self._fill_table()
        self._show_grad()

    def _fill_table(self) -> None:
        report = self.report
        if report is None:
            return
        table = self.query_one(DataTable)
        table.clear(columns=True)
        with_loss = any(s.loss is not None for s in report.samples)
        table.add_column("#", key="index")
        table.add_column("label", key="label")
        if with_loss:
            table.add_column("loss", key="loss")
        table.add_column("flags", key="flags")
        samples = report.flagged if self.flagged_only else report.samples
        self.rows = [s.index for s in samples]
        pal = self.palette
        for s in samples:
            cells: list[Text | str] = [
                Text(str(s.index), justify="right"),
                Text(label_text(s.label)[:14], style=pal.accent),
            ]
            if with_loss:
                cells.append(Text(_num(s.loss), justify="right"))
            cells.append(
                Text(describe_flags(s.flags, 40), style=pal.error if s.flags else pal.muted)
            )
            table.add_row(*cells)
        first_flagged = next((k for k, s in enumerate(samples) if s.flags), 0)
        if samples:
            table.move_cursor(row=first_flagged)
            self._show_sample(first_flagged)

    def _show_grad(self) -> None:
        report = self.report
        if report is None:
            return
        bad_last = report.recorded_grad_norm is not None and not math.isfinite(
            report.recorded_grad_norm
        )
        self.query_one(GradBeforeChart).show(
            report.grad_steps,
            report.grad_norms,
            report.step,
            bad_last=bad_last,
            log=self.view.log_scale,
            palette=self.palette,
        )

    def _show_sample(self, row: int) -> None:
        if self.report is None or not 0 <= row < len(self.rows):
            return
        s = self.report.samples[self.rows[row]]
        self.query_one(SampleDetail).show(self.report, s, self.palette, self.value_range)

    def on_data_table_row_highlighted(self, event: DataTable.RowHighlighted) -> None:
        self._show_sample(event.cursor_row)

    def action_toggle_flagged(self) -> None:
        if self.report is None:
            return
        if not self.report.flagged and not self.flagged_only:
            self.notify("No sample of this batch is flagged.", title="flagged only", timeout=3)
            return
        self.flagged_only = not self.flagged_only
        self._fill_table()

    def action_toggle_log(self) -> None:
        # the dashboard's pane context: its charts follow too, one log switch for every chart
        self.view.log_scale = not self.view.log_scale
        self._show_grad()

    def action_close(self) -> None:
        self.dismiss(None)

    @property
    def selected(self) -> int | None:
        table = self.query_one(DataTable)
        return (
            self.rows[table.cursor_row]
            if self.rows and 0 <= table.cursor_row < len(self.rows)
            else None
        )


def _num(x: float | None) -> str:
    if x is None:
        return fmt.NA_TEXT
    if math.isnan(x):
        return "nan"  # recorded, and NaN: not the same as "not known"
    return fmt.num(x)
