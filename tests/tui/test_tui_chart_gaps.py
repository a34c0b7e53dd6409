"""Steps that were not measured draw as gaps, never as lines drawn across them.

The probe's cost budget measures gradient norms on some steps only and stores NaN on the others.
A chart that bridged the NaN columns made a blow-up between two measurements look like a smooth
ramp. These tests render the grad-norm pane with Textual's Pilot, read the cells the terminal
would show, and compare them with the raw steps: a cell whose steps were all unmeasured is blank
in every row; a cell holding a measured step draws. The min/max buckets of a long run keep this:
a bucket with one measured step still draws, at full height for a spike.
"""

from __future__ import annotations

import asyncio
import math
import subprocess
import sys
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import numpy as np
from textual.geometry import Region
from textual.pilot import Pilot

import nnwatch
from nnwatch.sources.base import RunSource
from nnwatch.sources.recorded import RecordedSource
from nnwatch.testing.fixture import FixtureSource
from nnwatch.testing.tui import fixed_hardware, settle
from nnwatch.tui.app import NNWatchApp
from nnwatch.tui.widgets.chart import GUTTER
from nnwatch.tui.widgets.grad import GradPane
from nnwatch.tui.widgets.loss import LossPane
from tests.conftest import REPO

Body = Callable[[Pilot[Any], NNWatchApp], Awaitable[None]]


class _NoClip(FixtureSource):
    """The fixture without gradient clipping (no threshold line): only the norm is drawn.

    ``never`` lists step ranges whose gradients were not measured either.
    """

    def __init__(self, *args: Any, never: tuple[tuple[int, int], ...] = (), **kw: Any) -> None:
        super().__init__(*args, **kw)
        self.never = never

    def scalar_rows(self, start: int, stop: int) -> np.ndarray:
        out = super().scalar_rows(start, stop)
        for name in ("clip_threshold", "grad_norm_clipped", "clipped"):
            out[name] = np.nan
        for a, b in self.never:
            out["grad_norm"][(out["step"] >= a) & (out["step"] < b)] = np.nan
        return out


def drive(app: NNWatchApp, body: Body, size: tuple[int, int] = (160, 48)) -> None:
    async def main() -> None:
        async with app.run_test(size=size) as pilot:
            await body(pilot, app)

    asyncio.run(main())


def make_app(source: RunSource) -> NNWatchApp:
    return NNWatchApp(source, hardware=fixed_hardware, fps=10)


def plot_cells(pane: GradPane | LossPane) -> tuple[list[str], int]:
    """The chart's plot rows as the terminal shows them (cells right of the y axis), and the
    number of cell columns. Border (1) and padding (1) come first, then the 7-cell gutter; the
    first content row is the marker row and the last the x labels."""
    w, h = pane.region.width, pane.region.height
    lines = [s.text for s in pane.render_lines(Region(0, 0, w, h))]
    left = 2 + GUTTER
    pw = pane.size.width - GUTTER
    rows = [line[left : left + pw] for line in lines[2 : 2 + pane.size.height - 2]]
    assert all(len(r) == pw for r in rows)
    return rows, pw


def cells_with_a_measured_step(
    steps: np.ndarray, values: np.ndarray, x0: float, x1: float, pw: int
) -> np.ndarray:
    """For each cell column: does it hold a step with a measured (finite) value?

    Each cell is two dot columns of (x1 - x0 + 1) / (2 * pw) steps each."""
    span = x1 - x0 + 1.0
    cell = np.floor((steps - x0) * (2 * pw) / span).astype(np.int64) // 2
    out = np.zeros(pw, dtype=bool)
    ok = np.isfinite(values) & (cell >= 0) & (cell < pw)
    out[cell[ok]] = True
    return out


def assert_gaps_are_blank(rows: list[str], measured: np.ndarray) -> int:
    """Every cell without a measured step is blank in every plot row, every other one draws.
    Returns how many blank (gap) cells there are."""
    drawn = np.array([any(r[c] != " " for r in rows) for c in range(len(measured))])
    bridged = np.flatnonzero(drawn & ~measured)
    assert not len(bridged), f"cells {bridged.tolist()} draw across unmeasured steps"
    missing = np.flatnonzero(~drawn & measured)
    assert not len(missing), f"cells {missing.tolist()} hold a measured step but draw nothing"
    return int((~measured).sum())


