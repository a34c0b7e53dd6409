"""The updates pane (``u``): each layer's update/weight ratio at the last measured update, on the
real app under Pilot, over real run logs: the fixture's (healthy, rounded away, schema 3) and
small real training runs (Adam, bf16 with a tiny LR, SGD with weight_decay=5)."""

from __future__ import annotations

import asyncio
import math
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest
from textual.pilot import Pilot

from nnwatch.sources.recorded import RecordedSource
from nnwatch.testing.fixture import FixtureSource, write_run
from nnwatch.testing.tui import fixed_hardware, settle
from nnwatch.tui.app import NNWatchApp
from nnwatch.tui.widgets.layers import LayersPane
from nnwatch.tui.widgets.updates import UpdateRow, UpdatesPane, UpdateTable, strip_scale
from tests.fixtures.update_runs import decay_run, healthy_run, rounded_run

Body = Callable[[Pilot[Any], NNWatchApp], Awaitable[None]]
FIXTURE_PARAM_LAYERS = [
    "embed", "blocks.0.fc1", "blocks.0.fc2", "blocks.1.fc1", "blocks.1.fc2",
    "blocks.2.fc1", "blocks.2.fc2", "norm", "head",
]  # fmt: skip


def drive(run_dir: Path, body: Body, size: tuple[int, int] = (160, 48)) -> None:
    app = NNWatchApp(RecordedSource(run_dir), hardware=fixed_hardware, fps=10)

    async def main() -> None:
        async with app.run_test(size=size) as pilot:
            await settle(pilot, app, timeout=60)
            await body(pilot, app)

    asyncio.run(main())


async def show_updates(pilot: Pilot[Any], app: NNWatchApp) -> tuple[UpdatesPane, UpdateTable]:
    await pilot.press("u")
    await settle(pilot, app)
    pane = app.query_one(UpdatesPane)
    assert pane.draw_error == ""
    return pane, pane.query_one(UpdateTable)


def text(table: UpdateTable) -> str:
    """The table as drawn (header, the rows on screen), or the note in their place."""
    return table.render().plain  # type: ignore[union-attr]


def cells(table: UpdateTable, name: str) -> list[str]:
    return [c.plain for c in table.row_texts(name)]


@pytest.fixture(scope="module")
def fixture_runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("updates")
    return {
        "healthy": write_run(FixtureSource(600), root / "healthy"),
        "rounded": write_run(FixtureSource(600, updates="rounded"), root / "rounded"),
        "schema3": write_run(FixtureSource(600, schema_version=3), root / "schema3"),
    }


def test_u_shows_the_updates_in_place_of_the_layers_and_back(fixture_runs: dict[str, Path]) -> None:
    async def body(pilot: Pilot[Any], app: NNWatchApp) -> None:
        dashboard, layers = app.dashboard, app.query_one(LayersPane)
        assert not dashboard.showing_updates and not app.query_one(UpdatesPane).display
        assert "u: updates" in str(layers.border_subtitle)
        pane, table = await show_updates(pilot, app)
        assert dashboard.showing_updates and pane.display and not layers.display
        assert app.focused is table  # its rows take Up/Down; Escape gives the keys back
        assert pane.size.width > 0 and pane.size.height > 0
        # one row per parameter-owning layer, in forward order, numbered as in the layers pane
        assert pane.shown_rows == FIXTURE_PARAM_LAYERS
        assert cells(table, "blocks.0.fc1")[0] == "1" and cells(table, "head")[0] == "11"
        assert pane.step == 590  # the last measured update of a 600-step run
        title = str(pane.border_title)
        assert "@ step 590" in title and "all 9 within 1e-5..1e-1" in title
        drawn = text(table)
        assert "1e-5" in drawn and "1e-3" in drawn and "1e-1" in drawn  # the log strip's scale
        for name in FIXTURE_PARAM_LAYERS:
            row = cells(table, name)
            ratio = float(row[4])
            assert 1e-4 <= ratio <= 1e-2, (name, row)
            assert "●" in row[3] and row[6] == ""  # a dot on the strip; nothing left unchanged
        await pilot.press("down", "down")
        assert table.cursor_row == 2 and "blocks.0.fc2" in str(pane.border_subtitle)
        await pilot.press("left")  # the step cursor still moves while the rows have the keys
        await settle(pilot, app)
        assert app.ctx.cursor is not None and app.focused is table
        assert pane.step is not None and pane.step <= app.ctx.cursor
        await pilot.press("end")  # the rows' own End: the last row (the dashboard's is "follow")
        assert table.cursor_row == 8 and app.ctx.cursor is not None
        await pilot.press("escape")
        assert app.focused is None and dashboard.showing_updates
        await pilot.press("u")  # again: the layers come back
        await settle(pilot, app)
        assert not dashboard.showing_updates and layers.display and not pane.display
        await pilot.press("u", "l")  # l from the updates: the layers, with the filter focused
        assert not dashboard.showing_updates
        assert app.focused is not None and app.focused.id == "layer-filter"

    drive(fixture_runs["healthy"], body)


