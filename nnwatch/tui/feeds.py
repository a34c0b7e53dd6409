"""The dashboard's data wiring: which run is the main one, which (if any) is overlaid, and the
threads that feed them (``collectors.py``). No UI here beyond posting messages.

The app is given its sources; ``Feeds`` owns what follows from them: a ``RunState`` and a
``SourceCollector`` per run, the hardware sampler, and for a rank of a distributed job the ranks
collector. Switching rank, overlaying a run, dropping it and swapping the two are done here, so
that no thread is left polling a source nobody shows, and no source is closed under a thread
still reading it.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

from textual.message import Message

from nnwatch.sources.base import RunSource
from nnwatch.sources.hardware import HardwareReading
from nnwatch.store.jobs import Job
from nnwatch.tui.collectors import (
    HardwareSampler,
    JobViewCollector,
    Post,
    RankCollector,
    SourceCollector,
)
from nnwatch.tui.messages import OverlayUpdated
from nnwatch.tui.model import RunState
from nnwatch.tui.widgets.base import Overlay
from nnwatch.tui.widgets.compare import run_labels

HardwareOption = str | Callable[[], HardwareReading] | None


def close_quietly(source: RunSource) -> None:
    try:
        source.close()
    except Exception:  # noqa: BLE001 - closing must never turn a clean quit into a crash
        pass


def close_after(collector: SourceCollector, source: RunSource | None) -> None:
    """Close ``source`` once ``collector`` stopped reading it, in a thread: a source blocked in a
    system call must not freeze the screen."""

    def run() -> None:
        collector.join(10.0)
        if source is not None:
            close_quietly(source)

    threading.Thread(target=run, name="nnwatch-close-source", daemon=True).start()


class Feeds:
    """The sources on screen and the threads reading them."""

    def __init__(
        self,
        source: RunSource,
        post: Post,
        interval: float,
        *,
        hardware: HardwareOption = "auto",
        hardware_interval: float = 1.0,
        close_source: bool = True,
        job: Job | None = None,
        ranks_interval: float = 1.0,
        job_views: Callable[[], Any] | None = None,
    ) -> None:
        self.post = post
        self.interval = interval
        self.source = source
        self.close_source = close_source
        self.state = RunState(source.meta)
        self.collector = SourceCollector(source, self.state, post, interval)
        self.sampler: HardwareSampler | None = None
        if hardware is not None:
            reader = None if hardware in ("auto", "psutil") else hardware
            if reader is not None and not callable(reader):
                raise ValueError(
                    "hardware must be 'auto', 'psutil', None, or a callable returning a HardwareReading"
                )
            self.sampler = HardwareSampler(
                self.state, post, hardware_interval, reader, use_nvml=hardware != "psutil"
            )
        self.ranks_interval = ranks_interval
        self.job_views = job_views
        self.ranks = self._ranks_for(source, job)
        self.overlay: Overlay | None = None
        self.started = False

    def _ranks_for(
        self, source: RunSource, job: Job | None = None
    ) -> RankCollector | JobViewCollector | None:
        if self.job_views is not None:  # opened from a job view: its ranks, from its source
            return JobViewCollector(self.job_views, self.post, self.ranks_interval)
        run_dir = getattr(source, "run_dir", None)
        if source.meta.world_size > 1 and run_dir is not None:
            return RankCollector(str(run_dir), self.post, self.ranks_interval, job=job)
        return None

    # -- lifecycle ---------------------------------------------------------------------------
    def start(self) -> None:
        self.started = True
        self.collector.start()
        if self.sampler is not None:
            self.sampler.start()
        if self.ranks is not None:
            self.ranks.start()
        if self.overlay is not None:
            self.overlay.collector.start()

    def stop(self) -> None:
        self.collector.stop()
        if self.sampler is not None:
            self.sampler.stop()
        if self.ranks is not None:
            self.ranks.stop()
        if self.close_source:
            close_quietly(self.source)
        ov, self.overlay = self.overlay, None
        if ov is not None:
            ov.collector.stop()
            if ov.owned:
                close_quietly(ov.source)

    # -- the main run ------------------------------------------------------------------------
    def _adopt(self, state: RunState) -> None:
        """``state`` becomes the main run's: the hardware readings move to it."""
        if self.sampler is not None:
            state.hardware = self.sampler.state.hardware
            self.sampler.state = state

    def replace_primary(self, source: RunSource) -> None:
        """Watch ``source`` (another rank) instead: a fresh state; the old source is closed once
        its collector stopped, if it was ours."""
        old_source, old_collector = self.source, self.collector
        close_old, self.close_source = self.close_source, True  # the new one is ours
        old_collector.stop()
        self.source = source
        self.state = RunState(source.meta)
        self._adopt(self.state)
        self.collector = SourceCollector(source, self.state, self.post, self.interval)
        self.collector.start()
        close_after(old_collector, old_source if close_old else None)

    # -- the overlay -------------------------------------------------------------------------
    def _post_overlay(self, overlay: Overlay) -> Post:
        def post(message: Message) -> Any:
            return self.post(OverlayUpdated(message, overlay))

        return post

    def set_overlay(self, source: RunSource, *, owned: bool = True) -> Overlay:
        """Draw ``source`` over the main run (replacing any overlay); followed while it is live."""
        self.clear_overlay()
        mine, theirs = run_labels(
            self.source.meta.name, source.meta.name, self.source.meta.pid, source.meta.pid
        )
        state = RunState(source.meta)
        overlay = Overlay(state, source, theirs, owned=owned, main_label=mine)
        overlay.collector = SourceCollector(
            source, state, self._post_overlay(overlay), self.interval
        )
        self.overlay = overlay
        if self.started:
            overlay.collector.start()
        return overlay

    def clear_overlay(self) -> None:
        ov, self.overlay = self.overlay, None
        if ov is not None:
            ov.collector.stop()
            close_after(ov.collector, ov.source if ov.owned else None)

    def swap(self) -> Overlay:
        """The overlaid run becomes the main one, and the main one the overlay. Each keeps its
        state and its collector thread; only where their messages go changes."""
        ov = self.overlay
        if ov is None:
            raise LookupError("no run is overlaid")
        old = Overlay(
            self.state, self.source, ov.main_label, self.collector, self.close_source, ov.label
        )
        self.source, self.state, self.collector = ov.source, ov.state, ov.collector
        self.close_source = ov.owned
        self._adopt(self.state)
        self.collector.redirect(self.post)
        old.collector.redirect(self._post_overlay(old))
        self.overlay = old
        if self.ranks is not None:  # the ranks pane follows the main run's job
            self.ranks.stop()
        self.ranks = self._ranks_for(self.source)
        if self.ranks is not None and self.started:
            self.ranks.start()
        return old
