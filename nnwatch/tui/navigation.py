"""The keys that change what is seen, not the run: zoom (``z``), log scale (``g``), the step cursor
(arrows, Home, End), the layers and their filter (``l``, ``/``, Escape), the updates pane in the
layers' place (``u``), the events list (``e``) the snapshot inspector (``i``), and copying a
remote run's snapshot here (``P``)."""

from __future__ import annotations

import math
from collections.abc import Callable
from pathlib import Path
from typing import Any, Protocol

from textual.widget import Widget
from textual.worker import Worker

from nnwatch.sources.base import RunSource, SourceError
from nnwatch.store.events import SnapshotTaken
from nnwatch.store.paths import SNAPSHOT_MANIFEST, SNAPSHOTS_DIR
from nnwatch.tui import format as fmt
from nnwatch.tui.host import Notifier, ScreenPusher
from nnwatch.tui.model import RunState
from nnwatch.tui.screens.dashboard import DashboardScreen
from nnwatch.tui.screens.events import EventsScreen
from nnwatch.tui.screens.snapshot import SnapshotScreen
from nnwatch.tui.widgets.base import PaneContext
from nnwatch.tui.widgets.compare import chart_window
from nnwatch.tui.widgets.layers import LayersPane
from nnwatch.tui.widgets.updates import UpdatesPane


class NavigationHost(Notifier, ScreenPusher, Protocol):
    """What navigating needs of the app: the dashboard, focus, the footer, and a worker thread
    with a way back from it (pulling a snapshot over ssh)."""

    @property
    def dashboard(self) -> DashboardScreen: ...

    def set_focus(self, widget: Widget | None) -> None: ...

    def refresh_bindings(self) -> None: ...

    def run_worker(
        self, work: Callable[[], None], *, thread: bool, group: str, exit_on_error: bool
    ) -> Worker[None]: ...

    def call_from_thread(self, callback: Callable[..., Any], *args: Any, **kwargs: Any) -> Any: ...