def test_the_step_shown_is_the_last_measured_update_at_or_before_the_cursor(
    fixture_runs: dict[str, Path],
) -> None:
    async def body(pilot: Pilot[Any], app: NNWatchApp) -> None:
        pane, _ = await show_updates(pilot, app)
        # step 180: the AMP scaler skipped the update (a layer row for its non-finite gradients,
        # without an update); the layers pane shows 180, the updates pane the update before it
        app.navigation.set_cursor(185.0)
        await settle(pilot, app)
        assert "@ step 180" in str(app.query_one(LayersPane).border_title)
        assert pane.step == 170 and "@ step 170" in str(pane.border_title)
        app.navigation.set_cursor(192.0)
        await settle(pilot, app)
        assert pane.step == 190
        await pilot.press("escape", "home")  # out of the rows: Home is the dashboard's again
        await settle(pilot, app)
        assert pane.step == 0

    drive(fixture_runs["healthy"], body)


def test_rounded_away_updates_are_slow_red_and_unchanged(fixture_runs: dict[str, Path]) -> None:
    async def body(pilot: Pilot[Any], app: NNWatchApp) -> None:
        pane, table = await show_updates(pilot, app)
        title = str(pane.border_title)
        assert "9 of 9 outside 1e-5..1e-1 (9 slow)" in title and "unchanged 62%" in title
        head = cells(table, "head")
        assert head[4] == "0" and "◀" in head[3] and head[6] == "100%"  # nothing moved at all
        embed = cells(table, "embed")
        assert "●" in embed[3] and float(embed[4]) < 1e-5 and embed[6] == "45%"
        red = app.ctx.palette.error.color
        assert table.row_texts("head")[1].style.color == red  # type: ignore[union-attr]

    drive(fixture_runs["rounded"], body)


def test_a_schema_3_run_says_it_has_no_update_fields(fixture_runs: dict[str, Path]) -> None:
    async def body(pilot: Pilot[Any], app: NNWatchApp) -> None:
        pane, table = await show_updates(pilot, app)
        drawn = " ".join(text(table).split())
        assert "recorded by an older nnwatch (schema 3)" in drawn
        assert pane.shown_rows == [] and pane.step is None
        assert str(pane.border_title) == "[b]Updates[/b]"

    drive(fixture_runs["schema3"], body, size=(80, 24))


def test_80_columns_keep_the_name_the_strip_and_the_numbers(fixture_runs: dict[str, Path]) -> None:
    async def body(pilot: Pilot[Any], app: NNWatchApp) -> None:
        pane, table = await show_updates(pilot, app)
        assert table.narrow and table.size.width <= 76
        lines = text(table).splitlines()
        assert "upd/w" in lines[0] and "weight" in lines[0] and "frozen" in lines[0]
        assert all(len(line.rstrip()) <= table.size.width for line in lines)
        first = lines[1].split()
        assert first[1] == "embed" and "●" in lines[1] and 1e-4 < float(first[-2]) < 1e-2
        assert "rows 1-5 of 9" in str(pane.border_subtitle)  # the rest scroll into view
        await pilot.press("end")
        assert table.top == 4 and "head" in text(table)

    drive(fixture_runs["healthy"], body, size=(80, 24))


