"""Runs side by side: ``o`` overlays another run (live, finished or crashed) on the loss and grad
charts, in a second colour, aligned by step, with a legend naming both; ``x`` drops it and ``O``
makes it the main run (the main run then becomes the overlay). The main run stays pinned until
then: the overlay never steers, and the layers, events and header stay the main run's.

The overlay is just another ``RunSource`` with its own collector thread, so a live one keeps
growing on screen; ``NNWatchApp(source, compare=other)`` (``nnwatch open RUN --compare OTHER``)
starts with one.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol

from nnwatch.sources.base import RunSource
from nnwatch.tui.feeds import Feeds
from nnwatch.tui.host import Notifier, ScreenPusher
from nnwatch.tui.messages import OverlayUpdated, ReaderFailed, RecordsArrived, RunStateChanged
from nnwatch.tui.picker import default_lister
from nnwatch.tui.run_sources import source_for
from nnwatch.tui.screens.compare import CompareScreen
from nnwatch.tui.widgets.base import Overlay, PaneContext


def open_listed(info: Any) -> RunSource:
    return source_for(info)[0]


class OverlayHost(Notifier, ScreenPusher, Protocol):
    """What the overlay needs of the app: a word to the user, the footer's keys, and a main run
    that changed (a swap)."""

    title: str

    def refresh_bindings(self) -> None: ...

    def main_run_changed(self) -> None: ...


class Overlays:
    """Choosing, following, dropping and swapping the overlaid run."""

    def __init__(
        self,
        host: OverlayHost,
        feeds: Feeds,
        ctx: PaneContext,
        *,
        lister: Callable[[], list[Any]] | None = None,  # the runs `o` offers (default: registry)
        open_run: Callable[[Any], RunSource] | None = None,  # a listed run -> its source
    ) -> None:
        self.host = host
        self.feeds = feeds
        self.ctx = ctx
        self.lister = lister
        self.open_run = open_run

    def choose(self) -> None:
        """``o``: pick a run from the list and overlay it."""
        exclude: list[object] = [getattr(self.feeds.source, "run_dir", None)]

        def chosen(info: Any) -> None:
            if info is not None:
                self.overlay_run(info)

        self.host.push_screen(CompareScreen(self.lister or default_lister, exclude), chosen)

    def overlay_run(self, info: Any) -> bool:
        """Open a listed run and overlay it; False, with the reason on screen, if it cannot be."""
        try:
            source = (self.open_run or open_listed)(info)
        except Exception as exc:  # noqa: BLE001 - SourceError or an unreadable run: said, not raised
            self.host.notify(
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
        self.host.refresh_bindings()
        self.host.notify(
            f"{overlay.label} is overlaid on the charts. x drops it, O makes it the main run.",
            title="compare",
            timeout=4,
        )
        return overlay

    def clear(self) -> None:
        """``x``: the overlaid run leaves the charts."""
        overlay = self.feeds.overlay
        if overlay is None:
            return
        self.feeds.clear_overlay()
        self.ctx.overlay = None
        self.host.refresh_bindings()
        self.host.notify(f"{overlay.label} is no longer overlaid.", title="compare", timeout=3)

    def swap(self) -> None:
        """``O``: the overlaid run becomes the main one, and the main one the overlay."""
        if self.feeds.overlay is None:
            return
        overlay = self.feeds.swap()
        self.ctx.overlay = overlay
        name = self.feeds.source.meta.name
        self.host.title = f"nnwatch · {name}"
        self.host.main_run_changed()
        self.host.notify(
            f"{name} is the main run now; {overlay.label} is overlaid.",
            title="compare",
            timeout=4,
        )

    def updated(self, message: OverlayUpdated) -> None:
        """News from the overlaid run's collector: redraw the charts on new records; say when
        it crashed, got lost or its reader failed (its state is in the header)."""
        overlay = self.feeds.overlay
        if message.overlay is not overlay or overlay is None:
            return  # about an overlay already dropped or swapped
        inner = message.message
        if isinstance(inner, RecordsArrived):
            self.ctx.overlay = overlay  # the same run, more of it: the panes that show it redraw
        elif isinstance(inner, RunStateChanged):
            self.ctx.overlay = overlay  # the header says how it is doing
            if inner.state in ("crashed", "lost"):
                note = f": {inner.message}" if inner.message else ""
                self.host.notify(
                    f"The overlaid run {overlay.label} is {inner.state}{note}.",
                    title="compare",
                    severity="warning",
                )
        elif isinstance(inner, ReaderFailed):
            self.host.notify(
                f"Reading the overlaid run {overlay.label} failed: {inner.message}.",
                title="compare",
                severity="error",
                timeout=10,
            )
