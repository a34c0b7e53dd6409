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
from nnwatch.sources.fixture import FixtureSource, write_run
from nnwatch.sources.live import LiveSource
from nnwatch.sources.recorded import RecordedSource
from nnwatch.tui.picker import EMPTY_HELP, RunPickerApp, default_lister
from nnwatch.tui.testing import wait_until

REPO = Path(__file__).resolve().parent.parent


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
        [sys.executable, "-m", "nnwatch.channel.synthetic", "--steps", "0", "--rate", "50", "--name", "live-one"],
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
