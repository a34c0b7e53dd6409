"""The multi-rank view on a real 2-rank torchrun job (gloo, CPU), driven through Textual's Pilot.

Attached to rank 0, the dashboard shows a ranks pane with one row per rank, found from the
registry by a collector thread; ``]`` and ``[`` switch the whole dashboard to the other rank's run
(the header says which), and the pane marks the rank being watched. A single-process run has
neither the pane nor the rank keys in its footer.
"""

from __future__ import annotations

import asyncio
import io
import math
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

from rich.console import Console

from nnwatch.sources.job_monitor import RankState, build_view
from nnwatch.sources.live import LiveSource
from nnwatch.store.jobs import Job
from nnwatch.store.registry import RunInfo, list_runs
from nnwatch.testing.fixture import FixtureSource
from nnwatch.testing.tui import fixed_hardware, settle, wait_until
from nnwatch.tui.app import NNWatchApp
from nnwatch.tui.model import RunState
from nnwatch.tui.widgets.base import PaneContext
from nnwatch.tui.widgets.header import RunHeader
from nnwatch.tui.widgets.ranks import RanksPane, missing_ranges, status_style
from tests.conftest import REPO
from tests.integration.test_distributed_ddp import TORCHRUN, TRAINER, _wait_for


def test_missing_ranks_are_named_in_ranges() -> None:
    assert missing_ranges((2, 3, 4, 7, 9, 10)) == ["2-4", "7", "9-10"]
    assert missing_ranges(()) == []


def _info(rank: int, world: int) -> RunInfo:
    return RunInfo(
        name="ddp", pid=100 + rank, host="vm", rank=rank, world_size=world, state="running",
        message="", step=None, steps_per_s=None, age=1.0, heartbeat_age=None, last_step_age=None,
        dropped_records=0, run_dir=f"/nonexistent/ddp-r{rank}", ring="", socket=None,
        entry_path="", local_rank=rank, started=0.0,
    )  # fmt: skip


def test_pane_marks_nan_origin_stragglers_and_ranks_on_other_nodes() -> None:
    job = Job(
        "k", "ddp (3/8 ranks here)", "torchelastic", 8, 0, tuple(_info(r, 8) for r in (0, 1, 2))
    )
    states = {r: RankState() for r in (0, 1, 2)}
    for r, st in states.items():
        st.step, st.loss, st.grad_norm, st.step_times = (7 if r == 2 else 10), 0.5, 1.2, [1.0]
    states[1].loss, states[1].first = math.nan, {"loss": 7}
    view = build_view(job, states, dict.fromkeys((0, 1, 2), "live"))
    pane = RanksPane(PaneContext(RunState(FixtureSource(10).meta)))
    pane.view = view
    console = Console(width=120, file=io.StringIO(), record=True)
    console.print(pane.build())
    lines = console.export_text().splitlines()
    row = {ln.split()[-1 if ln.startswith("  rank") else 0]: ln for ln in lines}
    # ranks 3-7 are on other nodes and may have gone non-finite first: no rank is called first
    # over part of a job (issue 33, item 10: a rank here was labelled "first NaN" that way)
    assert "nan" in row["1"].split() and "non-finite loss since step 7" in row["1"]
    assert "first NaN" not in console.export_text() and view.nan_origin == ()
    assert "behind" in row["2"] and "3 steps behind" in row["2"]
    assert row["▶"].split()[:2] == ["▶", "0"] and "live" in row["▶"]
    assert any(ln.strip() == "rank 3-7: other node" for ln in lines), lines
    pal = pane.ctx.palette
    assert status_style("nan", pal).color == pal.error.color
    assert status_style("crashed", pal).color == pal.error.color
    assert status_style("behind", pal).color == pal.warning.color
    assert status_style("live", pal).color == pal.success.color


