"""The snapshot inspector, driven with real keys on real snapshots from small real training runs
(tests/fixtures/snapshot_runs.py): an image batch (digits), a token batch (a tiny LM, dict
batches) and a table batch (a classifier with a wrong head size). Each test opens the run as
``nnwatch open`` does, reaches the inspector the way a user would, and reads the screen."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

from nnwatch.sources.recorded import RecordedSource
from nnwatch.testing.tui import fixed_hardware, settle, wait_until
from nnwatch.tui.app import NNWatchApp
from nnwatch.tui.screens.events import EventDetailScreen, EventsScreen
from nnwatch.tui.screens.snapshot import SnapshotScreen
from nnwatch.tui.widgets.grad_before import GradBeforeChart
from nnwatch.tui.widgets.sample_view import SampleDetail
from tests.fixtures import snapshot_runs

pytestmark = pytest.mark.timeout(120)


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("runs")
    mp = pytest.MonkeyPatch()
    mp.setenv("NNWATCH_RUN_DIR", str(root))
    try:
        return {
            "image": snapshot_runs.image_run(root / "image").parent.parent,
            "tokens": snapshot_runs.token_run(root / "tokens").parent.parent,
            "table": snapshot_runs.table_run(root / "table").parent.parent,
        }
    finally:
        mp.undo()


def drive(app: NNWatchApp, size: tuple[int, int], body: Any) -> None:
    async def main() -> None:
        async with app.run_test(size=size) as pilot:
            await settle(pilot, app)
            await body(pilot)

    asyncio.run(main())


async def inspector(pilot: Any, app: NNWatchApp) -> SnapshotScreen:
    await wait_until(pilot, lambda: isinstance(app.screen, SnapshotScreen))
    screen = app.screen
    assert isinstance(screen, SnapshotScreen)
    await wait_until(pilot, lambda: screen.report is not None or bool(screen.error), 60)
    assert not screen.error, screen.error
    await pilot.pause()
    return screen


def detail_text(screen: SnapshotScreen) -> str:
    d = screen.query_one(SampleDetail)
    return d.head_text + "\n" + d.body_text.plain


def test_events_i_on_a_snapshot_opens_the_image_batch(runs: dict[str, Path]) -> None:
    app = NNWatchApp(RecordedSource(runs["image"]), hardware=fixed_hardware, fps=10)

    async def body(pilot: Any) -> None:
        await pilot.press("e")
        events = app.screen
        assert isinstance(events, EventsScreen)
        row = next(k for k, ev in enumerate(events.events) if ev.get("type") == "snapshot")
        await pilot.press(*["down"] * row, "i")
        screen = await inspector(pilot, app)
        assert screen.report is not None and screen.report.kind == "image"
        assert screen.query_one("#samples").row_count == 32
        # the cursor starts on the first flagged sample: #3, the all-zero image
        assert screen.selected == 3
        text = detail_text(screen)
        assert "all-zero input" in text and "label 3" in text
        assert "▀" in text  # drawn in the terminal (half blocks without a graphics protocol)
        await pilot.press("down")
        assert screen.selected == 4
        assert "same input as #5, different label (4 vs 5)" in detail_text(screen)
        chart = screen.query_one(GradBeforeChart)
        assert "before step 8" in str(chart.border_title)
        assert len(screen.report.grad_steps) == 9  # steps 0..8 from the run log
        assert any("\u2800" < ch <= "\u28ff" for ch in str(chart.render()))  # braille: a curve
        await pilot.press("escape")
        assert isinstance(app.screen, EventsScreen)

    drive(app, (80, 24), body)


def test_i_at_the_step_cursor_opens_the_token_batch_decoded(runs: dict[str, Path]) -> None:
    app = NNWatchApp(
        RecordedSource(runs["tokens"]), hardware=fixed_hardware, fps=10, decode=snapshot_runs.decode
    )

    async def body(pilot: Any) -> None:
        await pilot.press("home", "right", "right")  # the cursor on an early step
        await pilot.press("end")
        app.navigation.set_cursor(10.0)  # after the snapshot of step 8: `i` takes the one at or before
        await pilot.press("i")
        screen = await inspector(pilot, app)
        assert screen.report is not None
        assert screen.report.step == 8 and screen.report.kind == "tokens"
        assert screen.selected == 2
        text = detail_text(screen)
        assert "empty sequence" in text and "no target tokens" in text
        await pilot.press("down")
        s3 = screen.report.samples[3]
        expected = snapshot_runs.decode([int(v) for v in s3.inputs])
        assert repr(expected) in detail_text(screen)  # decoded with the given decoder
        assert "(6 of 6 in the mask)" in detail_text(screen)

    drive(app, (80, 24), body)


def test_table_batch_z_scores_flags_and_flagged_only(runs: dict[str, Path]) -> None:
    app = NNWatchApp(RecordedSource(runs["table"]), hardware=fixed_hardware, fps=10)

    async def body(pilot: Any) -> None:
        await pilot.press("i")  # no cursor: the newest snapshot
        screen = await inspector(pilot, app)
        report = screen.report
        assert report is not None and report.kind == "table" and report.num_classes == 3
        assert [s.index for s in report.flagged] == [7, 9]
        text = detail_text(screen)
        assert screen.selected == 7
        assert "target out of range (3 not in 0..2)" in text
        assert "extreme value" in text and "+3.7" in text  # the z-score against the batch
        await pilot.press("f")
        assert screen.query_one("#samples").row_count == 2
        await pilot.press("down")
        assert screen.selected == 9
        assert "non-finite input (1 of 6" in detail_text(screen)
        assert "nan" in screen.query_one(SampleDetail).body_text.plain
        # the snapshot's own step was non-finite: marked on the chart; g switches to log
        chart = screen.query_one(GradBeforeChart)
        assert "✕" in str(chart.render())
        assert "linear" in str(chart.border_subtitle)
        await pilot.press("g")
        assert app.ctx.log_scale and "log" in str(chart.border_subtitle)

    drive(app, (200, 60), body)


def test_event_detail_shows_the_whole_message_and_evidence(runs: dict[str, Path]) -> None:
    app = NNWatchApp(RecordedSource(runs["table"]), hardware=fixed_hardware, fps=10)

    async def body(pilot: Any) -> None:
        await pilot.press("e")
        events = app.screen
        assert isinstance(events, EventsScreen)
        row = next(k for k, ev in enumerate(events.events) if ev.get("kind") == "nan_or_inf")
        ev = events.events[row]
        await pilot.press(*["down"] * row)
        table = events.query_one("#events-table")
        assert table.ordered_rows[row].height > 1  # the long message wraps instead of being cut
        await pilot.press("d")
        assert isinstance(app.screen, EventDetailScreen)
        shown = str(app.screen.query_one("#event-full").render())
        assert str(ev["remedy"]) in shown.replace("\n", " ") or ev["remedy"][:60] in shown
        assert "evidence" in shown and "nonfinite_grad_layers" in shown
        await pilot.press("enter")  # go to the step
        await pilot.pause()
        assert app.ctx.cursor == ev["step"]

    drive(app, (80, 24), body)
