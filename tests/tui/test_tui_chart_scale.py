"""Charts at 80x24 on a real run with one-step spikes: the bulk of the data fills the plot, the
spikes become off-scale markers, the early steps stay on the plot, and ``g`` puts every chart
(loss and grad norm alike) on a log axis."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

from nnwatch.sources.recorded import RecordedSource
from nnwatch.testing.tui import fixed_hardware, settle
from nnwatch.tui.app import NNWatchApp
from nnwatch.tui.widgets.grad import GradPane
from nnwatch.tui.widgets.loss import LossPane
from tests.fixtures import snapshot_runs

pytestmark = pytest.mark.timeout(120)


@pytest.fixture(scope="module")
def spiky(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("spiky")
    mp = pytest.MonkeyPatch()
    mp.setenv("NNWATCH_RUN_DIR", str(root))
    try:
        return snapshot_runs.spiky_run(root / "run")
    finally:
        mp.undo()


def plot_rows(pane: Any) -> list[str]:
    """The plot's lines (without the marker row and x labels), gutter removed."""
    lines = str(pane.render()).split("\n")
    return [line[7:] for line in lines[1:] if "└" not in line]


def rows_with_dots(pane: Any) -> int:
    return sum(1 for line in plot_rows(pane) if any("\u2800" < ch <= "\u28ff" for ch in line))


def markers(pane: Any) -> str:
    return str(pane.render()).split("\n")[0]


def test_spikes_go_off_scale_and_the_bulk_fills_the_plot(spiky: Path) -> None:
    app = NNWatchApp(RecordedSource(spiky), hardware=fixed_hardware, fps=10)

    async def main() -> None:
        async with app.run_test(size=(80, 24)) as pilot:
            await settle(pilot, app, 200)
            grad, loss = app.query_one(GradPane), app.query_one(LossPane)
            assert not app.ctx.log_scale
            for pane in (grad, loss):
                assert "▲ off scale" in str(pane.border_subtitle) or "▲" in markers(pane)
                assert markers(pane).count("▲") >= 2  # the spikes: a marker over their columns
                rows = len(plot_rows(pane))
                # the curve between the spikes uses the height instead of one flat bottom row
                assert rows_with_dots(pane) >= max(rows - 1, 2), str(pane.render())
            # the early steps (the initial loss, above the later level) stay on the plot
            first_cols = [line[:2] for line in plot_rows(loss)]
            assert any(any("\u2800" < ch <= "\u28ff" for ch in c) for c in first_cols)
            assert "▲" not in markers(loss)[7:9]
            linear = str(grad.render())
            await pilot.press("g")
            await settle(pilot, app)
            assert app.ctx.log_scale
            assert "log" in str(grad.border_subtitle) and "log" in str(loss.border_subtitle)
            assert str(grad.render()) != linear  # the grad chart follows the toggle too

    asyncio.run(main())
