"""The keys that steer training, pressed in the dashboard against a real training subprocess.

A real PyTorch loop (``tests.trainers.mlp_trainer``) runs with the probe; the app follows it
through the real registry, ring, run log and command socket, and the test checks the effect where
it lands: a snapshot directory on disk, a step counter that stops, a clip threshold in the
records, a trainer that dies while the monitor keeps its history.
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from textual.pilot import Pilot

from nnwatch.sources.live import LiveSource
from nnwatch.testing.tui import fixed_hardware, settle, wait_until
from nnwatch.tui.app import NNWatchApp
from nnwatch.tui.screens.dialogs import ClipScreen, ConfirmScreen
from nnwatch.tui.widgets.header import RunHeader

REPO = Path(__file__).resolve().parents[2]
Body = Callable[[Pilot[Any], NNWatchApp, subprocess.Popen[str]], Awaitable[None]]


@pytest.fixture
def trainer(
    subprocess_env: dict[str, str], tmp_path: Path
) -> Iterator[tuple[subprocess.Popen[str], Path]]:
    err = open(tmp_path / "trainer.stderr", "w+")  # noqa: SIM115 - closed below
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "tests.trainers.mlp_trainer",
            "--steps",
            "1000000",
            "--delay",
            "0.01",
        ],
        cwd=REPO,
        env=subprocess_env,
        stdout=subprocess.PIPE,
        stderr=err,
        text=True,
    )
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        if not line.startswith("run_dir "):
            proc.wait(timeout=30)
            err.seek(0)
            pytest.fail(f"the trainer did not start: {line!r}\n{err.read()[-2000:]}")
        # keep draining its "step N" lines so the pipe never fills and blocks it
        import threading

        threading.Thread(target=lambda: [None for _ in proc.stdout], daemon=True).start()  # type: ignore[union-attr]
        yield proc, Path(line.split(maxsplit=1)[1].strip())
    finally:
        proc.kill()
        proc.wait(timeout=30)
        err.close()


def follow(run_dir: Path, body: Body, proc: subprocess.Popen[str]) -> NNWatchApp:
    import time

    deadline = time.monotonic() + 60
    while True:  # the registry entry appears with the first step
        try:
            source = LiveSource.find(str(run_dir))
            if source.socket_path is not None:
                break
            source.close()
        except Exception:  # noqa: BLE001 - not registered yet
            pass
        assert time.monotonic() < deadline, "the trainer never registered"
        time.sleep(0.1)
    app = NNWatchApp(source, hardware=fixed_hardware)  # default fps: the monitor as users run it

    async def main() -> None:
        async with app.run_test(size=(160, 48)) as pilot:
            await settle(pilot, app, rows=5, timeout=60)
            await body(pilot, app, proc)

    asyncio.run(main())
    return app


async def press_s_snapshot(pilot: Pilot[Any], app: NNWatchApp, run_dir: Path) -> None:
    snaps = run_dir / "snapshots"
    assert not snaps.exists()
    await pilot.press("s")
    await wait_until(pilot, lambda: any(o.startswith("snapshot") for o in app.outcomes), timeout=30)
    assert app.outcomes[-1].startswith("snapshot at step"), app.outcomes
    await wait_until(pilot, lambda: any(e.get("type") == "snapshot" for e in app.state.events), 60)
    written = [e for e in app.state.events if e.get("type") == "snapshot"]
    assert Path(written[-1]["path"]).is_dir()
    assert (Path(written[-1]["path"]) / "manifest.json").is_file()


async def press_c_clip(pilot: Pilot[Any], app: NNWatchApp) -> int:
    await pilot.press("c")
    assert isinstance(app.screen, ClipScreen)
    assert app.screen.query_one("#clip-value").value == ""  # the script set no clip yet
    await pilot.press("x", "enter")  # not a number: refused in words
    assert isinstance(app.screen, ClipScreen)
    assert "positive number" in str(app.screen.query_one("#clip-error").render())
    await pilot.press("backspace", *"0.25", "enter")
    assert isinstance(app.screen, ConfirmScreen)
    await pilot.press("y")
    await wait_until(pilot, lambda: any("clip" in o for o in app.outcomes), timeout=30)
    outcome = app.outcomes[-1]
    assert outcome.startswith("clip 0.25 applies at step"), outcome
    at = int(outcome.rsplit(" ", 1)[1].replace(",", ""))
    await wait_until(pilot, lambda: app.state.history.last_step >= at + 3, timeout=30)
    steps = app.state.history.tail("step")
    clip = app.state.history.tail("clip_threshold")
    assert np.all(clip[steps >= at] == 0.25)
    assert np.all(np.isnan(clip[steps < at]))  # the script clipped with max_norm=None before
    return at


async def press_a_anomaly(pilot: Pilot[Any], app: NNWatchApp) -> None:
    await pilot.press("a")
    await wait_until(pilot, lambda: any(o.startswith("anomaly") for o in app.outcomes), timeout=30)
    assert app.outcomes[-1].startswith("anomaly mode armed for the next step (at step")
    await wait_until(
        pilot, lambda: any(e.get("command") == "anomaly" for e in app.state.events), timeout=30
    )


def test_s_c_and_a_steer_the_trainer(trainer: tuple[subprocess.Popen[str], Path]) -> None:
    proc, run_dir = trainer
    clip_from: list[int] = []

    async def body(pilot: Pilot[Any], app: NNWatchApp, proc: subprocess.Popen[str]) -> None:
        await press_s_snapshot(pilot, app, run_dir)
        clip_from.append(await press_c_clip(pilot, app))
        await press_a_anomaly(pilot, app)

    follow(run_dir, body, proc)
    from nnwatch.store.run_reader import load_run

    run = load_run(run_dir)  # the durable log agrees on the new clip threshold
    steps, clip = run["step"], run["clip_threshold"]
    later = steps >= clip_from[0]
    assert later.any() and np.all(clip[later] == 0.25)


def test_p_pauses_the_step_counter_and_a_killed_trainer_shows_crashed(
    trainer: tuple[subprocess.Popen[str], Path],
) -> None:
    proc, run_dir = trainer

    async def body(pilot: Pilot[Any], app: NNWatchApp, proc: subprocess.Popen[str]) -> None:
        await pilot.press("p")
        assert isinstance(app.screen, ConfirmScreen)
        await pilot.press("n")  # refused: nothing sent
        assert app.outcomes == ["pause cancelled"]
        await pilot.press("p")
        await pilot.press("y")
        await wait_until(pilot, lambda: app.state.status.state == "paused", timeout=30)
        assert app.outcomes[-1].startswith("paused at step")
        await pilot.pause(0.5)
        held = app.state.history.last_step
        await pilot.pause(1.5)
        assert app.state.history.last_step == held  # the counter stopped
        await settle(pilot, app)
        assert "PAUSED" in app.query_one(RunHeader)._picture.plain
        await pilot.press("p")
        assert "Resume" in str(app.screen.query_one(".title").render())
        await pilot.press("y")
        await wait_until(pilot, lambda: app.state.history.last_step > held + 5, timeout=30)
        assert app.outcomes[-1].startswith("resumed at step")

        rows = app.state.history.rows
        proc.kill()
        await wait_until(pilot, lambda: app.state.status.state in ("crashed", "lost"), timeout=60)
        await settle(pilot, app)
        header = app.query_one(RunHeader)._picture.plain
        assert "CRASHED" in header or "LOST" in header
        assert app.state.history.rows >= rows  # the history stays on screen
        await pilot.press("s")  # steering a dead run: a clear answer, not a hang or a crash
        await wait_until(pilot, lambda: len(app.outcomes) >= 4, timeout=30)
        assert "not live" in app.outcomes[-1] or "failed" in app.outcomes[-1]

    follow(run_dir, body, proc)


def test_live_tests_do_not_leak_runs_outside_the_test_root(run_root: Path) -> None:
    assert os.environ["NNWATCH_RUN_DIR"] == str(run_root)
