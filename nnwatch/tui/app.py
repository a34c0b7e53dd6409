"""``NNWatchApp``: the dashboard for one run, whatever its source (live, recorded, fixture).

The source is passed in, so a demo, a test or another program can embed the monitor:
``NNWatchApp(source, fps=3).run()`` returns 0 when the user presses ``q``. Two daemon threads
feed it (``collectors.py``); a timer at ``fps`` redraws only the panes whose data changed. Every
binding has an id (see ``?``) so users can remap it; the keys that steer training ask first, go
through ``source.command`` and say what happened, or why they could not.

For a rank of a distributed job a third thread follows every rank (``RankCollector``) for the
ranks pane, and ``[``/``]`` switch the dashboard to the previous/next rank's run.
"""

from __future__ import annotations

import json
import math
import os
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any, ClassVar

from textual import events
from textual.app import App
from textual.binding import Binding
from textual.screen import Screen

from nnwatch.sources.base import RunSource, SourceError
from nnwatch.sources.hardware import HardwareReading
from nnwatch.store.jobs import Job
from nnwatch.tui import format as fmt
from nnwatch.tui.collectors import HardwareSampler, RankCollector, SourceCollector
from nnwatch.tui.messages import (
    CommandFinished,
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
from nnwatch.tui.screens.dialogs import ClipScreen, ConfirmScreen
from nnwatch.tui.screens.events import EventsScreen
from nnwatch.tui.screens.help import HelpScreen
from nnwatch.tui.screens.snapshot import SnapshotScreen
from nnwatch.tui.widgets.base import Palette, PaneContext, ViewSettings
from nnwatch.tui.widgets.layers import LayersPane
from nnwatch.tui.widgets.ranks import RanksPane

DEFAULT_FPS = 3.0
#: Commands sent to the trainer. Names match the live channel's command set.
CMD_SNAPSHOT, CMD_PAUSE, CMD_RESUME, CMD_CLIP, CMD_ANOMALY = (
    "snapshot",
    "pause",
    "resume",
    "set_clip",
    "anomaly",
)
#: Actions that change training: greyed out (and explained) when the source cannot be steered.
STEERING = frozenset({"request_snapshot", "toggle_pause", "set_clip", "arm_anomaly"})
#: Actions that only mean something for a rank of a distributed job: hidden for a single process.
RANK_ACTIONS = frozenset({"prev_rank", "next_rank"})
NOT_LIVE = "this run is not live, so it cannot be steered; attach to a running trainer with `nnwatch attach`"
KEYS_ENV = "NNWATCH_KEYS"
KEYS_FILE = Path("~/.config/nnwatch/keys.json")

HardwareOption = str | Callable[[], HardwareReading] | None


def parse_keymap(spec: str) -> dict[str, str]:
    """``"snapshot=S,quit=ctrl+q"`` -> {"snapshot": "S", "quit": "ctrl+q"}; bad items raise."""
    out: dict[str, str] = {}
    for item in spec.split(","):
        item = item.strip()
        if not item:
            continue
        if "=" not in item:
            raise ValueError(f"key mapping {item!r} is not of the form id=key (e.g. snapshot=S)")
        bid, key = (s.strip() for s in item.split("=", 1))
        if not bid or not key:
            raise ValueError(f"key mapping {item!r} has an empty id or key")
        out[bid] = key
    return out


def load_keymap(
    cli_spec: str | None = None, *, environ: dict[str, str] | None = None
) -> dict[str, str]:
    """The user's keymap: ~/.config/nnwatch/keys.json, then $NNWATCH_KEYS, then ``--keys``."""
    env = os.environ if environ is None else environ
    keymap: dict[str, str] = {}
    path = KEYS_FILE.expanduser()
    if path.is_file():
        try:
            data = json.loads(path.read_text())
        except ValueError as exc:
            raise ValueError(
                f'{path} is not valid JSON ({exc}); expected {{"snapshot": "S"}}'
            ) from exc
        if not isinstance(data, dict):
            raise ValueError(f"{path} must hold a JSON object of binding id -> key")
        keymap.update({str(k): str(v) for k, v in data.items()})
    if env.get(KEYS_ENV):
        keymap.update(parse_keymap(env[KEYS_ENV]))
    if cli_spec:
        keymap.update(parse_keymap(cli_spec))
    return keymap


class NNWatchApp(App[int]):
    """The live dashboard. ``run()`` returns 0 on ``q``."""

    CSS_PATH = "app.tcss"
    TITLE = "nnwatch"
    BINDINGS: ClassVar[list[Binding]] = [  # type: ignore[assignment]  # only Bindings here
        Binding("s", "request_snapshot", "snap", id="snapshot", tooltip="write a snapshot now"),
        Binding("p", "toggle_pause", "pause", id="pause", tooltip="pause or resume training (asks first)"),
        Binding("c", "set_clip", "clip", id="clip", tooltip="set the grad clip threshold (asks first)"),
        Binding("a", "arm_anomaly", "anom", id="anomaly", tooltip="anomaly detection for the next step"),
        Binding("l", "focus_layers", "layer", id="layers", tooltip="focus the layers pane: type to filter, Enter for the rows"),
        Binding("z", "toggle_zoom", "zoom", id="zoom", tooltip="charts: last 500 steps <-> whole run"),
        Binding("g", "toggle_log_scale", "log", id="log_scale", tooltip="log scale on every chart (loss, grad norm, snapshot inspector)"),
        Binding("e", "show_events", "event", id="events", tooltip="all events; Enter jumps to a step, d details, i inspects a snapshot"),
        Binding("i", "inspect_snapshot", "inspect", id="inspect", tooltip="the snapshot at or before the step cursor: its batch sample by sample"),
        Binding("r", "reconnect", "recon", id="reconnect", tooltip="reconnect to the run"),
        Binding("left_square_bracket", "prev_rank", "rank-", id="prev_rank", key_display="[", tooltip="distributed job: watch the previous rank"),
        Binding("right_square_bracket", "next_rank", "rank+", id="next_rank", key_display="]", tooltip="distributed job: watch the next rank"),
        Binding("question_mark", "show_help", "help", id="help", key_display="?", tooltip="this help"),
        Binding("q", "quit", "quit", id="quit", tooltip="quit the monitor (training goes on)"),
        Binding("left", "move_cursor(-1)", "step back", id="cursor_back", show=False, tooltip="step cursor back"),
        Binding("right", "move_cursor(1)", "step fwd", id="cursor_forward", show=False, tooltip="step cursor forward"),
        Binding("shift+left", "move_cursor(-10)", "back x10", id="cursor_back_fast", show=False, tooltip="step cursor back, 10x"),
        Binding("shift+right", "move_cursor(10)", "fwd x10", id="cursor_forward_fast", show=False, tooltip="step cursor forward, 10x"),
        Binding("home", "cursor_start", "first step", id="cursor_start", show=False, tooltip="cursor to the first step"),
        Binding("end", "cursor_follow", "follow", id="cursor_follow", show=False, tooltip="cursor off: follow the newest step"),
    ]  # fmt: skip

    def __init__(
        self,
        source: RunSource,
        *,
        fps: float = DEFAULT_FPS,
        hardware: HardwareOption = "auto",  # "psutil": no NVML; None: no sampling; or a reader
        hardware_interval: float = 1.0,
        keymap: dict[str, str] | None = None,
        theme: str | None = None,
        close_source: bool = True,
        gpu_uuids: list[str] | None = None,
        job: Job | None = None,  # the distributed job this run belongs to; found when not given
        ranks_interval: float = 1.0,
        decode: Callable[[list[int]], str] | None = None,  # token ids -> text, for the inspector
    ) -> None:
        super().__init__()
        if not fps or fps <= 0 or not math.isfinite(fps):
            raise ValueError(f"fps must be a positive number, not {fps!r}")
        self.source = source
        self.fps = float(fps)
        self.close_source = close_source
        self.state = RunState(source.meta)
        self.view = ViewSettings()
        self.ctx = PaneContext(self.state, self.view, source, gpu_uuids=gpu_uuids)
        self.collector = SourceCollector(source, self.state, self.post_message, 1.0 / self.fps)
        self.sampler: HardwareSampler | None = None
        if hardware is not None:
            reader = None if hardware in ("auto", "psutil") else hardware
            if reader is not None and not callable(reader):
                raise ValueError(
                    "hardware must be 'auto', 'psutil', None, or a callable returning a HardwareReading"
                )
            self.sampler = HardwareSampler(
                self.state,
                self.post_message,
                hardware_interval,
                reader,
                use_nvml=hardware != "psutil",
            )
        self.ranks: RankCollector | None = None
        run_dir = getattr(source, "run_dir", None)
        if source.meta.world_size > 1 and run_dir is not None:
            self.ranks = RankCollector(str(run_dir), self.post_message, ranks_interval, job=job)
        self.decode = decode
        self._keymap_requested = dict(keymap or {})
        self._theme_requested = theme
        self.outcomes: list[str] = []  # every command outcome shown, oldest first (for tests)
        self.loading = False  # a large history is still being read (see refresh_panes)
        self.title = f"nnwatch · {source.meta.name}"

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
        self.collector.start()
        if self.sampler is not None:
            self.sampler.start()
        if self.ranks is not None:
            self.ranks.start()
        self.set_interval(1.0 / self.fps, self.refresh_panes, name="nnwatch-redraw")

    def on_unmount(self) -> None:
        self._stop_collectors()

    def _stop_collectors(self) -> None:
        self.collector.stop()
        if self.sampler is not None:
            self.sampler.stop()
        if self.ranks is not None:
            self.ranks.stop()
        if self.close_source:
            try:
                self.source.close()
            except Exception:  # noqa: BLE001 - closing must never turn a clean quit into a crash
                pass

    def _on_theme_changed(self, _theme: object) -> None:
        self.ctx.palette = Palette.from_app(self)
        self.state.touch(*self.state.versions)
        self.refresh_panes()

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
        elif state == "live" and message.previous in ("lost", "hung", "paused"):
            self.notify("The run is live again.", title="live")
        if state != "paused" and self.view.outcome.startswith(("paused", "pause:")):
            self.view.outcome, self.view.outcome_error = "", False  # the pause it told of ended
            self.state.touch("header")
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
        self.notify(
            f"step {fmt.count(message.step)}: {message.path}{reason}", title="snapshot written"
        )

    def on_command_finished(self, message: CommandFinished) -> None:
        reply, name = message.reply, message.name
        args = dict(message.args)
        if reply.ok:
            text = _describe_outcome(name, args, reply.applies_at_step, reply.data)
            self._show_outcome(text, error=False)
        else:
            self._show_outcome(
                f"{name} failed: {reply.error or 'no answer from the run'}", error=True
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
        self.state.touch("header")
        self.refresh_panes()
        self.notify(text, severity="error" if error else "information", timeout=6)

    # -- bindings ----------------------------------------------------------------------------
    def check_action(self, action: str, parameters: tuple[object, ...]) -> bool | None:
        if action in STEERING and not self.source.can_command:
            return None
        if action in RANK_ACTIONS and self.ranks is None:
            return False  # a single process: no rank selector in the footer  # shown greyed out in the footer; pressing it explains why (on_key)
        return True

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
            self._show_outcome(f"{b.description}: {NOT_LIVE}", error=True)

    def _send(self, name: str, **args: Any) -> None:
        self.view.outcome = f"{name}: sent, waiting for the trainer…"
        self.view.outcome_error = False
        self.state.touch("header")
        self.refresh_panes()
        self.collector.command(name, args)

    def action_request_snapshot(self) -> None:
        self._send(CMD_SNAPSHOT, reason="key s in nnwatch")

    def action_toggle_pause(self) -> None:
        paused = self.state.status.state == "paused"
        verb = "Resume" if paused else "Pause"
        detail = (
            "Training continues from where it stopped."
            if paused
            else "The trainer stops at the next step boundary and waits; closing nnwatch resumes it."
        )

        def answer(yes: bool | None) -> None:
            if yes:
                self._send(CMD_RESUME if paused else CMD_PAUSE)
            else:
                self._show_outcome(f"{verb.lower()} cancelled", error=False)

        self.push_screen(
            ConfirmScreen(f"{verb} training of {self.source.meta.name}?", detail), answer
        )

    def action_set_clip(self) -> None:
        current = self.state.history.latest_finite("clip_threshold")

        def got_value(value: float | None) -> None:
            if value is None:
                self._show_outcome("clip unchanged", error=False)
                return

            def answer(yes: bool | None) -> None:
                if yes:
                    self._send(CMD_CLIP, max_norm=value)
                else:
                    self._show_outcome("clip unchanged", error=False)

            self.push_screen(
                ConfirmScreen(
                    f"Clip gradients of {self.source.meta.name} at max norm {value:g}?",
                    "It applies from the next optimizer step, and shows in the records.",
                ),
                answer,
            )

        self.push_screen(ClipScreen(current), got_value)

    def action_arm_anomaly(self) -> None:
        self._send(CMD_ANOMALY, steps=1)

    def action_focus_layers(self) -> None:
        self._dashboard().query_one(LayersPane).focus_filter()

    def action_toggle_zoom(self) -> None:
        self.view.zoomed = not self.view.zoomed
        self.state.touch("loss", "grad", "amp")
        self.refresh_panes()

    def action_toggle_log_scale(self) -> None:
        self.view.log_scale = not self.view.log_scale
        self.state.touch("loss", "grad")
        self.refresh_panes()

    def action_show_events(self) -> None:
        with self.state.lock:
            events_kept = list(self.state.events)
            total = self.state.events_total

        def jump(step: int | None) -> None:
            if step is not None:
                self._set_cursor(float(step))

        self.push_screen(
            EventsScreen(events_kept, self.ctx.palette, total, inspect=self.inspect_snapshot), jump
        )

    # -- the snapshot inspector --------------------------------------------------------------
    def snapshot_events(self) -> list[dict[str, Any]]:
        with self.state.lock:
            return [e for e in self.state.events if e.get("type") == "snapshot"]

    def snapshot_path(self, event: dict[str, Any]) -> Path | None:
        """Where a snapshot event's directory is on this machine (the run may have moved)."""
        path = Path(str(event.get("path") or ""))
        if event.get("path") and (path / "manifest.json").exists():
            return path
        run_dir = getattr(self.source, "run_dir", None)
        if run_dir is not None:
            name = path.name if event.get("path") else f"step-{event.get('step')}"
            moved = Path(run_dir) / "snapshots" / name
            if (moved / "manifest.json").exists():
                return moved
        return None

    def inspect_snapshot(self, event: dict[str, Any]) -> bool:
        """Open the inspector on a snapshot event; False (with a note) when it is not readable."""
        path = self.snapshot_path(event)
        if path is None:
            self.notify(
                f"The snapshot of step {fmt.count(event.get('step'))} is not on this machine "
                f"({event.get('path', 'no path')}); `nnwatch show` reads it where it is.",
                title="inspect",
                severity="warning",
            )
            return False
        self.push_screen(SnapshotScreen(path, self.ctx.palette, self.view, decode=self.decode))
        return True

    def action_inspect_snapshot(self) -> None:
        snaps = self.snapshot_events()
        if not snaps:
            self.notify(
                "No snapshot in this run yet. s takes one of the next step (live runs); one is "
                "also taken automatically on the first non-finite step.",
                title="inspect",
                severity="warning",
            )
            return
        cursor = self.view.cursor
        chosen = snaps[-1]
        if cursor is not None:
            before = [e for e in snaps if float(e.get("step", math.inf)) <= cursor]
            chosen = (
                max(before, key=lambda e: e["step"])
                if before
                else min(snaps, key=lambda e: abs(float(e.get("step", 0)) - cursor))
            )
        self.inspect_snapshot(chosen)

    def action_prev_rank(self) -> None:
        self._step_rank(-1)

    def action_next_rank(self) -> None:
        self._step_rank(1)

    def _step_rank(self, delta: int) -> None:
        job = self.ranks.job if self.ranks is not None else None
        if job is None or len(job.runs) < 2:
            where = (
                "the other ranks are not on this machine"
                if job
                else "still looking for the other ranks"
            )
            self.notify(f"No other rank to switch to: {where}.", title="rank", severity="warning")
            return
        ranks = job.ranks
        here = self.source.meta.rank
        i = ranks.index(here) if here in ranks else -1 if delta > 0 else 0
        self.switch_rank(ranks[(i + delta) % len(ranks)])

    def switch_rank(self, rank: int) -> bool:
        """Watch another rank of the job: a new live source, a fresh run state, the old source
        closed (in a thread, once its collector has stopped). False, with a note, if it cannot."""
        job = self.ranks.job if self.ranks is not None else None
        info = job.run_for(rank) if job is not None else None
        if job is None or info is None:
            self.notify(f"Rank {rank} is not on this machine.", title="rank", severity="warning")
            return False
        if rank == self.source.meta.rank:
            return True
        from nnwatch.sources.live import LiveSource

        try:
            source = LiveSource.from_info(info)
        except SourceError as exc:
            self.notify(f"Cannot open rank {rank}: {exc}", title="rank", severity="error")
            return False
        old_source, old_collector = self.source, self.collector
        close_old_source, self.close_source = self.close_source, True  # the new one is ours
        old_collector.stop()
        self.source = source
        self.state = RunState(source.meta)
        if self.sampler is not None:
            self.state.hardware = self.sampler.state.hardware
            self.sampler.state = self.state
        self.ctx.state, self.ctx.source = self.state, source
        self.view.cursor, self.view.outcome, self.view.outcome_error = None, "", False
        self.loading = False
        self.collector = SourceCollector(source, self.state, self.post_message, 1.0 / self.fps)
        self.collector.start()
        self.title = f"nnwatch · {source.meta.name} · rank {rank}"

        def close_old() -> None:
            old_collector.join(10.0)
            if not close_old_source:
                return  # the caller's source: closing it is the caller's business
            try:
                old_source.close()
            except Exception:  # noqa: BLE001 - a stale source must not disturb the new one
                pass

        threading.Thread(target=close_old, name="nnwatch-close-rank", daemon=True).start()
        for pane in self._dashboard().panes:
            pane.seen_version = -1  # the new state starts its versions at 0
        self.refresh_panes()
        self.refresh_bindings()
        self.notify(f"Watching rank {rank}/{job.world_size}.", title="rank", timeout=3)
        return True

    def action_reconnect(self) -> None:
        self.notify("Reconnecting…", title="reconnect", timeout=3)
        def done(ok: bool, msg: str) -> None:
            self.post_message(Reconnected(ok, msg))

        self.collector.reconnect(done)

    def action_show_help(self) -> None:
        def available(b: Binding) -> str:
            return "not live" if b.action in STEERING and not self.source.can_command else ""

        self.push_screen(HelpScreen(self.BINDINGS, self.key_of, available))

    async def action_quit(self) -> None:
        self._stop_collectors()
        self.exit(0)

    # step cursor: scrub through history (recorded runs, or back in a live one)
    def _set_cursor(self, step: float | None) -> None:
        first, last = self.state.step_bounds()
        if step is not None and math.isfinite(first):
            step = min(max(step, first), last)
            if step >= last and self.state.status.state in ("live", "paused"):
                step = None  # at the newest step of a live run: follow it
        self.view.cursor = step
        self.state.touch("header", "loss", "grad", "amp", "layers")
        self.refresh_panes()

    def action_move_cursor(self, columns: int) -> None:
        first, last = self.state.step_bounds()
        if not math.isfinite(first):
            return
        x0, x1 = self.state.window(self.view.zoomed, self.view.cursor)
        width = max(self._dashboard().query_one("#loss").size.width - 7, 10)
        per_col = max(1.0, math.ceil((x1 - x0 + 1) / width))
        here = last if self.view.cursor is None else self.view.cursor
        self._set_cursor(here + columns * per_col)

    def action_cursor_start(self) -> None:
        first, _ = self.state.step_bounds()
        if math.isfinite(first):
            self._set_cursor(first)

    def action_cursor_follow(self) -> None:
        self.view.cursor = None
        self.state.touch("header", "loss", "grad", "amp", "layers")
        self.refresh_panes()


def _describe_outcome(
    name: str, args: dict[str, Any], step: int | None, data: dict[str, Any]
) -> str:
    at = f" at step {fmt.count(step)}" if step is not None else ""
    if name == CMD_CLIP:
        return f"clip {args.get('max_norm'):g} applies{at or ' at the next step'}"
    if name == CMD_SNAPSHOT:
        path = data.get("path")
        return f"snapshot{at}" + (f": {path}" if path else " requested")
    if name == CMD_PAUSE:
        return f"paused{at}"
    if name == CMD_RESUME:
        return f"resumed{at}"
    if name == CMD_ANOMALY:
        return f"anomaly mode armed for the next step{at and ' (' + at.strip() + ')'}"
    return f"{name} applied{at}"
