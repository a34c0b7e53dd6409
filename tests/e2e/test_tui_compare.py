"""Runs side by side: ``o`` overlays another run on the charts, ``x`` drops it, ``O`` swaps the
two; ``nnwatch open RUN --compare OTHER`` starts with one. Real run logs written by the fixture
helpers, a real synthetic trainer for the live overlay, the real app under Pilot."""

from __future__ import annotations

import asyncio
import json
import math
import socket
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from rich.style import Style
from rich.text import Text
from textual.pilot import Pilot

from nnwatch.cli import main as cli_main
from nnwatch.sources.base import SourceError
from nnwatch.sources.live import LiveSource
from nnwatch.sources.recorded import RecordedSource
from nnwatch.store.registry import list_runs
from nnwatch.testing.fixture import FixtureSource, write_run
from nnwatch.testing.tui import fixed_hardware, settle, wait_until
from nnwatch.tui.app import NNWatchApp
from nnwatch.tui.model import is_finding
from nnwatch.tui.run_sources import open_run_spec
from nnwatch.tui.screens.compare import CompareScreen
from nnwatch.tui.widgets.chart import GUTTER, Plot, Trace, render_plot, y_range
from nnwatch.tui.widgets.grad import GradPane
from nnwatch.tui.widgets.header import RunHeader
from nnwatch.tui.widgets.loss import LossPane

REPO = Path(__file__).resolve().parents[2]
Body = Callable[[Pilot[Any], NNWatchApp], Awaitable[None]]


def drive(app: NNWatchApp, body: Body, size: tuple[int, int] = (160, 48)) -> None:
    async def main() -> None:
        async with app.run_test(size=size) as pilot:
            await body(pilot, app)

    asyncio.run(main())


def cells_in(picture: Text, style: Style) -> list[tuple[int, int]]:
    """(row, plot column) of every drawn cell whose colour is ``style``'s."""
    out = []
    for row, line in enumerate(picture.split("\n")):
        for span in line.spans:
            st = span.style
            if isinstance(st, Style) and st.color == style.color:
                out += [
                    (row, i - GUTTER)
                    for i in range(span.start, span.end)
                    if line.plain[i] not in " │"
                ]
    return out


LR_HIGH = dict(seed=3, name="lr-high", end_state="crashed", spike_at=0.8)
FINDINGS_OF_LR_HIGH = sum(map(is_finding, FixtureSource(1500, **LR_HIGH).events()))  # type: ignore[arg-type]


@pytest.fixture
def two_runs(run_root: Path) -> tuple[Path, Path]:
    """A finished 3000-step run and a 1500-step one that ended without end.json (killed), where
    `nnwatch ls --all` finds them."""
    main = write_run(FixtureSource(3000, name="baseline"), run_root / "runs" / "baseline")
    other = write_run(
        FixtureSource(1500, **LR_HIGH),  # type: ignore[arg-type]
        run_root / "runs" / "lr-high",
    )
    # killed on this machine: a run written on another host and never ended cannot be judged
    # from here (its trainer may still run there), so the killed run's meta names this host
    meta_path = Path(other) / "meta.json"
    meta = json.loads(meta_path.read_text())
    meta["host"] = socket.gethostname()
    meta_path.write_text(json.dumps(meta))
    return main, other


