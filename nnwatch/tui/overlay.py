"""Runs side by side: ``o`` overlays another run (live, finished or crashed) on the loss and grad
charts, in a second colour, aligned by step, with a legend naming both; ``x`` drops it and ``O``
makes it the main run (the main run then becomes the overlay). The main run stays pinned until
then: the overlay never steers, and the layers, events and header stay the main run's.

The overlay is just another ``RunSource`` with its own collector thread, so a live one keeps
growing on screen; ``NNWatchApp(source, compare=other)`` (``nnwatch open RUN --compare OTHER``)
starts with one.
"""

from __future__ import annotations

from typing import Any

from nnwatch.sources.base import RunSource
from nnwatch.tui.messages import OverlayUpdated, ReaderFailed, RecordsArrived, RunStateChanged
from nnwatch.tui.monitor import MonitorBase
from nnwatch.tui.picker import default_lister
from nnwatch.tui.run_sources import source_for
from nnwatch.tui.screens.compare import CompareScreen
from nnwatch.tui.widgets.base import Overlay, panes_reading


def open_listed(info: Any) -> RunSource:
    return source_for(info)[0]


class OverlayActions(MonitorBase):
    """Choosing, following, dropping and swapping the overlaid run."""

    def action_choose_overlay(self) -> None:
        exclude: list[object] = [getattr(self.source, "run_dir", None)]

        def chosen(info: Any) -> None:
            if info is not None:
                self.overlay_run(info)

        self.push_screen(CompareScreen(self.lister or default_lister, exclude), chosen)

    def overlay_run(self, info: Any) -> bool:
        """Open a listed run and overlay it; False, with the reason on screen, if it cannot be."""
        try:
            source = (self.open_run or open_listed)(info)
        except Exception as exc:  # noqa: BLE001 - SourceError or an unreadable run: said, not raised
            self.notify(
                f"Cannot open {getattr(info, 'name', info)}: {exc}",
                title="compare",
                severity="error",
            )
            return False
        self.compare_with(source)
        return True

    def compare_with(self, source: RunSource, *, owned: bool = True) -> Overlay:
        """Overlay ``source`` on the charts (replacing any overlay)."""
        overlay = self.feeds.set_overlay(source, owned=owned)
        self.ctx.overlay = overlay
        self._overlay_changed()
        self.notify(
            f"{overlay.label} is overlaid on the charts. x drops it, O makes it the main run.",
            title="compare",
            timeout=4,
        )
        return overlay

    def action_clear_overlay(self) -> None:
        overlay = self.overlay
        if overlay is None:
            return
        self.feeds.clear_overlay()
        self.ctx.overlay = None
        self._overlay_changed()
        self.notify(f"{overlay.label} is no longer overlaid.", title="compare", timeout=3)

    def action_swap_overlay(self) -> None:
        if self.overlay is None:
            return
        overlay = self.feeds.swap()
        self.ctx.overlay = overlay
        self.title = f"nnwatch · {self.source.meta.name}"
        self._main_run_changed()
        self.notify(
            f"{self.source.meta.name} is the main run now; {overlay.label} is overlaid.",
            title="compare",
            timeout=4,
        )

    def _overlay_changed(self) -> None:
        self.state.touch(*panes_reading("overlay"))
        self.refresh_panes()
        self.refresh_bindings()

    def on_overlay_updated(self, message: OverlayUpdated) -> None:
        """News from the overlaid run's collector: redraw the charts on new records; say when
        it crashed, got lost or its reader failed (its state is in the header)."""
        overlay = self.overlay
        if message.overlay is not overlay or overlay is None:
            return  # about an overlay already dropped or swapped
        inner = message.message
        if isinstance(inner, RecordsArrived):
            self.state.touch(*panes_reading("overlay"))  # drawn at the next tick, as the main run's
        elif isinstance(inner, RunStateChanged):
            self.state.touch(*panes_reading("overlay_state"))
            if inner.state in ("crashed", "lost"):
                note = f": {inner.message}" if inner.message else ""
                self.notify(
                    f"The overlaid run {overlay.label} is {inner.state}{note}.",
                    title="compare",
                    severity="warning",
                )
        elif isinstance(inner, ReaderFailed):
            self.notify(
                f"Reading the overlaid run {overlay.label} failed: {inner.message}.",
                title="compare",
                severity="error",
                timeout=10,
            )