def test_pane_marks_the_first_nan_rank_of_a_whole_job() -> None:
    job = Job("k", "ddp", "torchelastic", 3, 0, tuple(_info(r, 3) for r in (0, 1, 2)))
    states = {r: RankState() for r in (0, 1, 2)}
    for st in states.values():
        st.step, st.loss, st.grad_norm, st.step_times = 10, 0.5, 1.2, [1.0]
    states[1].loss, states[1].first = math.nan, {"loss": 7}
    states[2].loss, states[2].first = math.nan, {"loss": 8}
    view = build_view(job, states, dict.fromkeys((0, 1, 2), "live"))
    assert view.nan_origin == (1,)
    pane = RanksPane(PaneContext(RunState(FixtureSource(10).meta)))
    pane.view = view
    console = Console(width=120, file=io.StringIO(), record=True)
    console.print(pane.build())
    row = {ln.split()[0]: ln for ln in console.export_text().splitlines() if ln.strip()}
    assert "← first NaN" in row["1"] and "first NaN" not in row["2"]


def test_single_process_run_has_no_ranks_pane_or_rank_keys() -> None:
    app = NNWatchApp(FixtureSource(500), hardware=fixed_hardware, fps=10)

    async def main() -> None:
        async with app.run_test(size=(160, 48)) as pilot:
            await settle(pilot, app, 500)
            assert not list(app.dashboard.query(RanksPane))
            assert app.ranks is None
            assert app.check_action("next_rank", ()) is False
            await pilot.press("right_square_bracket")  # nothing happens, nothing breaks
            assert app.source.meta.rank == 0

    asyncio.run(main())


def test_ranks_pane_shows_both_ranks_and_brackets_switch_rank(
    tmp_path: Path, subprocess_env: dict[str, str]
) -> None:
    go = tmp_path / "go"
    proc = subprocess.Popen(
        [*TORCHRUN, *TRAINER, "--steps", "8", "--every", "4", "--hold-at", "5", "--go", str(go)],
        cwd=REPO, env=subprocess_env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )  # fmt: skip
    lines: list[str] = []
    try:
        _wait_for(proc, r"rank \d holding", 2, lines)
        rank0 = next(r for r in list_runs() if r.rank == 0)
        app = NNWatchApp(
            LiveSource.from_info(rank0), hardware=fixed_hardware, fps=10, ranks_interval=0.2
        )
        seen: dict[str, Any] = {}

        async def main() -> None:
            async with app.run_test(size=(160, 48)) as pilot:
                await settle(pilot, app)
                pane = app.dashboard.query_one(RanksPane)
                await wait_until(pilot, lambda: pane.view is not None and len(pane.view.rows) == 2)
                await pilot.pause()
                text = pane.text
                seen["pane"] = text
                rows = [
                    ln for ln in text.splitlines() if ln.strip() and ln.strip()[0] in "▶0123456789"
                ]
                assert len(rows) == 2, text
                assert rows[0].lstrip().startswith("▶ 0") and rows[1].lstrip().startswith("1")
                for row in rows:
                    assert "live" in row and rank0.host in row, text
                assert "RANK" in text and "GRAD NORM" in text and "STATUS" in text
                assert [r.step for r in pane.view.rows] == [4, 4]  # held at step 5: steps 0-4 done
                assert app.check_action("next_rank", ()) is True
                header = app.dashboard.query_one(RunHeader)
                assert "rank 0/2" in header._picture.plain

                await pilot.press("right_square_bracket")
                assert app.source.meta.rank == 1
                await settle(pilot, app)
                assert "rank 1/2" in header._picture.plain
                assert app.state.history.last_step == 4  # rank 1's own records
                await wait_until(pilot, lambda: "▶ 1" in pane.text)

                await pilot.press("left_square_bracket")
                assert app.source.meta.rank == 0
                await settle(pilot, app)
                assert "rank 0/2" in header._picture.plain
                await pilot.press("q")

        asyncio.run(main())
        assert app.return_value == 0
    finally:
        go.touch()
        try:
            out, _ = proc.communicate(timeout=60)
        except subprocess.TimeoutExpired:
            proc.kill()
            out, _ = proc.communicate()
        lines += out.splitlines()
    assert proc.returncode == 0, "\n".join(lines)


