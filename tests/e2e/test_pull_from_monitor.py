"""The monitor's own pull, through a real sshd on 127.0.0.1: attached to a run on another host,
a snapshot taken with ``s`` is named with its host, ``P`` copies it here byte for byte (checked),
``i`` opens the local copy in the inspector, and ``i`` on a snapshot not yet here pulls it first;
a run on this machine has nothing to pull."""

from __future__ import annotations

import asyncio
import getpass
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from nnwatch.sources.recorded import RecordedSource
from nnwatch.sources.remote import RemoteSource
from nnwatch.store.registry import find_runs
from nnwatch.testing.tui import fixed_hardware, settle, wait_until
from nnwatch.tui.app import NNWatchApp
from nnwatch.tui.screens.snapshot import SnapshotScreen
from tests.e2e.test_pull_ssh import files_of, train
from tests.e2e.test_remote_ssh import remote  # noqa: F401 - fixture
from tests.e2e.test_ssh_forward import Tunnel, pytestmark, tunnel  # noqa: F401 - fixture, skip mark
from tests.integration.test_channel_faults import wait_for

REPO = Path(__file__).resolve().parents[2]
HOST = f"{getpass.getuser()}@127.0.0.1"


def notes(app: NNWatchApp) -> list[str]:
    return [str(n.message) for n in app._notifications]


def test_p_copies_a_remote_snapshot_here_and_i_opens_the_copy(
    remote: dict[str, object],  # noqa: F811
    subprocess_env: dict[str, str],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.chdir(tmp_path)  # pulled files land under the working directory
    proc = subprocess.Popen(
        [sys.executable, "-m", "tests.trainers.mlp_trainer", "--steps", "100000",
         "--delay", "0.01", "--name", "far-monitor"],
        stdout=subprocess.PIPE, text=True, env=subprocess_env, cwd=REPO,
    )  # fmt: skip
    try:
        assert proc.stdout is not None
        run_dir = Path(proc.stdout.readline().split(" ", 1)[1].strip())
        wait_for(lambda: next(iter(find_runs("far-monitor")), None), timeout=60)
        source = RemoteSource(HOST, "far-monitor", **remote)  # type: ignore[arg-type]
        app = NNWatchApp(source, hardware=fixed_hardware, fps=10)
        snaps = run_dir / "snapshots"

        async def main() -> None:
            async with app.run_test(size=(160, 50)) as pilot:
                await settle(pilot, app)
                await pilot.press("s")
                await wait_until(pilot, lambda: bool(app.navigation.snapshot_events()), 60)
                event = app.navigation.snapshot_events()[-1]
                far = str(event["path"])
                assert far.startswith(str(snaps))
                await wait_until(pilot, lambda: any(f"127.0.0.1:{far}" in n for n in notes(app)))
                time.sleep(0.5)  # record.json follows its snapshot once the step is published
                await pilot.press("P")
                local = (
                    tmp_path / "nnwatch-pulled" / "127.0.0.1" / run_dir.name / "snapshots"
                    / Path(far).name
                )  # fmt: skip
                await wait_until(pilot, lambda: any("pulled" in n for n in notes(app)) or any(
                    "failed" in n for n in notes(app)), 60)  # fmt: skip
                assert (local / "manifest.json").is_file(), notes(app)
                assert files_of(local) == files_of(Path(far))
                assert any(f"is now at {local}" in n for n in notes(app))
                await pilot.press("i")  # the copy, not a second pull
                await wait_until(pilot, lambda: isinstance(app.screen, SnapshotScreen), 30)
                screen = app.screen
                assert isinstance(screen, SnapshotScreen)
                await wait_until(pilot, lambda: screen.report is not None or bool(screen.error), 60)
                assert not screen.error, screen.error
                assert screen.path == local
                await pilot.press("escape")
                # a snapshot that is not on this machine under its path: ``i`` pulls, then opens
                await pilot.press("s")
                await wait_until(pilot, lambda: len(app.navigation.snapshot_events()) == 2, 60)
                second = Path(str(app.navigation.snapshot_events()[-1]["path"]))
                await wait_until(pilot, lambda: (second / "manifest.json").is_file(), 30)
                time.sleep(0.5)
                second.rename(second.with_name(second.name + ".1"))  # pack finds it by its step
                await pilot.press("i")
                await wait_until(pilot, lambda: isinstance(app.screen, SnapshotScreen), 60)
                screen = app.screen
                assert isinstance(screen, SnapshotScreen)
                assert screen.path.is_relative_to(tmp_path / "nnwatch-pulled"), screen.path
                await wait_until(pilot, lambda: screen.report is not None or bool(screen.error), 60)
                assert not screen.error, screen.error

        asyncio.run(main())
        source.close()
        assert proc.poll() is None  # the trainer went on
    finally:
        proc.kill()
        proc.wait(timeout=10)


def test_a_run_on_this_machine_offers_no_pull(run_root: Path) -> None:
    """Its snapshots are here already: no pull key in the footer, and ``i`` reads them in place."""
    run_dir = train("here-snap")
    app = NNWatchApp(RecordedSource(run_dir), hardware=fixed_hardware, fps=10)

    async def main() -> None:
        async with app.run_test(size=(160, 50)) as pilot:
            await settle(pilot, app)
            assert app.check_action("pull_snapshot", ()) is False
            assert app.check_action("inspect_snapshot", ()) is True
            await pilot.press("i")
            await wait_until(pilot, lambda: isinstance(app.screen, SnapshotScreen), 30)
            screen: Any = app.screen
            assert Path(screen.path).is_relative_to(run_dir)

    asyncio.run(main())