def test_unmeasured_steps_leave_blank_cells_in_the_grad_chart() -> None:
    src = _NoClip(300, grad_every=25, amp=False)

    async def body(pilot: Pilot[Any], app: NNWatchApp) -> None:
        await settle(pilot, app, 300)
        pane = app.query_one(GradPane)
        rows, pw = plot_cells(pane)
        x0, x1 = app.state.window(False, None)
        data = src.scalar_rows(0, 300)
        measured = cells_with_a_measured_step(data["step"], data["grad_norm"], x0, x1, pw)
        gaps = assert_gaps_are_blank(rows, measured)
        assert gaps >= pw // 2  # measured every 25th step: most cells are gaps
        # between two measurements, 25 steps apart, the cells in between are empty: no ramp
        first, second = np.flatnonzero(measured)[1:3]
        assert second - first >= 4
        assert all(r[first + 1 : second].strip() == "" for r in rows)

    drive(make_app(src), body)


def test_the_last_500_steps_of_a_sparse_run_have_gaps_too() -> None:
    src = _NoClip(2000, grad_every=40, amp=False)

    async def body(pilot: Pilot[Any], app: NNWatchApp) -> None:
        await settle(pilot, app, 2000)
        await pilot.press("z")
        await pilot.pause(0.1)
        x0, x1 = app.state.window(True, None)
        assert x1 - x0 == 499
        rows, pw = plot_cells(app.query_one(GradPane))
        data = src.scalar_rows(0, 2000)
        measured = cells_with_a_measured_step(data["step"], data["grad_norm"], x0, x1, pw)
        assert assert_gaps_are_blank(rows, measured) >= pw // 2

    drive(make_app(src), body)


def test_a_long_run_keeps_min_max_buckets_and_blank_unmeasured_buckets() -> None:
    """40,960 steps reduced to min/max buckets: measured only every 1024th step (bucket starts),
    and never in [5,000, 15,000). Buckets holding one measured step still draw; the spike (one
    measured step) reaches the top row; the unmeasured stretch is blank, not a ramp."""
    n = 40_960
    src = _NoClip(n, grad_every=1024, amp=False, spike_at=0.45, never=((5_000, 15_000),))
    assert src.spike_step % 1024 == 0

    async def body(pilot: Pilot[Any], app: NNWatchApp) -> None:
        await settle(pilot, app, n)
        assert app.state.history.bucket > 1  # the whole-run view comes from buckets
        x0, x1 = app.state.window(False, None)
        assert x0 < app.state.history.tail_first_step
        rows, pw = plot_cells(app.query_one(GradPane))
        data = src.scalar_rows(0, n)
        measured = cells_with_a_measured_step(data["step"], data["grad_norm"], x0, x1, pw)
        assert_gaps_are_blank(rows, measured)
        spike_cell = int((src.spike_step - x0) * 2 * pw / (x1 - x0 + 1)) // 2
        assert rows[0][spike_cell] != " "  # the one-step spike: full height
        stretch = cells_with_a_measured_step(
            np.arange(5_000, 15_000, dtype=np.float64), np.ones(10_000), x0, x1, pw
        )
        inside = np.flatnonzero(stretch)[1:-1]  # cells wholly inside the unmeasured stretch
        assert len(inside) >= 5
        assert all(r[c] == " " for r in rows for c in inside)

    drive(make_app(src), body)


def test_a_short_fully_measured_run_still_draws_one_unbroken_line() -> None:
    """Fewer steps than dot columns: each step covers more than one column, and those are
    measured, so the loss line has no holes between its first and last cell."""
    src = _NoClip(90, amp=False)

    async def body(pilot: Pilot[Any], app: NNWatchApp) -> None:
        await settle(pilot, app, 90)
        rows, pw = plot_cells(app.query_one(LossPane))
        drawn = [c for c in range(pw) if any(r[c] != " " for r in rows)]
        assert drawn[0] == 0
        assert drawn == list(range(drawn[0], drawn[-1] + 1))  # no blank cell inside
        assert drawn[-1] >= pw - 2
        grad_rows, _ = plot_cells(app.query_one(GradPane))
        assert all(any(r[c] != " " for r in grad_rows) for c in range(2, pw - 2))

    drive(make_app(src), body)


