"""``NNWatchApp``: the dashboard for one run, whatever its source (live, recorded, fixture).

The source is passed in, so a demo, a test or another program can embed the monitor:
``NNWatchApp(source, fps=3).run()`` returns 0 when the user presses ``q``; ``compare=other``
overlays a second run on the charts from the start. The app composes its parts, each an object
given only the narrow context it needs (a Protocol declared beside it), never a mixin:

- ``feeds.py``: the sources and their threads; the app's redraw tick hands what they changed to
  the pane context (``PaneContext.changed``), at ``fps``;
- ``steering.py``: ``Steering``, the keys that steer training (they ask first, and say what
  happened);
- ``navigation.py``: ``Navigation``, zoom, log scale, the step cursor, the layer filter, events,
  the inspector;
- ``rank_switch.py``: ``RankSwitch``, ``[``/``]`` for the ranks of a distributed job;
- ``overlay.py``: ``Overlays``, ``o``/``x``/``O``, another run side by side on the charts;
- ``notices.py``: what the threads report, in words;
- ``bindings.py`` and ``keymap.py``: the keys, each with an id a user can remap (see ``?``).

Panes redraw themselves: they watch the pane context's reactives (``widgets/base.py``).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any, ClassVar

from textual import events
from textual.app import App
from textual.binding import Binding
from textual.screen import Screen

from nnwatch.sources.base import RunSource
from nnwatch.store.jobs import Job
from nnwatch.store.schema import FieldName
from nnwatch.tui import notices
from nnwatch.tui.bindings import (
    BINDINGS,
    NOT_LIVE,
    OVERLAY_ACTIONS,
    RANK_ACTIONS,
    STEERING,
    footer_state,
    help_note,
)
from nnwatch.tui.collectors import HardwareSampler, JobViewCollector, RankCollector, SourceCollector
from nnwatch.tui.feeds import Feeds, HardwareOption
from nnwatch.tui.keymap import KEYS_ENV, KEYS_FILE, load_keymap, parse_keymap
from nnwatch.tui.lost_terminal import watch_terminal
from nnwatch.tui.messages import (
    CommandFinished,
    OverlayUpdated,
    RanksUpdated,
    ReaderFailed,
    ReaderRecovered,
    Reconnected,
    RecordsArrived,
    RunStateChanged,
    SnapshotWritten,
)
from nnwatch.tui.model import RunState
from nnwatch.tui.navigation import Navigation
from nnwatch.tui.overlay import Overlays
from nnwatch.tui.rank_switch import RankSwitch
from nnwatch.tui.screens.dashboard import DashboardScreen
from nnwatch.tui.screens.help import HelpScreen
from nnwatch.tui.steering import Steering
from nnwatch.tui.widgets.base import Outcome, Overlay, Palette, PaneContext
from nnwatch.tui.widgets.ranks import RanksPane

__all__ = [
    "DEFAULT_FPS",
    "KEYS_ENV",
    "KEYS_FILE",
    "NOT_LIVE",
    "OVERLAY_ACTIONS",
    "RANK_ACTIONS",
    "STEERING",
    "HardwareOption",
    "NNWatchApp",
    "load_keymap",
    "parse_keymap",
]

DEFAULT_FPS = 3.0
#: While a large history loads, only the header (with its progress) is redrawn.
LOADING_TOPICS = frozenset({"header"})


def checked_fps(fps: float) -> float:
    if not fps or fps <= 0 or not math.isfinite(fps):
        raise ValueError(f"fps must be a positive number, not {fps!r}")
    return float(fps)


class NNWatchApp(App[int]):
    """The live dashboard. ``run()`` returns 0 on ``q``."""

    CSS_PATH = "app.tcss"
    TITLE = "nnwatch"
    BINDINGS: ClassVar[list[Binding]] = BINDINGS  # type: ignore[assignment]  # only Bindings here

    def __init__(
        self,
        source: RunSource,
        *,
        fps: float = DEFAULT_FPS,
        hardware: HardwareOption = "auto",  # "psutil": no NVML; None: no sampling; or a reader
        hardware_interval: float = 1.0,
        keymap: dict[str, str] | None = None,
        theme: str | None = None,
        close_source: bool = True,  # also applies to ``compare``
        gpu_uuids: list[str] | None = None,
        job: Job | None = None,  # the distributed job this run belongs to; found when not given
        ranks_interval: float = 1.0,
        decode: Callable[[list[int]], str] | None = None,  # token ids -> text, for the inspector
        compare: RunSource | None = None,  # a second run to overlay on the charts from the start
        lister: Callable[[], list[Any]] | None = None,  # the runs `o` offers (default: registry)
        open_run: Callable[[Any], RunSource] | None = None,  # a listed run -> its source
        job_views: Callable[[], Any] | None = None,  # the ranks pane's views (from a job view)
    ) -> None:
        super().__init__()
        self.fps = checked_fps(fps)
        self.feeds = Feeds(
            source, self.post_message, 1.0 / self.fps, hardware=hardware,
            hardware_interval=hardware_interval, close_source=close_source, job=job,
            ranks_interval=ranks_interval, job_views=job_views,
        )  # fmt: skip
        self.ctx = PaneContext(self.state, source, gpu_uuids=gpu_uuids)
        self.steering = Steering(self, self.feeds, self.ctx)
        self.navigation = Navigation(self, self.ctx, decode=decode)
        self.overlays = Overlays(self, self.feeds, self.ctx, lister=lister, open_run=open_run)
        self.rank_switch = RankSwitch(self, self.feeds)
        self._keymap_requested = dict(keymap or {})
        self._theme_requested = theme
        self.outcomes: list[str] = []  # every command outcome shown, oldest first (for tests)
        self.loading = False  # a large history is still being read (see refresh_panes)
        self.title = f"nnwatch · {source.meta.name}"
        if compare is not None:
            self.ctx.overlay = self.feeds.set_overlay(compare, owned=close_source)

    # -- what the feeds hold -----------------------------------------------------------------
    @property
    def source(self) -> RunSource:
        return self.feeds.source

    @property
    def state(self) -> RunState:
        return self.feeds.state

    @property
    def collector(self) -> SourceCollector:
        return self.feeds.collector

    @property
    def sampler(self) -> HardwareSampler | None:
        return self.feeds.sampler

    @property
    def ranks(self) -> RankCollector | JobViewCollector | None:
        return self.feeds.ranks

    @property
    def overlay(self) -> Overlay | None:
        return self.feeds.overlay

    # -- lifecycle ---------------------------------------------------------------------------
    def get_default_screen(self) -> Screen[Any]:
        return DashboardScreen(self.ctx)

    @property
    def dashboard(self) -> DashboardScreen:
        for screen in self.screen_stack:
            if isinstance(screen, DashboardScreen):
                return screen
        raise LookupError("the dashboard screen is not mounted")

    def on_mount(self) -> None:
        if self._theme_requested:
            self.theme = self._theme_requested
        if self._keymap_requested:
            self.set_keymap(self._keymap_requested)
        self.ctx.palette = Palette.from_app(self)
        self.theme_changed_signal.subscribe(self, self._on_theme_changed)
        self.feeds.start()
        self.set_interval(1.0 / self.fps, self.refresh_panes, name="nnwatch-redraw")
        watch_terminal(self, self._release_all)  # a terminal gone without a hangup ends it

    def _release_all(self) -> None:
        """What the dashboard holds, closed now: the collectors and the run's source."""
        self._stop_collectors()
        self.source.close()

    def on_unmount(self) -> None:
        self._stop_collectors()

    def _stop_collectors(self) -> None:
        self.feeds.stop()
        self.ctx.overlay = None

    def _on_theme_changed(self, _theme: object) -> None:
        self.ctx.palette = Palette.from_app(self)  # every pane draws from it: each redraws

    def main_run_changed(self) -> None:
        """The main run is another source now (a rank switch, a swap): panes start over."""
        self.ctx.state, self.ctx.source = self.state, self.source
        self.loading = False
        self.ctx.cursor, self.ctx.outcome = None, Outcome()
        self.ctx.redraw_everything()
        self.refresh_bindings()

    def refresh_panes(self) -> None:
        """The redraw tick: hand the data topics the collectors changed to the pane context,
        whose panes redraw the ones they draw from.

        While a big history is still loading only the header (with its progress) is redrawn:
        every chart would be stale a moment later, and drawing would slow the load down.
        """
        try:
            dashboard = self.dashboard
        except LookupError:
            return
        if not self.loading and self.state.history.rows:
            with self.state.lock:  # no scaler in this run: the AMP pane shrinks to one line
                dashboard.set_class(not self.state.history.measured(FieldName.AMP_SCALE), "no-amp")
        changed = self.state.take_changes(LOADING_TOPICS if self.loading else None)
        if changed:
            self.ctx.changed = changed

    def redraw_everything(self) -> None:
        """Every pane draws again now (tests and screenshots, once the data settled)."""
        self.refresh_panes()
        self.ctx.redraw_everything()

    # -- facts from the collectors -----------------------------------------------------------
    def on_records_arrived(self, message: RecordsArrived) -> None:
        was_loading, self.loading = self.loading, message.more_waiting
        if self.collector.polls == 1 or (was_loading and not self.loading):
            self.refresh_panes()  # first data, or the history just finished loading: draw now

    def on_run_state_changed(self, message: RunStateChanged) -> None:
        notice = notices.run_state(message.state, message.previous, message.message)
        if notice is not None:
            self.notify(notice.text, title=notice.title, severity=notice.severity, timeout=notice.timeout)  # fmt: skip
        if message.state != "paused" and self.ctx.outcome.text.startswith(("paused", "pause:")):
            self.ctx.outcome = Outcome()  # the pause it told of ended
        self.refresh_bindings()

    def on_reader_failed(self, message: ReaderFailed) -> None:
        """A reader thread raised: say so in the header (it stays until the thread recovers) and
        in a notification, with the error's own words, instead of waiting for ever."""
        self.state.mark_reader_failed(message.what, message.message)
        self.loading = False  # a load that broke off must not keep the panes from drawing
        notice = notices.reader_failed(message.what, message.message)
        self.notify(notice.text, title=notice.title, severity=notice.severity, timeout=notice.timeout)  # fmt: skip
        self.refresh_panes()

    def on_reader_recovered(self, message: ReaderRecovered) -> None:
        self.state.clear_reader_failed(message.what)
        self.refresh_panes()

    def on_ranks_updated(self, message: RanksUpdated) -> None:
        for pane in self.dashboard.query(RanksPane):
            pane.show(message.view)

    def on_snapshot_written(self, message: SnapshotWritten) -> None:
        if self.collector.polls <= 1:
            return  # snapshots already in the history of a run we just opened
        notice = notices.snapshot_written(message, self.source.files_host)
        self.notify(notice.text, title=notice.title)

    def on_reconnected(self, message: Reconnected) -> None:
        if message.ok:
            self.notify("Reconnected; waiting for records.", title="reconnect")
        else:
            self.notify(f"Reconnect failed: {message.message}", title="reconnect", severity="error")

    def on_command_finished(self, message: CommandFinished) -> None:
        self.steering.finished(message)

    def on_overlay_updated(self, message: OverlayUpdated) -> None:
        self.overlays.updated(message)

    def show_outcome(self, text: str, *, error: bool) -> None:
        """The answer to a command, in the header and in a toast."""
        self.outcomes.append(text)
        self.ctx.outcome = Outcome(text, error)
        self.notify(text, severity="error" if error else "information", timeout=6)

    # -- bindings ----------------------------------------------------------------------------
    def check_action(self, action: str, parameters: tuple[object, ...]) -> bool | None:
        return footer_state(
            action, can_command=self.source.can_command, has_ranks=self.ranks is not None,
            has_overlay=self.overlay is not None, files_remote=self.source.files_host is not None,
            filtering=bool(self.ctx.layer_filter),
        )  # fmt: skip

    def key_of(self, binding: Binding) -> str:
        """The key a binding is on now, after the user's keymap."""
        key = self._keymap.get(binding.id or "", binding.key) if binding.id else binding.key
        return binding.key_display if key == binding.key and binding.key_display else key

    def binding_for_key(self, key: str) -> Binding | None:
        for b in self.BINDINGS:
            keys = self._keymap.get(b.id or "", b.key) if b.id else b.key
            if key in [k.strip() for k in keys.split(",")]:
                return b
        return None

    def on_key(self, event: events.Key) -> None:
        b = self.binding_for_key(event.key)
        if b is not None and b.action in STEERING and not self.source.can_command:
            event.stop()
            self.show_outcome(f"{b.description}: {NOT_LIVE}", error=True)

    # -- actions: the app's own, then each controller's ---------------------------------------
    def action_reconnect(self) -> None:
        self.notify("Reconnecting…", title="reconnect", timeout=3)

        def done(ok: bool, msg: str) -> None:
            self.post_message(Reconnected(ok, msg))

        self.collector.reconnect(done)

    def action_show_help(self) -> None:
        def available(b: Binding) -> str:
            return help_note(b, can_command=self.source.can_command, has_overlay=self.overlay is not None)

        self.push_screen(HelpScreen(list(self.BINDINGS), self.key_of, available))

    async def action_quit(self) -> None:
        self._stop_collectors()
        self.exit(0)

    def action_steer(self, name: str) -> None:
        self.steering.steer(name)

    def action_focus_layers(self) -> None:
        self.navigation.focus_layers()

    def action_filter(self) -> None:
        self.navigation.filter()

    def action_toggle_updates(self) -> None:
        self.navigation.toggle_updates()

    def action_clear_filter(self) -> None:
        self.navigation.clear_filter()

    def action_toggle_zoom(self) -> None:
        self.navigation.toggle_zoom()

    def action_toggle_log_scale(self) -> None:
        self.navigation.toggle_log_scale()

    def action_show_events(self) -> None:
        self.navigation.show_events()

    def action_inspect_snapshot(self) -> None:
        self.navigation.inspect_chosen()

    def action_pull_snapshot(self) -> None:
        self.navigation.pull_chosen()

    def action_move_cursor(self, columns: int) -> None:
        self.navigation.move_cursor(columns)

    def action_cursor_start(self) -> None:
        self.navigation.cursor_start()

    def action_cursor_follow(self) -> None:
        self.navigation.cursor_follow()

    def action_choose_overlay(self) -> None:
        self.overlays.choose()

    def action_clear_overlay(self) -> None:
        self.overlays.clear()

    def action_swap_overlay(self) -> None:
        self.overlays.swap()

    def action_prev_rank(self) -> None:
        self.rank_switch.step(-1)

    def action_next_rank(self) -> None:
        self.rank_switch.step(1)

    def switch_rank(self, rank: int) -> bool:
        """Watch another rank of the job (the ranks pane's Enter)."""
        return self.rank_switch.switch(rank)