class Navigation:
    """Zoom, scale, cursor, layer filter, events and the snapshot inspector: what is seen, never
    the run. Changes go to the pane context's reactives; the panes that draw from them redraw."""

    def __init__(
        self,
        host: NavigationHost,
        ctx: PaneContext,
        *,
        decode: Callable[[list[int]], str] | None = None,  # token ids -> text, for the inspector
    ) -> None:
        self.host = host
        self.ctx = ctx
        self.decode = decode

    @property
    def state(self) -> RunState:
        return self.ctx.state

    @property
    def source(self) -> RunSource:
        source: RunSource = self.ctx.source
        return source

    def focus_layers(self) -> None:
        dashboard = self.host.dashboard
        dashboard.show_updates(False)  # the layers come back in the place they share
        dashboard.query_one(LayersPane).focus_filter()

    def filter(self) -> None:
        """``/``: type to filter the layers (a substring or a glob); Escape clears it. The filter
        narrows the updates pane's rows too; it is typed in the layers pane."""
        self.focus_layers()

    def toggle_updates(self) -> None:
        """``u``: the updates pane in the layers pane's place, its rows focused (Up/Down move,
        Escape gives the keys back); ``u`` again brings the layers back."""
        dashboard = self.host.dashboard
        on = not dashboard.showing_updates
        dashboard.show_updates(on)
        if on:
            dashboard.query_one(UpdatesPane).focus_rows()
        else:
            self.host.set_focus(None)

    def clear_filter(self) -> None:
        self.host.dashboard.query_one(LayersPane).clear_filter()
        self.host.refresh_bindings()

    def toggle_zoom(self) -> None:
        self.ctx.zoomed = not self.ctx.zoomed

    def toggle_log_scale(self) -> None:
        self.ctx.log_scale = not self.ctx.log_scale

    def show_events(self) -> None:
        with self.state.lock:
            events_kept = list(self.state.events)
            total = self.state.events_total

        def jump(step: int | None) -> None:
            if step is not None:
                self.set_cursor(float(step))

        self.host.push_screen(
            EventsScreen(events_kept, self.ctx.palette, total, inspect=self.inspect_snapshot), jump
        )

    # -- the snapshot inspector --------------------------------------------------------------
    def snapshot_events(self) -> list[SnapshotTaken]:
        with self.state.lock:
            return [e for e in self.state.events if isinstance(e, SnapshotTaken)]

    def snapshot_path(self, event: SnapshotTaken) -> Path | None:
        """Where a snapshot event's directory is on this machine: a copy pulled from the run's
        host, the path itself (this machine, or a filesystem both share), or the run directory
        it moved with."""
        path = Path(event.path)
        if self.source.files_host is not None:
            copy = self.source.pulled_snapshot(event.step, path.name)
            if copy is not None:
                return copy
        if event.path and (path / SNAPSHOT_MANIFEST).exists():
            return path
        run_dir = getattr(self.source, "run_dir", None)
        if run_dir is not None:
            name = path.name if event.path else f"step-{event.step}"
            moved = Path(run_dir) / SNAPSHOTS_DIR / name
            if (moved / SNAPSHOT_MANIFEST).exists():
                return moved
        return None

    def inspect_snapshot(self, event: SnapshotTaken) -> bool:
        """Open the inspector on a snapshot event, pulling it first from the run's host when it
        lies there; False (with a note) when it cannot be read here."""
        path = self.snapshot_path(event)
        if path is not None:
            self.host.push_screen(SnapshotScreen(path, self.ctx.palette, self.ctx, decode=self.decode))
            return True
        if self.source.files_host is not None:
            self.pull_snapshot(event, then_inspect=True)
            return True
        self.host.notify(
            f"The snapshot of step {fmt.count(event.step)} is not on this machine "
            f"({event.path or 'no path'}); `nnwatch show` reads it where it is.",
            title="inspect",
            severity="warning",
        )
        return False

    def chosen_snapshot(self, what: str) -> SnapshotTaken | None:
        """The snapshot at or before the step cursor (the newest without one); None, with a
        note, when the run has none."""
        snaps = self.snapshot_events()
        if not snaps:
            self.host.notify(
                "No snapshot in this run yet. s takes one of the next step (live runs); one is "
                "also taken automatically on the first non-finite step.",
                title=what,
                severity="warning",
            )
            return None
        cursor = self.ctx.cursor
        if cursor is None:
            return snaps[-1]
        before = [e for e in snaps if e.step <= cursor]
        if before:
            return max(before, key=lambda e: e.step)
        return min(snaps, key=lambda e: abs(e.step - cursor))

    def inspect_chosen(self) -> None:
        chosen = self.chosen_snapshot("inspect")
        if chosen is not None:
            self.inspect_snapshot(chosen)

    # -- snapshots of a run on another host --------------------------------------------------
    def pull_chosen(self) -> None:
        """``P``: copy the snapshot at the cursor from the run's host to this machine."""
        chosen = self.chosen_snapshot("pull")
        if chosen is not None:
            self.pull_snapshot(chosen, then_inspect=False)

    def pull_snapshot(self, event: SnapshotTaken, *, then_inspect: bool) -> None:
        """Copy a snapshot from ``source.files_host`` in a worker (ssh may take seconds), then
        say where it lies, or open it in the inspector."""
        host = self.source.files_host
        step = event.step
        name = Path(event.path).name
        self.host.notify(
            f"copying the snapshot of step {fmt.count(step)} from {host}…", title="pull", timeout=4
        )

        def work() -> None:
            try:
                path = self.source.pull_snapshot(step, name)
            except SourceError as exc:
                self.host.call_from_thread(
                    self.host.notify, str(exc), title="pull failed", severity="error", timeout=15
                )
                return
            self.host.call_from_thread(self._pulled, path, step, then_inspect)

        self.host.run_worker(work, thread=True, group="pull", exit_on_error=False)

    def _pulled(self, path: Path, step: int, then_inspect: bool) -> None:
        self.host.notify(
            f"step {fmt.count(step)} from {self.source.files_host} is now at {path} "
            "(every file checked by sha256); `nnwatch show` and `nnwatch replay` take it there.",
            title="snapshot pulled",
            timeout=10,
        )
        if then_inspect:
            self.host.push_screen(SnapshotScreen(path, self.ctx.palette, self.ctx, decode=self.decode))

    # -- the step cursor: scrub through history (recorded runs, or back in a live one) -------
    def set_cursor(self, step: float | None) -> None:
        first, last = self.state.step_bounds()
        if step is not None and math.isfinite(first):
            step = min(max(step, first), last)
            if step >= last and self.state.status.state in ("live", "paused"):
                step = None  # at the newest step of a live run: follow it
        self.ctx.cursor = step

    def move_cursor(self, columns: int) -> None:
        first, last = self.state.step_bounds()
        if not math.isfinite(first):
            return
        x0, x1 = chart_window(self.ctx)  # one chart column per press, overlay or not
        width = max(self.host.dashboard.query_one("#loss").size.width - 7, 10)
        per_col = max(1.0, math.ceil((x1 - x0 + 1) / width))
        here = last if self.ctx.cursor is None else self.ctx.cursor
        self.set_cursor(here + columns * per_col)

    def cursor_start(self) -> None:
        first, _ = self.state.step_bounds()
        if math.isfinite(first):
            self.set_cursor(first)

    def cursor_follow(self) -> None:
        self.ctx.cursor = None