def test_the_layer_filter_narrows_the_updates_too(fixture_runs: dict[str, Path]) -> None:
    async def body(pilot: Pilot[Any], app: NNWatchApp) -> None:
        await pilot.press("slash", *"fc1", "enter", "escape")
        pane, _ = await show_updates(pilot, app)
        assert pane.shown_rows == ["blocks.0.fc1", "blocks.1.fc1", "blocks.2.fc1"]
        assert "3 of 9 shown" in str(pane.border_title)

    drive(fixture_runs["healthy"], body)


# -- real training runs -------------------------------------------------------------------------
def test_a_real_healthy_run(tmp_path: Path) -> None:
    run_dir = healthy_run(tmp_path / "healthy")

    async def body(pilot: Pilot[Any], app: NNWatchApp) -> None:
        pane, table = await show_updates(pilot, app)
        assert pane.shown_rows == ["0", "2", "4"] and pane.step == 20
        assert "all 3 within 1e-5..1e-1" in str(pane.border_title)
        assert "no update" not in text(table) and "unchanged" not in str(pane.border_title)
        for name in pane.shown_rows:
            assert 1e-4 <= float(cells(table, name)[4]) <= 1e-1

    drive(run_dir, body)


def test_a_real_bf16_run_whose_updates_round_away(tmp_path: Path) -> None:
    run_dir = rounded_run(tmp_path / "bf16")

    async def body(pilot: Pilot[Any], app: NNWatchApp) -> None:
        pane, table = await show_updates(pilot, app)
        title = str(pane.border_title)
        assert "3 of 3 outside 1e-5..1e-1" in title  # at 80 columns, without "(3 slow)"
        assert "unchanged 99%" in title or "unchanged 100%" in title
        for name in pane.shown_rows:
            row = cells(table, name)
            assert float(row[4]) < 1e-5 and row[6] in ("99%", "100%"), row

    drive(run_dir, body, size=(80, 24))


def test_a_real_run_whose_weights_decay_away(tmp_path: Path) -> None:
    run_dir = decay_run(tmp_path / "decay")

    async def body(pilot: Pilot[Any], app: NNWatchApp) -> None:
        pane, table = await show_updates(pilot, app)
        assert "3 of 3 outside 1e-5..1e-1 (3 fast)" in str(pane.border_title)
        for name in pane.shown_rows:
            row = cells(table, name)
            assert float(row[4]) > 0.1 and ("●" in row[3] or "▶" in row[3]), row

    drive(run_dir, body)


# -- the pieces --------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("weight", "update", "verdict"),
    [
        (2.0, 2e-3, "ok"),
        (2.0, 4e-5, "low"),
        (2.0, 1e-5, "slow"),
        (2.0, 0.0, "slow"),
        (2.0, 0.1, "high"),
        (2.0, 0.5, "fast"),
        (0.0, 0.1, "fast"),
        (2.0, math.nan, "none"),
    ],
)
def test_the_verdict_of_one_layer(weight: float, update: float, verdict: str) -> None:
    assert UpdateRow(0, "fc", "Linear", weight, update, 0.0).verdict == verdict


def test_the_strip_scale_puts_each_decade_over_its_cell() -> None:
    scale = strip_scale(43)  # 6 cells a decade: 1e-7 at 0, 1e-5 at 12, 1e-3 at 24, 1e-1 at 36
    assert scale.index("1e-5") == 12 - 2 and scale.index("1e-3") == 24 - 2
    assert scale.startswith("1e-7") and scale.rstrip().endswith("1")
    assert "1e-3" in strip_scale(15)  # the narrowest strip keeps the middle
