"""A monitor-side thread that hits an unexpected error says so on screen, with the error's words.

The readers run in daemon threads (``nnwatch.tui.collectors``). An exception there used to end
the thread without a word: the dashboard then sat on CONNECTING (or on its last picture) for
ever. These sources and hardware readers really raise, the way a reader bug does; the dashboard
must show "reader failed: IndexError: ..." in its header, notify, keep answering keys, and clear
the failure once the thread does a clean round again.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

import numpy as np
from textual.geometry import Region
from textual.pilot import Pilot

from nnwatch.sources.base import SourceUpdate
from nnwatch.sources.hardware import HardwareReading
from nnwatch.testing.fixture import FixtureSource
from nnwatch.testing.tui import fixed_hardware, settle, wait_until
from nnwatch.tui.app import NNWatchApp
from nnwatch.tui.widgets.base import Pane
from nnwatch.tui.widgets.gpu import GpuPane
from nnwatch.tui.widgets.header import RunHeader
from nnwatch.tui.widgets.loss import LossPane

Body = Callable[[Pilot[Any], NNWatchApp], Awaitable[None]]
ERROR = "index 0 is out of bounds for axis 1 with size 0"


class _RowsThatRaise(np.ndarray):
    """Scalar rows whose columns cannot be read: what a 0-column ``lr`` did to the old reader."""

    def __getitem__(self, key: Any) -> Any:
        raise IndexError(ERROR)


class _UnreadableSource(FixtureSource):
    """A source whose first ``bad_polls`` polls deliver rows that raise when read."""

    def __init__(self, bad_polls: int, **kw: Any) -> None:
        super().__init__(**kw)
        self.bad_polls = bad_polls

    def poll(self) -> SourceUpdate:
        update = super().poll()
        if self._polls <= self.bad_polls:
            rows = update.scalars.view(_RowsThatRaise)
            return SourceUpdate(rows, update.layers, update.events, update.status)
        return update


def drive(app: NNWatchApp, body: Body, size: tuple[int, int] = (160, 48)) -> None:
    async def main() -> None:
        async with app.run_test(size=size) as pilot:
            await body(pilot, app)

    asyncio.run(main())


def shown(pane: Pane) -> str:
    """The pane as the terminal draws it: border, title and content."""
    lines = pane.render_lines(Region(0, 0, pane.region.width, pane.region.height))
    return "\n".join(strip.text for strip in lines)


def test_a_reader_that_raises_is_shown_on_screen_instead_of_connecting() -> None:
    src = _UnreadableSource(10**9, steps=None, steps_per_poll=50)  # every poll: a broken read
    app = NNWatchApp(src, hardware=fixed_hardware, fps=10)

    async def body(pilot: Pilot[Any], app: NNWatchApp) -> None:
        await wait_until(pilot, lambda: app.collector.failures >= 2, timeout=20)
        await pilot.pause(0.2)
        header = shown(app.query_one(RunHeader))
        assert f"reader failed: IndexError: {ERROR}" in header
        assert "READER FAILED" in header and "CONNECTING" not in header
        notes = [n.message for n in app._notifications]
        assert any(f"IndexError: {ERROR}" in m for m in notes)
        assert app.collector._thread.is_alive()  # it keeps trying, it did not die
        await pilot.press("z")  # and the dashboard still answers
        assert app.ctx.zoomed

    drive(app, body)


def test_a_narrow_header_keeps_the_badge_and_the_start_of_the_error() -> None:
    src = _UnreadableSource(10**9, steps=None, steps_per_poll=50)
    app = NNWatchApp(src, hardware=fixed_hardware, fps=10)

    async def body(pilot: Pilot[Any], app: NNWatchApp) -> None:
        await wait_until(pilot, lambda: app.collector.failures >= 1, timeout=20)
        await pilot.pause(0.2)
        header = shown(app.query_one(RunHeader))
        assert "reader failed: IndexError" in header
        assert "READER FAILED" in header

    drive(app, body, size=(80, 24))


def test_the_failure_clears_once_the_reader_reads_again() -> None:
    src = _UnreadableSource(2, steps=None, steps_per_poll=50)  # two broken polls, then fine
    app = NNWatchApp(src, hardware=fixed_hardware, fps=20)
    app.collector.retry_interval = 0.2

    async def body(pilot: Pilot[Any], app: NNWatchApp) -> None:
        await wait_until(pilot, lambda: app.collector.failures >= 1, timeout=20)
        await wait_until(pilot, lambda: app.state.history.rows >= 100, timeout=20)
        await wait_until(pilot, lambda: not app.state.reader_errors, timeout=20)
        await settle(pilot, app)
        header = shown(app.query_one(RunHeader))
        assert "reader failed" not in header and "LIVE" in header
        assert "Loss" in shown(app.query_one(LossPane))

    drive(app, body)


def test_a_hardware_reader_that_raises_is_shown_and_the_run_still_draws() -> None:
    calls = {"n": 0}

    def broken_reader() -> HardwareReading:
        calls["n"] += 1
        raise PermissionError("/proc/stat: permission denied")

    app = NNWatchApp(FixtureSource(300), hardware=broken_reader, hardware_interval=0.1, fps=10)

    async def body(pilot: Pilot[Any], app: NNWatchApp) -> None:
        await settle(pilot, app, 300)
        await wait_until(pilot, lambda: bool(app.state.reader_errors), timeout=20)
        await wait_until(pilot, lambda: calls["n"] >= 3, timeout=20)  # still retrying
        app.redraw_everything()
        await pilot.pause(0.1)
        header = shown(app.query_one(RunHeader))
        assert "hardware reader failed: PermissionError: /proc/stat" in header
        assert "FINISHED" in header  # the run is fine: only the hardware sampling broke
        assert "Loss" in shown(app.query_one(LossPane))
        assert app.query_one(GpuPane).draw_error == ""

    drive(app, body)


def test_the_hardware_reading_comes_back_after_a_failure() -> None:
    calls = {"n": 0}

    def flaky_reader() -> HardwareReading:
        calls["n"] += 1
        if calls["n"] <= 2:
            raise OSError("NVML: driver not loaded yet")
        return fixed_hardware()

    app = NNWatchApp(FixtureSource(300), hardware=flaky_reader, hardware_interval=0.1, fps=10)
    assert app.sampler is not None
    app.sampler.retry_interval = 0.1

    async def body(pilot: Pilot[Any], app: NNWatchApp) -> None:
        await settle(pilot, app, 300)
        await wait_until(pilot, lambda: app.state.hardware is not None, timeout=20)
        await wait_until(pilot, lambda: not app.state.reader_errors, timeout=20)
        await pilot.pause(0.2)
        assert "hardware reader failed" not in shown(app.query_one(RunHeader))
        assert "23%" in shown(app.query_one(GpuPane))

    drive(app, body)
