"""``/`` filters the layers by a substring or a glob; the header, the layers title and the footer
say that rows are hidden; Escape clears it. On the real app under Pilot, over a real run log."""

from __future__ import annotations

import asyncio
from pathlib import Path

from nnwatch.sources.recorded import RecordedSource
from nnwatch.testing.fixture import FixtureSource, write_run
from nnwatch.testing.tui import fixed_hardware, settle, wait_until
from nnwatch.tui.app import NNWatchApp
from nnwatch.tui.widgets.header import RunHeader
from nnwatch.tui.widgets.layers import LayersPane, LayerTable, matches


def footer_keys(app: NNWatchApp) -> set[str]:
    """The actions the footer offers now."""
    return {b.binding.action for b in app.active_bindings.values() if b.enabled}


def test_slash_filters_by_glob_shows_it_and_escape_clears(tmp_path: Path) -> None:
    run_dir = write_run(FixtureSource(600), tmp_path / "run")
    app = NNWatchApp(RecordedSource(run_dir), hardware=fixed_hardware, fps=10)

    async def main() -> None:
        async with app.run_test(size=(80, 24)) as pilot:  # the narrow layout hides the input
            await settle(pilot, app, 600)
            layers = app.query_one(LayersPane)
            header = app.query_one(RunHeader)
            assert len(layers.shown_rows) == 12
            assert "clear_filter" not in footer_keys(app)  # Escape has nothing to clear yet

            await pilot.press("slash")
            assert app.focused is not None and app.focused.id == "layer-filter"
            await pilot.press(*"blocks.*.act")  # a glob over the whole name
            await wait_until(pilot, lambda: len(layers.shown_rows) == 3)
            assert layers.shown_rows == ["blocks.0.act", "blocks.1.act", "blocks.2.act"]
            await pilot.press("enter")  # to the rows; dashboard keys still work from there
            assert isinstance(app.focused, LayerTable) and app.focused.row_count == 3
            await pilot.press("escape")  # out of the rows: the filter stays ...
            assert app.focused is None and len(layers.shown_rows) == 3
            await settle(pilot, app)
            # ... and says so: in the header, in the layers title, in the footer
            assert "filter 'blocks.*.act'" in header._picture.plain
            assert "filter 'blocks.*.act': 3 of 12" in str(layers.border_title)
            assert "clear_filter" in footer_keys(app)

            await pilot.press("escape")  # on the dashboard: clears it
            await wait_until(pilot, lambda: len(layers.shown_rows) == 12)
            await settle(pilot, app)
            assert "filter" not in header._picture.plain
            assert "filter" not in str(layers.border_title)
            assert "clear_filter" not in footer_keys(app)

            await pilot.press("slash", *"FC2")  # a substring, any case
            await wait_until(pilot, lambda: len(layers.shown_rows) == 3)
            await pilot.press("escape")  # Escape in the input clears at once and leaves
            assert app.focused is None
            await wait_until(pilot, lambda: len(layers.shown_rows) == 12)
            await pilot.press("z")  # the dashboard has its keys back
            assert app.ctx.zoomed

    asyncio.run(main())


def test_matches_takes_substrings_and_globs() -> None:
    assert matches("", "anything", "Linear")
    assert matches("relu", "blocks.0.act", "ReLU")  # by kind
    assert matches("BLOCKS.1", "blocks.1.fc1", "Linear")
    assert matches("blocks.?.fc1", "blocks.1.fc1", "Linear")
    assert not matches("blocks.?.fc1", "blocks.10.fc1", "Linear")
    assert matches("*norm", "norm", "LayerNorm")
    assert not matches("blocks.*", "head", "Linear")  # a glob matches the whole name