def test_missing_values_in_titles_show_an_en_dash() -> None:
    """A run whose gradients were never measured: "Grad norm –", never 0 or nan."""
    src = _NoClip(400, amp=False, never=((0, 400),))

    async def body(pilot: Pilot[Any], app: NNWatchApp) -> None:
        await settle(pilot, app, 400)
        pane = app.query_one(GradPane)
        title = pane.render_lines(Region(0, 0, pane.region.width, 1))[0].text
        assert "Grad norm –" in title
        assert "nan" not in title.lower() and "Grad norm 0" not in title
        rows, _ = plot_cells(pane)
        assert "no data yet" in "".join(rows) or all(not r.strip() for r in rows)

    drive(make_app(src), body)


def test_scrubbing_to_an_unmeasured_step_shows_the_last_measured_norm(tmp_path: Path) -> None:
    """The cursor on a step the budget skipped: the title keeps the last measured norm, exact
    from the run log even far before the monitor's raw tail."""
    from nnwatch.testing.fixture import write_run

    src = _NoClip(6000, grad_every=25, amp=False)
    run_dir = write_run(src, tmp_path / "run")
    data = nnwatch.load_run(run_dir)
    norms = np.asarray(data["grad_norm"])

    async def body(pilot: Pilot[Any], app: NNWatchApp) -> None:
        await settle(pilot, app, 6000)
        app.navigation.set_cursor(112.0)  # not measured; the last measured step before it is 100
        await pilot.pause(0.1)
        assert math.isnan(norms[112]) and math.isfinite(norms[100])
        pane = app.query_one(GradPane)
        title = pane.render_lines(Region(0, 0, pane.region.width, 1))[0].text
        from nnwatch.tui import format as fmt

        assert f"Grad norm {fmt.num(float(norms[100]))}" in title

    drive(make_app(RecordedSource(run_dir)), body)


#: A real training loop whose gradient norms the cost budget measures on some steps only.
BUDGET_TRAINER = r"""
import sys
import torch
from torch import nn
import nnwatch

torch.set_num_threads(1)
torch.manual_seed(0)
model = nn.Sequential(nn.Linear(8, 32), nn.ReLU(), nn.Linear(32, 3))
opt = torch.optim.SGD(model.parameters(), lr=0.05)
# a budget no step can meet: gradient norms every 16th step (plus the always-measured ones)
with nnwatch.watch(model, opt, num_classes=3, budget=1e-9, max_interval=16, layer_interval=1000,
                   name="budget") as w:
    print("run_dir", w.run_dir, flush=True)
    for i in range(int(sys.argv[1])):
        x, y = torch.randn(4, 8), torch.randint(0, 3, (4,))
        opt.zero_grad()
        nn.functional.cross_entropy(model(x), y).backward()
        opt.step()
        w.step(nn.functional.cross_entropy(model(x), y).detach())
"""


def test_a_real_run_on_the_cost_budget_draws_its_grad_norm_without_gaps(
    subprocess_env: dict[str, str],
) -> None:
    """The budget leaves most steps' layer sums out, but the global norm is taken on every step
    (a spike between measured steps is what a monitor exists to show): the grad pane draws a
    point in every column that holds a step, and nothing is bridged or left blank."""
    out = subprocess.run(
        [sys.executable, "-c", BUDGET_TRAINER, "400"],
        cwd=REPO,
        env=subprocess_env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    run_dir = Path(next(x for x in out.stdout.splitlines() if x.startswith("run_dir")).split()[1])
    run = nnwatch.load_run(run_dir)
    steps, norms = np.asarray(run.steps, dtype=np.float64), np.asarray(run["grad_norm"])
    skipped = np.asarray(run["layer_sums"]) == 0.0
    assert skipped.sum() > len(norms) // 2  # the budget skipped most steps' layer sums ...
    assert np.isfinite(norms).all()  # ... and every step's global norm is there

    async def body(pilot: Pilot[Any], app: NNWatchApp) -> None:
        await settle(pilot, app, len(run))
        rows, pw = plot_cells(app.query_one(GradPane))
        x0, x1 = app.state.window(False, None)
        measured = cells_with_a_measured_step(steps, norms, x0, x1, pw)
        assert measured.sum() >= 10
        assert assert_gaps_are_blank(rows, measured) == int((~measured).sum())

    drive(make_app(RecordedSource(run_dir)), body)