def test_o_overlays_a_run_aligned_by_step_with_a_legend_and_x_drops_it(
    two_runs: tuple[Path, Path],
) -> None:
    main_dir, other_dir = two_runs
    app = NNWatchApp(RecordedSource(main_dir), hardware=fixed_hardware, fps=10)

    async def body(pilot: Pilot[Any], app: NNWatchApp) -> None:
        await settle(pilot, app, 3000)
        loss, grad = app.query_one(LossPane), app.query_one(GradPane)
        overlay_style = app.ctx.palette.overlay
        assert not cells_in(loss._picture, overlay_style)
        assert not app.check_action("clear_overlay", ())  # nothing to drop yet: not in the footer

        await pilot.press("o")
        await wait_until(pilot, lambda: isinstance(app.screen, CompareScreen))
        chooser = app.screen
        assert isinstance(chooser, CompareScreen)
        await wait_until(pilot, lambda: chooser.listed)
        # the chooser lists the other run, with its findings, never the one on screen
        assert [Path(r.run_dir).name for r in chooser.runs] == ["lr-high"]
        assert chooser.findings[str(other_dir)] == FINDINGS_OF_LR_HIGH > 0
        await pilot.press("enter")
        await wait_until(pilot, lambda: app.overlay is not None)
        overlay = app.overlay
        assert overlay is not None
        await wait_until(pilot, lambda: overlay.state.history.rows == 1500)
        await settle(pilot, app)

        # two series: the main run's in its colour, the other's in the overlay colour ...
        main_cells = cells_in(loss._picture, app.ctx.palette.primary)
        other_cells = cells_in(loss._picture, overlay_style)
        assert main_cells and other_cells
        # ... aligned by step: 1500 of the window's 3000 steps, so only the left half of the plot
        pw = loss.size.width - GUTTER
        assert max(c for _, c in other_cells) <= pw // 2 + 1
        assert max(c for _, c in main_cells) >= pw - 2
        assert cells_in(grad._picture, overlay_style)  # the grad norm chart too
        # the legend names both runs, with their values, in both charts
        for pane in (loss, grad):
            title = str(pane.border_title)
            assert "baseline" in title and "lr-high" in title
        assert "vs lr-high crashed" in app.query_one(RunHeader)._picture.plain
        assert app.check_action("clear_overlay", ()) and app.check_action("swap_overlay", ())

        await pilot.press("x")
        assert app.overlay is None
        await settle(pilot, app)
        assert not cells_in(loss._picture, overlay_style)
        assert "lr-high" not in str(loss.border_title)
        assert overlay.collector.stopped

    drive(app, body)


def test_compare_argument_and_capital_o_swaps_the_main_run(two_runs: tuple[Path, Path]) -> None:
    main_dir, other_dir = two_runs
    app = NNWatchApp(
        RecordedSource(other_dir),
        compare=RecordedSource(main_dir),
        hardware=fixed_hardware,
        fps=10,
    )

    async def body(pilot: Pilot[Any], app: NNWatchApp) -> None:
        await settle(pilot, app, 1500)
        overlay = app.overlay
        assert overlay is not None and overlay.label == "baseline"
        await wait_until(pilot, lambda: overlay.state.history.rows == 3000)
        await settle(pilot, app)
        loss = app.query_one(LossPane)
        # the whole-run view spans both runs: the main one stopped at 1,499, the other at 2,999
        assert "2,999" in loss._picture.plain
        other_cells = cells_in(loss._picture, app.ctx.palette.overlay)
        main_cells = cells_in(loss._picture, app.ctx.palette.primary)
        pw = loss.size.width - GUTTER
        assert max(c for _, c in other_cells) >= pw - 2
        assert max(c for _, c in main_cells) <= pw // 2 + 1

        await pilot.press("O")  # the overlay becomes the main run, the main run the overlay
        assert app.source.meta.name == "baseline" and app.state.history.rows == 3000
        assert app.overlay is not None and app.overlay.label == "lr-high"
        assert app.overlay.state.history.rows == 1500  # each run keeps its history
        assert app.title == "nnwatch · baseline"
        await settle(pilot, app)
        header = app.query_one(RunHeader)._picture.plain
        assert "baseline" in header and "vs lr-high" in header
        # the layers and the header follow the new main run; the old one is drawn as overlay
        assert cells_in(loss._picture, app.ctx.palette.overlay)
        await pilot.press("q")

    drive(app, body)
    assert app.return_value == 0
    with pytest.raises(SourceError):  # both sources were closed on quit
        app.source.poll()


def test_a_live_overlay_keeps_growing(
    two_runs: tuple[Path, Path], subprocess_env: dict[str, str]
) -> None:
    main_dir, _ = two_runs
    trainer = subprocess.Popen(
        [sys.executable, "-m", "nnwatch.testing.synthetic", "--steps", "0", "--rate", "100", "--name", "live-one"],
        env=subprocess_env, stdout=subprocess.PIPE, text=True, cwd=REPO,
    )  # fmt: skip
    try:
        assert trainer.stdout is not None
        json.loads(trainer.stdout.readline())  # ready
        app = NNWatchApp(RecordedSource(main_dir), hardware=fixed_hardware, fps=10)

        async def body(pilot: Pilot[Any], app: NNWatchApp) -> None:
            await settle(pilot, app, 3000)
            await pilot.press("o")
            chooser = app.screen
            assert isinstance(chooser, CompareScreen)
            await wait_until(pilot, lambda: any(r.live for r in chooser.runs), timeout=30)
            assert chooser.runs[0].live  # live runs first, as in the picker
            await pilot.press("enter")
            await wait_until(pilot, lambda: app.overlay is not None)
            overlay = app.overlay
            assert overlay is not None and isinstance(overlay.source, LiveSource)
            await wait_until(pilot, lambda: overlay.state.history.rows > 0, timeout=30)
            first = overlay.state.history.last_step
            await wait_until(pilot, lambda: overlay.state.history.last_step > first + 20, 30)
            await settle(pilot, app)
            assert "vs live-one live" in app.query_one(RunHeader)._picture.plain
            assert "live-one" in str(app.query_one(LossPane).border_title)
            assert cells_in(app.query_one(LossPane)._picture, app.ctx.palette.overlay)
            assert not app.source.can_command  # the main (recorded) run stays pinned

        drive(app, body)
    finally:
        trainer.kill()
        trainer.wait()


