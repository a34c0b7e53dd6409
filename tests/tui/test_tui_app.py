"""The dashboard driven through Textual's Pilot: every key binding, layouts, failures, themes.

These use the deterministic fixture run or a run log written from it; the bindings that steer a
real trainer are tested against a real training subprocess in ``test_tui_live.py``.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

import numpy as np
import pytest
from textual.pilot import Pilot

from nnwatch.sources.base import RunSource, SourceStatus, SourceUpdate
from nnwatch.sources.recorded import RecordedSource
from nnwatch.testing.fixture import DYING_LAYER, FixtureSource, write_run
from nnwatch.testing.tui import fixed_hardware, settle, wait_until
from nnwatch.tui.app import STEERING, NNWatchApp, parse_keymap
from nnwatch.tui.format import nbytes
from nnwatch.tui.screens.dialogs import ClipScreen, ConfirmScreen
from nnwatch.tui.screens.events import EventsScreen
from nnwatch.tui.screens.help import HelpScreen
from nnwatch.tui.widgets.amp import AmpPane
from nnwatch.tui.widgets.events import EventsPane
from nnwatch.tui.widgets.gpu import GpuPane
from nnwatch.tui.widgets.header import RunHeader
from nnwatch.tui.widgets.layers import LayersPane, LayerTable
from nnwatch.tui.widgets.loss import LossPane

Body = Callable[[Pilot[Any], NNWatchApp], Awaitable[None]]


def drive(app: NNWatchApp, body: Body, size: tuple[int, int] = (160, 48)) -> None:
    async def main() -> None:
        async with app.run_test(size=size) as pilot:
            await body(pilot, app)

    asyncio.run(main())


def make_app(source: RunSource | None = None, **kw: Any) -> NNWatchApp:
    kw.setdefault("hardware", fixed_hardware)
    kw.setdefault("fps", 10)
    return NNWatchApp(source or FixtureSource(3000), **kw)


def text_of(widget: Any) -> str:
    return widget._picture.plain


def test_q_quits_cleanly_returns_0_and_closes_the_source() -> None:
    src = FixtureSource(3000)
    app = make_app(src)

    async def body(pilot: Pilot[Any], app: NNWatchApp) -> None:
        await settle(pilot, app, 3000)
        await pilot.press("q")
        await pilot.pause()

    drive(app, body)
    assert app.return_value == 0
    assert app.collector.stopped
    with pytest.raises(Exception, match="closed"):
        src.poll()


def test_z_zooms_between_the_last_500_steps_and_the_whole_run() -> None:
    async def body(pilot: Pilot[Any], app: NNWatchApp) -> None:
        await settle(pilot, app, 3000)
        loss = app.query_one(LossPane)
        assert app.state.window(app.ctx.zoomed, None) == (0, 2999)
        assert "whole run" in str(loss.border_subtitle)
        await pilot.press("z")
        assert app.ctx.zoomed
        assert app.state.window(True, None) == (2500, 2999)
        assert "last 500" in str(loss.border_subtitle)
        assert "2,500" in text_of(loss)  # the x axis starts at the window
        await pilot.press("z")
        assert not app.ctx.zoomed and "whole run" in str(loss.border_subtitle)

    drive(make_app(), body)


def test_g_toggles_the_log_scale_of_the_loss() -> None:
    async def body(pilot: Pilot[Any], app: NNWatchApp) -> None:
        await settle(pilot, app, 3000)
        loss = app.query_one(LossPane)
        linear = text_of(loss)
        await pilot.press("g")
        assert app.ctx.log_scale and "log" in str(loss.border_subtitle)
        assert text_of(loss) != linear
        await pilot.press("g")
        assert text_of(loss) == linear

    drive(make_app(), body)


def test_l_focuses_the_layers_and_slash_filters_them() -> None:
    async def body(pilot: Pilot[Any], app: NNWatchApp) -> None:
        await settle(pilot, app, 3000)
        layers = app.query_one(LayersPane)
        assert len(layers.shown_rows) == 12
        await pilot.press("l")
        assert app.focused is not None and app.focused.id == "layer-filter"
        await pilot.press(*"relu")  # by kind, case-insensitively
        await wait_until(pilot, lambda: len(layers.shown_rows) == 3)
        assert all(name.endswith(".act") for name in layers.shown_rows)
        assert "3 shown" in str(layers.border_subtitle)
        assert app.screen is app.dashboard  # its "e" and "r" went to the filter, not to the keys
        await pilot.press("enter")
        table = app.query_one(LayerTable)
        assert app.focused is table
        await pilot.press("down", "down")
        assert table.cursor_row == 2
        await pilot.press("slash")
        assert app.focused is not None and app.focused.id == "layer-filter"
        await pilot.press(*["backspace"] * 4, "escape")
        assert app.focused is None  # dashboard keys work again
        assert len(layers.shown_rows) == 12
        await pilot.press("z")
        assert app.ctx.zoomed

    drive(make_app(), body)


def test_dying_layer_is_red_and_kept_in_view() -> None:
    async def body(pilot: Pilot[Any], app: NNWatchApp) -> None:
        await settle(pilot, app, 3000)
        table = app.query_one(LayerTable)
        row = table.row_texts(DYING_LAYER)
        dead_cell = row[3]
        assert "97%" in dead_cell.plain
        assert any(
            span.style.color.triplet == app.ctx.palette.error.color.triplet
            for span in dead_cell.spans
        )
        assert ">80% dead" in str(app.query_one(LayersPane).border_title)
        # at 80x24 only a few rows fit: the unattended table scrolls to the dying layer
        assert table.cursor_row == list(app.query_one(LayersPane).shown_rows).index(DYING_LAYER)

    drive(make_app(), body, size=(80, 24))


def test_e_lists_events_and_enter_jumps_to_the_step() -> None:
    src = FixtureSource(3000)
    newest = max(src.events(), key=lambda e: e["step"])

    async def body(pilot: Pilot[Any], app: NNWatchApp) -> None:
        await settle(pilot, app, 3000)
        events = text_of(app.query_one(EventsPane))
        assert "ERROR" in events and "LeakyReLU" in events  # severity, and the remedy
        await pilot.press("e")
        assert isinstance(app.screen, EventsScreen)
        assert app.screen.query_one("#events-table").row_count == len(src.events())
        await pilot.press("enter")
        await pilot.pause()
        assert not isinstance(app.screen, EventsScreen)
        assert app.ctx.cursor == newest["step"]
        assert f"cursor {newest['step']:,}" in text_of(app.query_one(RunHeader))
        await pilot.press("e")
        await pilot.press("escape")
        assert not isinstance(app.screen, EventsScreen)

    drive(make_app(src), body)


def test_question_mark_shows_every_binding_with_its_id_and_current_key() -> None:
    async def body(pilot: Pilot[Any], app: NNWatchApp) -> None:
        await settle(pilot, app)
        await pilot.press("question_mark")
        assert isinstance(app.screen, HelpScreen)
        table = app.screen.query_one("#help-table")
        rows = [table.get_row_at(i) for i in range(table.row_count)]
        ids = {r[1] for r in rows}
        assert {b.id for b in app.BINDINGS} <= ids
        keys = {r[1]: str(r[0]) for r in rows}
        assert keys["snapshot"] == "S"  # remapped
        assert keys["zoom"] == "z"
        notes = {r[1]: str(r[3]) for r in rows}
        assert "not live" in notes["pause"]  # a fixture cannot be steered
        await pilot.press("escape")
        assert not isinstance(app.screen, HelpScreen)

    drive(make_app(keymap={"snapshot": "S"}), body)


def test_keys_can_be_remapped_by_binding_id() -> None:
    async def body(pilot: Pilot[Any], app: NNWatchApp) -> None:
        await settle(pilot, app, 3000)
        await pilot.press("z")
        assert not app.ctx.zoomed  # z no longer zooms
        await pilot.press("Z")
        assert app.ctx.zoomed

    drive(make_app(keymap={"zoom": "Z"}), body)
    assert parse_keymap(" zoom=Z , quit=ctrl+q ") == {"zoom": "Z", "quit": "ctrl+q"}
    with pytest.raises(ValueError, match="id=key"):
        parse_keymap("zoomZ")


def test_steering_keys_are_greyed_and_explained_when_the_run_is_not_live() -> None:
    async def body(pilot: Pilot[Any], app: NNWatchApp) -> None:
        await settle(pilot, app, 3000)
        active = app.screen.active_bindings
        for key in ("s", "p", "c", "a"):
            _node, binding, enabled, _tip = active[key]
            assert binding.action in STEERING and not enabled  # greyed out in the footer
        for key in ("s", "p", "c", "a"):
            await pilot.press(key)
            await pilot.pause()
            assert not isinstance(app.screen, ConfirmScreen | ClipScreen)
        assert len(app.outcomes) == 4
        assert all("not live" in o for o in app.outcomes)
        assert "not live" in text_of(app.query_one(RunHeader))

    drive(make_app(), body)


class _FlakySource(FixtureSource):
    """Raises an unexpected exception (not a SourceError) on some polls: a buggy source."""

    def __init__(self, bad_polls: set[int], **kw: Any) -> None:
        super().__init__(**kw)
        self.bad_polls = bad_polls
        self.reconnects = 0

    def poll(self) -> SourceUpdate:
        if self._polls + 1 in self.bad_polls:
            self._polls += 1
            raise RuntimeError("the disk went away")
        return super().poll()

    def reconnect(self) -> None:
        self.reconnects += 1


def test_a_failing_source_shows_lost_keeps_history_and_r_reconnects() -> None:
    src = _FlakySource({3, 4, 5, 6, 7, 8, 9, 10}, steps=None, steps_per_poll=100)

    async def body(pilot: Pilot[Any], app: NNWatchApp) -> None:
        await wait_until(pilot, lambda: app.state.status.state == "lost")
        rows = app.state.history.rows
        assert rows == 200  # two good polls, kept
        await settle(pilot, app)
        header = text_of(app.query_one(RunHeader))
        assert "LOST" in header and "the disk went away" in header
        await pilot.press("z")  # still responsive
        assert app.ctx.zoomed
        await pilot.press("r")
        await wait_until(pilot, lambda: src.reconnects == 1)
        await wait_until(pilot, lambda: app.state.status.state == "live", timeout=30)
        assert app.state.history.rows > rows

    drive(make_app(src, fps=20), body)


@pytest.mark.parametrize(
    ("end", "badge", "note"),
    [
        ("lost", "LOST", "pid 4242 is gone"),
        ("hung", "HUNG", "no heartbeat"),
        ("crashed", "CRASHED", ""),
    ],
)
def test_a_run_that_dies_or_hangs_changes_the_badge_and_keeps_the_history(
    end: str, badge: str, note: str
) -> None:
    src = FixtureSource(300, steps_per_poll=100, end_state=end)

    async def body(pilot: Pilot[Any], app: NNWatchApp) -> None:
        await wait_until(pilot, lambda: app.state.status.state == end)
        await settle(pilot, app, 300)
        header = text_of(app.query_one(RunHeader))
        assert badge in header and "step 299" in header
        assert note in header
        await pilot.pause(0.5)
        assert app.state.history.rows == 300  # nothing lost, nothing invented
        await pilot.press("z")  # and the monitor still answers
        assert app.ctx.zoomed

    drive(make_app(src), body)


def test_only_panes_whose_data_changed_are_redrawn() -> None:
    src = FixtureSource(None, steps_per_poll=50, amp=False, cuda=False)

    async def body(pilot: Pilot[Any], app: NNWatchApp) -> None:
        await settle(pilot, app)
        amp, loss = app.query_one(AmpPane), app.query_one(LossPane)
        amp_before, loss_before = amp.redraws, loss.redraws
        polls = app.collector.polls
        await wait_until(pilot, lambda: app.collector.polls >= polls + 8)
        await pilot.pause(0.3)
        assert loss.redraws >= loss_before + 3  # new steps: redrawn
        assert amp.redraws == amp_before  # no scaler: never redrawn
        assert "no GradScaler" in text_of(amp)

    drive(make_app(src, hardware=None), body)


def test_scrubbing_a_recorded_run_with_the_step_cursor(tmp_path) -> None:
    run_dir = write_run(FixtureSource(3000), tmp_path / "run")

    async def body(pilot: Pilot[Any], app: NNWatchApp) -> None:
        await settle(pilot, app, 3000)
        layers = app.query_one(LayersPane)
        assert "@ step 2,990" in str(layers.border_title)
        await pilot.press("home")
        assert app.ctx.cursor == 0
        assert "@ step 0" in str(layers.border_title)
        zero_dead = app.query_one(LayerTable).row_texts(DYING_LAYER)[3].plain
        for _ in range(5):
            await pilot.press("shift+right")
        at = app.ctx.cursor
        assert at is not None and at > 0
        await pilot.press("left")
        assert app.ctx.cursor is not None and app.ctx.cursor < at
        await pilot.press("z")  # zoom follows the cursor, reading exact rows from the log
        x0, x1 = app.state.window(True, app.ctx.cursor)
        assert x0 <= app.ctx.cursor <= x1 and x1 - x0 == 499
        await pilot.press("end")
        assert app.ctx.cursor is None
        assert app.query_one(LayerTable).row_texts(DYING_LAYER)[3].plain != zero_dead

    drive(make_app(RecordedSource(run_dir)), body)


def test_narrow_layout_takes_over_below_110_columns() -> None:
    async def narrow(pilot: Pilot[Any], app: NNWatchApp) -> None:
        await settle(pilot, app, 3000)
        assert app.screen.has_class("narrow")
        header = app.query_one(RunHeader)
        assert header.size.height == 2
        for pane in app.screen.panes:
            if pane.id == "updates":
                assert not pane.display  # it shares the layers' place: shown by u
                continue
            assert pane.size.width > 0 and pane.size.height > 0, pane.id

    async def wide(pilot: Pilot[Any], app: NNWatchApp) -> None:
        await settle(pilot, app, 3000)
        assert not app.screen.has_class("narrow")
        await pilot.resize_terminal(80, 24)
        await pilot.pause()
        assert app.screen.has_class("narrow")

    drive(make_app(), narrow, size=(80, 24))
    drive(make_app(), wide, size=(250, 70))


def test_gpu_pane_says_plainly_when_nvml_is_unavailable() -> None:
    import pynvml

    try:
        pynvml.nvmlInit()
        pytest.skip("a driver is present here")
    except pynvml.NVMLError:
        pass

    async def body(pilot: Pilot[Any], app: NNWatchApp) -> None:
        await wait_until(pilot, lambda: app.state.hardware is not None)
        await settle(pilot, app)
        text = text_of(app.query_one(GpuPane))
        assert "NVML unavailable: no NVIDIA driver" in text
        assert "CPU" in text and "RAM" in text  # psutil still speaks
        last = FixtureSource(3000).scalar_rows(2999, 3000)[0]
        assert (
            f"alloc {nbytes(last['cuda_allocated'])}" in text
        )  # the run's torch memory, from its records

    drive(make_app(hardware="auto"), body)


def test_no_color_and_themes(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("NO_COLOR", "1")
    assert make_app().no_color
    monkeypatch.delenv("NO_COLOR")

    async def body(pilot: Pilot[Any], app: NNWatchApp) -> None:
        await settle(pilot, app, 3000)
        loss = app.query_one(LossPane)
        before, error_before = loss.redraws, app.ctx.palette.error
        app.theme = "nord"
        await wait_until(pilot, lambda: loss.redraws > before)
        assert app.ctx.palette.error != error_before

    drive(make_app(), body)


def test_bad_options_are_refused_in_words() -> None:
    with pytest.raises(ValueError, match="fps"):
        make_app(fps=0)
    with pytest.raises(ValueError, match="hardware"):
        make_app(hardware="gpu please")


class _EmptySource(RunSource):
    """A run that has not stepped yet: every pane must still draw."""

    def __init__(self) -> None:
        self._meta = FixtureSource(1).meta

    @property
    def meta(self) -> Any:
        return self._meta

    def poll(self) -> SourceUpdate:
        schema = self._meta.schema
        return SourceUpdate(
            np.zeros(0, schema.scalar_dtype()),
            np.zeros(0, schema.layer_row_dtype()),
            [],
            SourceStatus("live"),
        )


def test_a_run_without_records_yet_draws_every_pane() -> None:
    async def body(pilot: Pilot[Any], app: NNWatchApp) -> None:
        await settle(pilot, app)
        assert "no data yet" in text_of(app.query_one(LossPane))
        assert "LIVE" in text_of(app.query_one(RunHeader))
        await pilot.press("z", "g", "home", "right", "end")
        assert app.query_one(LayersPane).shown_rows  # names, with "–" values

    drive(make_app(_EmptySource()), body, size=(80, 24))
