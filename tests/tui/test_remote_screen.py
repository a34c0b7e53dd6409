"""What the dashboard says about a remote run that is catching up, reconnects and repeats itself
(Pilot). The source is scripted: it hands the app exactly what a resumed stream delivers."""

from __future__ import annotations

import asyncio
from typing import Any

import numpy as np

from nnwatch.sources.base import RunSource, SourceStatus, SourceUpdate
from nnwatch.store.schema import RunMeta
from nnwatch.testing.synthetic import make_meta
from nnwatch.testing.tui import fixed_hardware, wait_until
from nnwatch.tui.app import NNWatchApp
from nnwatch.tui.widgets.header import RunHeader

EVENT = {"type": "command", "name": "pause", "args": {}, "step": 50}


class ScriptedSource(RunSource):
    """Plays a list of (rows, events, status) polls, then repeats the last status with no data."""

    def __init__(
        self, script: list[tuple[range, list[dict[str, Any]], SourceStatus]], hold_after: int = 0
    ) -> None:
        self._meta = make_meta("far", 2)
        self.script = list(script)
        self.last = script[-1][2]
        #: after this many polls, repeat the latest status with no data until ``held`` is cleared
        self.hold_after = hold_after
        self.held = hold_after > 0
        self.polls = 0
        self.now = script[0][2]

    @property
    def meta(self) -> RunMeta:
        return self._meta

    def poll(self) -> SourceUpdate:
        schema = self._meta.schema
        self.polls += 1
        if self.held and self.polls > self.hold_after:
            steps, events, status = range(0), [], self.now
        else:
            steps, events, status = self.script.pop(0) if self.script else (range(0), [], self.last)
        self.now = status
        rows = np.zeros(len(steps), schema.scalar_dtype())
        rows["step"] = np.asarray(steps, np.float64)
        return SourceUpdate(rows, np.zeros(0, schema.layer_row_dtype()), list(events), status)


def header(app: NNWatchApp) -> str:
    return app.query_one(RunHeader)._picture.plain


def test_catching_up_is_shown_and_ends_in_live() -> None:
    # the source holds the catching-up status until the test has seen it: on a loaded machine
    # the app could otherwise take in every poll before the test's first look
    source = ScriptedSource([
        (range(0, 1000), [], SourceStatus("live", catching_up=(999, 283_000))),
        (range(1000, 1001), [], SourceStatus("live", catching_up=(1000, 283_000))),
        (range(1001, 1002), [], SourceStatus("live")),
    ], hold_after=2)  # fmt: skip
    app = NNWatchApp(source, hardware=fixed_hardware, fps=20)
    seen: list[str] = []

    async def main() -> None:
        async with app.run_test(size=(160, 48)) as pilot:
            await wait_until(pilot, lambda: "catching up" in header(app))
            seen.append(header(app))
            source.held = False
            await wait_until(pilot, lambda: "LIVE" in header(app))
            seen.append(header(app))

    asyncio.run(main())
    assert "catching up: 1,000 of 283,000" in seen[0] or "catching up: 999 of 283,000" in seen[0]
    assert "CATCHING UP" in seen[0] and "LIVE" not in seen[0]
    assert "catching up" not in seen[1]


def test_events_repeated_by_a_reconnect_are_listed_once_and_a_pause_label_clears() -> None:
    source = ScriptedSource([
        (range(0, 100), [EVENT], SourceStatus("paused")),
        (range(100, 101), [], SourceStatus("lost", message="the tunnel is gone")),
        (range(101, 120), [EVENT], SourceStatus("live")),  # a resumed stream sends it again
    ], hold_after=1)  # fmt: skip
    app = NNWatchApp(source, hardware=fixed_hardware, fps=20)

    async def main() -> None:
        async with app.run_test(size=(160, 48)) as pilot:
            await wait_until(pilot, lambda: app.state.history.rows >= 100)
            app.show_outcome("paused at step 50", error=False)  # while the run is paused
            source.held = False
            await wait_until(pilot, lambda: app.state.history.last_step >= 119)
            await wait_until(pilot, lambda: "LIVE" in header(app))
            assert "paused at step" not in header(app)
            assert [e for e in app.state.events if e.get("name") == "pause"] == [EVENT]

    asyncio.run(main())
