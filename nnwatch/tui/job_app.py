"""The job view: the ranks pane of a whole multi-node job on its own screen (``attach --job``).

A collector thread polls the :class:`~nnwatch.sources.job_fanout.JobFanout` once a second and
hands each ``JobView`` to the pane; Enter on a rank ends this app with that rank, which the
command opens in the full dashboard. ``q`` quits.
"""

from __future__ import annotations

import threading
from typing import Any, ClassVar

from textual.app import App, ComposeResult
from textual.binding import Binding, BindingType
from textual.widgets import Footer

from nnwatch.store.schema import RunMeta, RunSchema
from nnwatch.tui.lost_terminal import watch_terminal
from nnwatch.tui.model import RunState
from nnwatch.tui.widgets.base import Palette, PaneContext
from nnwatch.tui.widgets.ranks import RanksPane
from nnwatch.tui.widgets.stacks import StacksPane


def job_meta(name: str, world: int) -> RunMeta:
    """A stand-in run for the pane's context: no rank of the job is 'the one watched' here."""
    return RunMeta(name=name, schema=RunSchema((), (), (), 0), pid=0, host="", started=0.0,
                   rank=-1, world_size=max(2, world))  # fmt: skip


class JobApp(App[int | None]):
    """The ranks pane, full screen, for one job followed by ``source`` (``poll() -> JobView``),
    and under it, while the job is stuck, every rank's stacks (the stacks pane)."""

    BINDINGS: ClassVar[list[BindingType]] = [Binding("q", "quit", "quit")]
    CSS = "RanksPane { height: 1fr; max-height: 100%; } StacksPane { display: none; }"

    def __init__(self, source: Any, *, interval: float = 1.0, theme: str | None = None) -> None:
        super().__init__()
        self.source = source
        self.interval = interval
        self._theme_requested = theme
        self.ctx = PaneContext(RunState(job_meta(str(getattr(source, "spec", "job")), 2)))
        self._stop = threading.Event()
        self.views = 0
        self.title = f"nnwatch · job {getattr(source, 'spec', '')}"

    def compose(self) -> ComposeResult:
        yield RanksPane(self.ctx, id="ranks")
        yield StacksPane(self.ctx, id="stacks")
        yield Footer()

    def on_mount(self) -> None:
        if self._theme_requested:
            self.theme = self._theme_requested
        self.ctx.palette = Palette.from_app(self)
        pane = self.query_one(RanksPane)
        pane.max_rows = max(8, self.size.height - 6)
        pane.focus()
        threading.Thread(target=self._collect, name="nnwatch-job", daemon=True).start()
        watch_terminal(self)

    def on_resize(self) -> None:
        for pane in self.query(RanksPane):
            pane.max_rows = max(8, self.size.height - 6)
            pane.redraw()

    def _collect(self) -> None:
        while not self._stop.is_set():
            try:
                view = self.source.poll()
            except Exception as exc:  # noqa: BLE001 - shown, retried
                self.call_from_thread(self.notify, f"job reader failed: {exc}", severity="error")
                view = None
            if view is not None:
                self.call_from_thread(self._show, view)
            self._stop.wait(self.interval)

    def _show(self, view: Any) -> None:
        self.views += 1
        self.query_one(RanksPane).show(view)
        self.query_one(StacksPane).show(view)

    def switch_rank(self, rank: int) -> bool:
        """Enter on a row: leave the job view for that rank's dashboard."""
        self._stop.set()
        self.exit(rank)
        return True

    def on_unmount(self) -> None:
        self._stop.set()
