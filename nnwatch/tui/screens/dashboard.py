"""The main screen: header, loss and grad charts, layers, AMP, GPU and events; for a rank of a
distributed job (``world_size > 1``) a ranks pane under the header as well. Below 110x32 cells
the ``narrow`` CSS class rearranges the same panes to fit an 80x24 terminal.

The updates pane shares the layers pane's place: both are tables of one row per layer, and the
dashboard has no room for a second one at 80x24. ``u`` swaps them (the ``updates`` CSS class)."""

from __future__ import annotations

from textual import events
from textual.app import ComposeResult
from textual.containers import Horizontal, Vertical
from textual.screen import Screen
from textual.widgets import Footer

from nnwatch.tui.widgets.amp import AmpPane
from nnwatch.tui.widgets.base import Pane, PaneContext
from nnwatch.tui.widgets.events import EventsPane
from nnwatch.tui.widgets.gpu import GpuPane
from nnwatch.tui.widgets.grad import GradPane
from nnwatch.tui.widgets.header import RunHeader
from nnwatch.tui.widgets.layers import LayersPane
from nnwatch.tui.widgets.loss import LossPane
from nnwatch.tui.widgets.ranks import RanksPane
from nnwatch.tui.widgets.updates import UpdatesPane

NARROW_WIDTH = 110
NARROW_HEIGHT = 32


class DashboardScreen(Screen[None]):
    AUTO_FOCUS = ""  # keys belong to the dashboard until the user focuses a pane (``l``)

    def __init__(self, ctx: PaneContext) -> None:
        super().__init__(id="dashboard")
        self.ctx = ctx

    def compose(self) -> ComposeResult:
        ctx = self.ctx
        yield RunHeader(ctx, id="header")
        if ctx.state.meta.world_size > 1:
            yield RanksPane(ctx, id="ranks")
        with Horizontal(id="charts"):
            yield LossPane(ctx, id="loss")
            yield GradPane(ctx, id="grad")
        with Horizontal(id="middle"):
            yield LayersPane(ctx, id="layers")
            yield UpdatesPane(ctx, id="updates")
            with Vertical(id="side"):
                yield AmpPane(ctx, id="amp")
                yield GpuPane(ctx, id="gpu")
        yield EventsPane(ctx, id="events")
        yield Footer(compact=True, show_command_palette=False)  # ctrl+p still opens it

    @property
    def panes(self) -> list[Pane]:
        return list(self.query(Pane))

    def on_mount(self) -> None:
        self._apply_layout(self.app.size.width, self.app.size.height)

    def on_resize(self, event: events.Resize) -> None:
        self._apply_layout(event.size.width, event.size.height)

    @property
    def showing_updates(self) -> bool:
        """The updates pane is shown in the layers pane's place."""
        return self.has_class("updates")

    def show_updates(self, on: bool) -> None:
        """Show the updates pane (``u``) or the layers pane in their shared place; the pane
        shown draws as soon as it has its size (a hidden one does not draw)."""
        if on == self.showing_updates:
            return
        self.set_class(on, "updates")
        pane = self.query_one(UpdatesPane) if on else self.query_one(LayersPane)
        self.call_after_refresh(pane.redraw)

    def _apply_layout(self, width: int, height: int) -> None:
        self.set_class(width < NARROW_WIDTH or height < NARROW_HEIGHT, "narrow")