def _synthetic_job(env: dict[str, str], *extra: str) -> tuple[subprocess.Popen[str], list[str]]:
    """A 64-rank job on 8 simulated hosts (real rings and run logs, one process, no torch)."""
    import json

    proc = subprocess.Popen(
        [sys.executable, "-m", "nnwatch.testing.synthetic_job", "--ranks", "64", "--hosts", "8",
         "--rate", "10", "--seconds", "0", "--layers", "2", *extra],
        cwd=REPO, env=env, stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    assert proc.stdout is not None
    ready = json.loads(proc.stdout.readline())
    return proc, ready["run_dirs"]


def test_pane_of_a_64_rank_job_sorts_strips_and_opens_a_rank(
    subprocess_env: dict[str, str],
) -> None:
    from nnwatch.sources.job_monitor import JobMonitor
    from nnwatch.store.jobs import group_jobs, run_info_from_dir
    from nnwatch.tui.job_app import JobApp

    proc, dirs = _synthetic_job(subprocess_env, "--straggler", "37", "--loss-rank", "5")
    try:
        (job,) = group_jobs([run_info_from_dir(d) for d in dirs])
        assert job.world_size == 64 and len(job.runs) == 64
        monitor = JobMonitor(job)
        app = JobApp(monitor, interval=0.5)
        got: dict[str, Any] = {}

        async def main() -> None:
            async with app.run_test(size=(160, 48)) as pilot:
                pane = app.query_one(RanksPane)
                for _ in range(200):
                    await pilot.pause(0.1)
                    view = pane.view
                    if view is not None and {f.kind for f in view.findings} >= {"straggler", "loss_outlier"} and any(r.rank == 37 and r.status == "behind" for r in view.rows):
                        break
                got["text"], got["subtitle"] = pane.text, str(pane.border_subtitle)
                got["strip"] = pane.build().renderables[0]  # type: ignore[union-attr]
                await pilot.press("s")  # worst first -> by rank
                got["sorted"] = str(pane.border_subtitle)
                await pilot.press("down", "down", "enter")  # the third rank by rank: rank 2
        asyncio.run(main())
        monitor.close()
    finally:
        proc.terminate()
        proc.wait(timeout=60)
    text = got["text"]
    assert "64/64 ranks" in got["subtitle"] and "sort: worst" in got["subtitle"]
    assert "sort: rank" in got["sorted"]
    assert app.return_value == 2  # Enter opened rank 2 (the app hands it to the dashboard)
    # the heat strip: one cell per rank, the straggler's in the error colour
    strip = got["strip"]
    assert strip.plain.startswith("step time by rank") and strip.plain.count("█") == 64
    pal = app.ctx.palette
    cells = [s for s in strip.spans if s.end - s.start == 1]
    red = [s.start - len(strip.plain) + 64 for s in cells if s.style == pal.error]
    assert red == [37], red
    assert "rank 37 on node04 takes 200 ms a step" in text, text
    assert "rank 5: loss far from the job's median" in text
    assert re.search(r"rows 1-\d+ of 64 \(sorted by worst", text), text
    first_row = next(ln for ln in text.splitlines() if re.match(r"^\s+\d+\s+node", ln))
    assert first_row.split()[0] == "37", text  # worst first: the rank furthest behind leads


def test_the_dashboards_ranks_pane_grows_to_show_the_rows_that_came_later() -> None:
    """The pane's height follows its rows: one sized while it looked for the other ranks stayed a
    line high in the dashboard when they came, the story's rows hidden (seen in `open JOB`)."""
    job = Job("k", "ddp (4/4 ranks here)", "torchelastic", 4, 0, tuple(_info(r, 4) for r in range(4)))
    states = {r: RankState() for r in range(4)}
    for st in states.values():
        st.step = 5
    view = build_view(job, states, dict.fromkeys(range(4), "live"))
    polls: list[int] = []

    def views() -> Any:
        polls.append(1)
        return view if len(polls) > 2 else None  # the rows come after a few polls

    source = FixtureSource(50)
    source.meta.world_size, source.meta.rank = 4, 0
    app = NNWatchApp(source, hardware=fixed_hardware, fps=10, job_views=views)

    async def main() -> int:
        async with app.run_test(size=(160, 48)) as pilot:
            pane = app.query_one(RanksPane)
            await wait_until(pilot, lambda: pane.view is not None, timeout=30)
            await wait_until(pilot, lambda: pane.size.height >= 4 + 2, timeout=30)
            return pane.size.height

    assert asyncio.run(main()) >= 6
