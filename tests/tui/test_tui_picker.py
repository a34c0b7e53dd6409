"""``nnwatch`` with no arguments: the run picker, over the real registry and real run directories."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from nnwatch.cli.pick import source_for
from nnwatch.sources.live import LiveSource
from nnwatch.sources.recorded import RecordedSource
from nnwatch.testing.fixture import FixtureSource, write_run
from nnwatch.testing.tui import wait_until
from nnwatch.tui.picker import EMPTY_HELP, RunPickerApp, default_lister

REPO = Path(__file__).resolve().parents[2]


def pick(app: RunPickerApp, *keys: str, expect_rows: int) -> Any:
    async def main() -> None:
        async with app.run_test(size=(160, 30)) as pilot:
            await wait_until(pilot, lambda: len(app.runs) >= expect_rows, timeout=30)
            await pilot.press(*keys)
            await pilot.pause()

    asyncio.run(main())
    return app.return_value


def test_picker_lists_live_and_finished_runs_and_enter_opens_one(
    run_root: Path, subprocess_env: dict[str, str]
) -> None:
    finished = write_run(FixtureSource(500), run_root / "runs" / "finished-run")
    trainer = subprocess.Popen(
        [sys.executable, "-m", "nnwatch.testing.synthetic", "--steps", "0", "--rate", "50", "--name", "live-one"],
        env=subprocess_env, stdout=subprocess.PIPE, text=True, cwd=REPO,
    )  # fmt: skip
    try:
        assert trainer.stdout is not None
        json.loads(trainer.stdout.readline())  # ready
        deadline = time.monotonic() + 30
        while not any(r.live for r in default_lister()):
            assert time.monotonic() < deadline, "the synthetic run never showed as live"
            time.sleep(0.1)
        runs = default_lister()
        assert [r.live for r in runs] == [True, False]  # live first
        assert runs[1].state == "finished" and Path(runs[1].run_dir) == finished

        chosen = pick(RunPickerApp(), "enter", expect_rows=2)
        assert chosen is not None and chosen.name == "live-one"
        source, _ = source_for(chosen)
        assert isinstance(source, LiveSource) and source.can_command
        source.close()

        chosen = pick(RunPickerApp(), "down", "enter", expect_rows=2)
        assert chosen is not None and Path(chosen.run_dir) == finished
        source, _ = source_for(chosen)
        assert isinstance(source, RecordedSource) and source.poll().status.state == "finished"
    finally:
        trainer.kill()
        trainer.wait()


def test_picker_says_what_to_do_when_there_are_no_runs_and_q_quits() -> None:
    app = RunPickerApp()

    async def main() -> None:
        async with app.run_test(size=(100, 20)) as pilot:
            await wait_until(pilot, lambda: "No runs" in str(app.query_one("#hint").render()), 30)
            await pilot.press("q")

    asyncio.run(main())
    assert app.return_value is None
    assert "nnwatch.watch" in EMPTY_HELP


def test_picker_survives_a_failing_lister() -> None:
    def broken() -> list[Any]:
        raise OSError("registry unreadable")

    app = RunPickerApp(lister=broken)

    async def main() -> None:
        async with app.run_test(size=(100, 20)) as pilot:
            await wait_until(
                pilot, lambda: "registry unreadable" in str(app.query_one("#hint").render()), 30
            )

    asyncio.run(main())


def test_picker_lists_finished_and_crashed_runs_with_their_findings_and_ls_counts_them(
    run_root: Path, subprocess_env: dict[str, str], capsys: Any
) -> None:
    from nnwatch.cli import main as cli_main
    from nnwatch.tui.model import is_finding

    finished = write_run(FixtureSource(500), run_root / "runs" / "finished-run")
    also = write_run(FixtureSource(300, seed=2, name="second"), run_root / "runs" / "second")
    expected = sum(map(is_finding, FixtureSource(500).events()))
    # no live run: `ls` says what `--all` would add instead of an empty table
    assert cli_main(["ls"]) == 0
    out = capsys.readouterr().out
    assert "`nnwatch ls --all` would add 2 finished or crashed runs" in out

    crasher = subprocess.run(  # a real trainer killed by SIGKILL mid-run: its entry stays
        [sys.executable, "-m", "nnwatch.testing.synthetic", "--steps", "0", "--rate", "200", "--name", "killed", "--crash-after", "40"],
        env=subprocess_env, capture_output=True, text=True, cwd=REPO, timeout=120,
    )  # fmt: skip
    assert crasher.returncode == -9
    assert cli_main(["ls"]) == 0
    out = capsys.readouterr().out
    assert "crashed" in out and "(--all would add 2 finished or crashed runs)" in out
    assert cli_main(["ls", "--all"]) == 0
    assert "would add" not in capsys.readouterr().out

    app = RunPickerApp()

    async def main() -> None:
        async with app.run_test(size=(160, 30)) as pilot:
            await wait_until(pilot, lambda: len(app.runs) == 3, timeout=30)
            table = app.query_one("#runs")
            states = {r.name: r.state for r in app.runs}
            assert states["killed"] == "crashed"
            assert app.findings[str(finished)] == expected > 0
            row = [
                str(c)
                for c in table.get_row_at(  # type: ignore[attr-defined]
                    [Path(r.run_dir) for r in app.runs].index(finished)
                )
            ]
            assert row[1] == "finished" and row[2] == str(expected)
            assert str(also) in app.findings
            assert "1 live" not in str(app.query_one("#hint").render())

    asyncio.run(main())