def test_the_robust_scale_covers_both_runs_and_gaps_stay_gaps() -> None:
    rng = np.random.default_rng(0)
    n = 200
    low = 1.0 + 0.05 * rng.random(n)  # a healthy run near 1
    high = 100.0 + 5 * rng.random(n)  # a diverged one near 100 ...
    high[50] = 1e30  # ... with one blow-up
    high[120:140] = np.nan  # and steps it never measured
    plain, blue = Style(color="#0000ff"), Style(color="#ff00ff")
    plot = Plot(traces=[Trace(low, low, plain), Trace(high, high, blue)], robust=True)
    alone = y_range(plot)
    assert alone is not None and alone[1] < 10  # the main series' bulk only: 100 is cut off
    both = Plot(
        traces=[Trace(low, low, plain), Trace(high, high, blue)], robust=True, robust_also=(1,)
    )
    lo, hi = y_range(both) or (math.nan, math.nan)
    assert lo < 1.0 and 105 <= hi < 1e3  # both bulks on the plot, the blow-up is not
    picture = render_plot(both, GUTTER + n // 2, 12, Style())
    cols = {c for _, c in cells_in(picture, blue)}
    assert cols and not cols & set(range(61, 69))  # dot columns 122..137 held no value: a gap
    assert "▲" in picture.plain  # the blow-up is marked off scale


def test_nnwatch_open_compare_in_a_real_terminal(
    two_runs: tuple[Path, Path], run_root: Path
) -> None:
    import shutil

    if shutil.which("tmux") is None:
        pytest.skip("needs tmux (scripts/system-deps.sh)")
    from tests.terminal import Terminal

    main_dir, _ = two_runs
    env = {
        "NNWATCH_RUN_DIR": str(run_root),
        "PYTHONPATH": str(REPO),
        "TERM": "xterm-256color",
        "PATH": "/usr/bin:/bin",
        "HOME": "/tmp",
    }
    term = Terminal(f"{sys.executable} -m nnwatch open {main_dir} --compare lr-high", env)
    try:
        screen = term.wait_for("vs lr-high", timeout=120)
        assert "━ baseline" in screen and "━ lr-high" in screen
        term.keys("x")
        term.wait_for(lambda s: "vs lr-high" not in s)
        term.keys("q")
        assert term.exit_status() == 0
    finally:
        term.close()


def test_compare_names_a_missing_run_in_words(
    two_runs: tuple[Path, Path], capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    main_dir, other_dir = two_runs
    assert open_run_spec("lr-high").meta.name == "lr-high"  # by name, as `ls --all` shows it
    assert open_run_spec(str(other_dir)).meta.name == "lr-high"  # by directory
    monkeypatch.setenv("NNWATCH_FORCE_TUI", "1")
    assert cli_main(["open", str(main_dir), "--compare", "no-such-run"]) == 1
    err = capsys.readouterr().err
    assert "--compare: no-such-run is neither" in err and "nnwatch ls --all" in err


def test_live_runs_are_found_by_name_before_directories(
    run_root: Path, subprocess_env: dict[str, str]
) -> None:
    trainer = subprocess.Popen(
        [sys.executable, "-m", "nnwatch.testing.synthetic", "--steps", "0", "--rate", "50", "--name", "live-two"],
        env=subprocess_env, stdout=subprocess.PIPE, text=True, cwd=REPO,
    )  # fmt: skip
    try:
        assert trainer.stdout is not None
        json.loads(trainer.stdout.readline())
        deadline = time.monotonic() + 30
        while not any(r.live and r.name == "live-two" for r in list_runs()):
            assert time.monotonic() < deadline, "the live run never registered"
            time.sleep(0.1)
        source = open_run_spec("live-two")
        assert isinstance(source, LiveSource)  # followed live, not read from its log
        source.close()
    finally:
        trainer.kill()
        trainer.wait()
