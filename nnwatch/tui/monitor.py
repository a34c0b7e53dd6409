"""``MonitorBase``: the dashboard's core, which the key actions (``steering.py``, ``navigation.py``,
``rank_switch.py``, ``overlay.py``) build on and ``app.py`` puts together as ``NNWatchApp``.

It takes its sources as arguments, wires them to their threads (``feeds.py``), redraws only the
panes whose data changed, at ``fps``, and turns what the threads report into notifications and
header notes: a run that is lost, crashed or hung says so, and a monitor-side failure shows in the
error's own words rather than as a screen that silently stops changing.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

from textual import events
from textual.app import App
from textual.binding import Binding
from textual.screen import Screen

from nnwatch.sources.base import RunSource
from nnwatch.store.jobs import Job
from nnwatch.tui import format as fmt
from nnwatch.tui.bindings import NOT_LIVE, OVERLAY_ACTIONS, RANK_ACTIONS, STEERING
from nnwatch.tui.collectors import (
    HardwareSampler,
    JobViewCollector,
    RankCollector,
    SourceCollector,
)
from nnwatch.tui.feeds import Feeds, HardwareOption
from nnwatch.tui.lost_terminal import watch_terminal
from nnwatch.tui.messages import (
    RanksUpdated,
    ReaderFailed,
    ReaderRecovered,
    Reconnected,
    RecordsArrived,
    RunStateChanged,
    SnapshotWritten,
)
from nnwatch.tui.model import RunState
from nnwatch.tui.screens.dashboard import DashboardScreen
from nnwatch.tui.screens.help import HelpScreen
from nnwatch.tui.widgets.base import Overlay, Palette, PaneContext, ViewSettings, panes_reading
from nnwatch.tui.widgets.ranks import RanksPane

DEFAULT_FPS = 3.0


class MonitorBase(App[int]):
    """Sources, threads, redraws and what the threads report. ``run()`` returns 0 on ``q``."""

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
        if not fps or fps <= 0 or not math.isfinite(fps):
            raise ValueError(f"fps must be a positive number, not {fps!r}")
        self.fps = float(fps)
        self.feeds = Feeds(
            source,
            self.post_message,
            1.0 / self.fps,
            hardware=hardware,
            hardware_interval=hardware_interval,
            close_source=close_source,
            job=job,
            ranks_interval=ranks_interval,
            job_views=job_views,
        )
        self.view = ViewSettings()
        self.ctx = PaneContext(self.state, self.view, source, gpu_uuids=gpu_uuids)
        self.decode = decode
        self.lister = lister
        self.open_run = open_run
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
        return self._dashboard()

    def _dashboard(self) -> DashboardScreen:
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
        self.ctx.palette = Palette.from_app(self)
        self.state.touch(*self.state.versions)
        self.refresh_panes()

    def _main_run_changed(self) -> None:
        """The main run is another source now (a rank switch, a swap): panes start over."""
        self.ctx.state, self.ctx.source = self.state, self.source
        self.view.cursor, self.view.outcome, self.view.outcome_error = None, "", False
        self.loading = False
        for pane in self._dashboard().panes:
            pane.seen_version = -1  # the new state has versions of its own
        self.refresh_panes()
        self.refresh_bindings()

    def refresh_panes(self) -> int:
        """Redraw the panes whose data changed since they were last drawn; returns how many.

        While a big history is still loading only the header (with its progress) is redrawn:
        every chart would be stale a moment later, and drawing would slow the load down.
        """
        try:
            dashboard = self._dashboard()
        except LookupError:
            return 0
        panes = dashboard.panes
        versions = self.state.versions
        if not self.loading and self.state.history.rows:
            with self.state.lock:  # no scaler in this run: the AMP pane shrinks to one line
                dashboard.set_class(not self.state.history.measured("amp_scale"), "no-amp")
        redrawn = 0
        for pane in panes:
            if self.loading and pane.key != "header":
                continue
            if pane.seen_version != versions.get(pane.key, 0):
                pane.redraw()
                redrawn += 1
        return redrawn

    # -- facts from the collectors -----------------------------------------------------------
    def on_records_arrived(self, message: RecordsArrived) -> None:
        was_loading, self.loading = self.loading, message.more_waiting
        if self.collector.polls == 1 or (was_loading and not self.loading):
            self.refresh_panes()  # first data, or the history just finished loading: draw now

    def on_run_state_changed(self, message: RunStateChanged) -> None:
        state, note = message.state, message.message
        if state in ("lost", "crashed"):
            what = "lost" if state == "lost" else "crashed"
            self.notify(
                f"The run is {what}{': ' + note if note else ''}. Its history stays on screen; r reconnects.",
                title=f"run {what}",
                severity="error",
                timeout=8,
            )
        elif state == "hung":
            self.notify(
                f"The trainer stopped stepping{': ' + note if note else ''}.",
                title="run hung",
                severity="warning",
            )
        elif state == "finished" and message.previous not in ("connecting",):
            self.notify("The run finished.", title="finished")
        elif state == "interrupted" and message.previous not in ("connecting",):
            self.notify(f"The run was interrupted{': ' + note if note else ''}.", title="interrupted")
        elif state == "live" and message.previous in ("lost", "hung", "paused"):
            self.notify("The run is live again.", title="live")
        if state != "paused" and self.view.outcome.startswith(("paused", "pause:")):
            self.view.outcome, self.view.outcome_error = "", False  # the pause it told of ended
            self.state.touch(*panes_reading("outcome"))
        self.refresh_bindings()

    def on_reader_failed(self, message: ReaderFailed) -> None:
        """A reader thread raised: say so in the header (it stays until the thread recovers) and
        in a notification, with the error's own words, instead of waiting for ever."""
        self.state.mark_reader_failed(message.what, message.message)
        self.loading = False  # a load that broke off must not keep the panes from drawing
        hint = (
            " The monitor keeps retrying; please report this as an nnwatch bug."
            if message.what == "reader"
            else ""
        )
        self.notify(
            f"{message.what} failed: {message.message}.{hint}",
            title=f"{message.what} failed",
            severity="error",
            timeout=15,
        )
        self.refresh_panes()

    def on_reader_recovered(self, message: ReaderRecovered) -> None:
        self.state.clear_reader_failed(message.what)
        self.refresh_panes()

    def on_ranks_updated(self, message: RanksUpdated) -> None:
        for pane in self._dashboard().query(RanksPane):
            pane.show(message.view)

    def on_snapshot_written(self, message: SnapshotWritten) -> None:
        if self.collector.polls <= 1:
            return  # snapshots already in the history of a run we just opened
        reason = f" ({message.reason})" if message.reason else ""
        host = self.source.files_host
        where = f"{host}:{message.path}" if host else message.path
        hint = "; i inspects it here, P copies it here" if host else ""
        self.notify(
            f"step {fmt.count(message.step)}: {where}{reason}{hint}", title="snapshot written"
        )

    def on_reconnected(self, message: Reconnected) -> None:
        if message.ok:
            self.notify("Reconnected; waiting for records.", title="reconnect")
        else:
            self.notify(f"Reconnect failed: {message.message}", title="reconnect", severity="error")

    def _show_outcome(self, text: str, *, error: bool) -> None:
        self.outcomes.append(text)
        self.view.outcome = text
        self.view.outcome_error = error
        self.state.touch(*panes_reading("outcome"))
        self.refresh_panes()
        self.notify(text, severity="error" if error else "information", timeout=6)

    # -- bindings ----------------------------------------------------------------------------
    def check_action(self, action: str, parameters: tuple[object, ...]) -> bool | None:
        if action in STEERING and not self.source.can_command:
            return None  # shown greyed out in the footer; pressing it explains why (on_key)
        if action in RANK_ACTIONS and self.ranks is None:
            return False  # a single process: no rank selector in the footer
        if action in OVERLAY_ACTIONS and self.overlay is None:
            return False  # nothing overlaid: nothing to drop or swap
        if action == "pull_snapshot" and self.source.files_host is None:
            return False  # the snapshots are on this machine already
        if action == "clear_filter" and not self.view.layer_filter:
            return False  # Escape has nothing to clear; it stays free for the panes
        return True

    def key_of(self, binding: Binding) -> str:
        """The key a binding is on now, after the user's keymap."""
        key = self._keymap.get(binding.id or "", binding.key) if binding.id else binding.key
        return binding.key_display if key == binding.key and binding.key_display else key

    def binding_for_key(self, key: str) -> Binding | None:
        for b in self.BINDINGS:
            if not isinstance(b, Binding):
                continue
            keys = self._keymap.get(b.id or "", b.key) if b.id else b.key
            if key in [k.strip() for k in keys.split(",")]:
                return b
        return None

    def on_key(self, event: events.Key) -> None:
        b = self.binding_for_key(event.key)
        if b is not None and b.action in STEERING and not self.source.can_command:
            event.stop()
            self._show_outcome(f"{b.description}: {NOT_LIVE}", error=True)

    def action_reconnect(self) -> None:
        self.notify("Reconnecting…", title="reconnect", timeout=3)

        def done(ok: bool, msg: str) -> None:
            self.post_message(Reconnected(ok, msg))

        self.collector.reconnect(done)

    def action_show_help(self) -> None:
        def available(b: Binding) -> str:
            if b.action in STEERING and not self.source.can_command:
                return "not live"
            if b.action in OVERLAY_ACTIONS and self.overlay is None:
                return "after o"
            return ""

        shown = [b for b in self.BINDINGS if isinstance(b, Binding)]
        self.push_screen(HelpScreen(shown, self.key_of, available))

    async def action_quit(self) -> None:
        self._stop_collectors()
        self.exit(0)
