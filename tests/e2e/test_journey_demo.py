"""The README's main command, as a user lives it, in a real terminal (tmux).

``nnwatch demo exploding`` starts a trainer whose gradients explode; the user reads the screen,
presses ``c``, enters 1.0 and confirms; the grad-norm pane then shows the threshold line, and the
run's own records show every later step clipped at 1.0 with a loss that came back down. ``q`` ends
it all: the command exits 0, the trainer process is gone and no run file is left.

Skipped only when tmux is missing. Missing nnwatch pieces (TUI, channel) fail it, so we notice.
"""

from __future__ import annotations

import math
import os
import re
import shutil
import signal
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import numpy as np
import psutil
import pytest

import nnwatch
from nnwatch.store.identity import same_process
from nnwatch.store.registry import list_runs
from tests.terminal import Terminal

REPO = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.skipif(
    shutil.which("tmux") is None, reason="needs tmux (scripts/system-deps.sh)"
)


@pytest.fixture
def terminal(run_root: Path, tmp_path: Path) -> Iterator[Callable[[str], Terminal]]:
    env = {
        "NNWATCH_RUN_DIR": str(run_root),
        "PYTHONPATH": str(REPO),
        "PYTHONUNBUFFERED": "1",
        "OMP_NUM_THREADS": "1",
        "TERM": "xterm-256color",
        "PATH": os.environ.get("PATH", ""),
        "HOME": os.environ.get("HOME", "/tmp"),
    }
    made: list[Terminal] = []

    def start(command: str) -> Terminal:
        made.append(Terminal(command, env, status_file=tmp_path / f"status-{len(made)}"))
        return made[-1]

    yield start
    for t in made:
        t.close()
    for info in list_runs(run_root):  # only after a failure: a trainer this test started
        if same_process(info.pid, info.start_time):
            os.kill(info.pid, signal.SIGKILL)


def wait_records(run_dir: str, until_step: int, timeout: float = 90.0) -> np.ndarray:
    """The run's scalar records, once its log holds ``until_step``."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        rows = np.array(nnwatch.load_run(run_dir).scalars)
        if len(rows) and rows["step"][-1] >= until_step:
            return rows
        time.sleep(0.3)
    raise AssertionError(f"the run did not reach step {until_step} within {timeout:.0f} s")


def test_fix_an_exploding_run_with_the_clip_key(
    terminal: Callable[[str], Terminal], run_root: Path
) -> None:
    term = terminal(f"{sys.executable} -m nnwatch demo exploding")
    screen = term.wait_for(
        lambda s: "LIVE" in s and "Grad norm" in s, "the live dashboard", timeout=120
    )
    assert "exploding" in screen and "max 1.00" not in screen  # no threshold line yet
    runs = list_runs(run_root)
    assert len(runs) == 1, runs
    trainer = runs[0]

    # the user reads the diagnosis on screen, then clips
    term.wait_for(
        lambda s: "exploding gradients" in s, "the exploding_gradients finding", timeout=120
    )
    term.keys("c")
    term.wait_for(lambda s: "Set the gradient clip threshold" in s, "the clip dialog")
    term.keys("1", ".", "0", "Enter")
    term.wait_for(lambda s: "Clip gradients of" in s, "the confirmation")
    term.keys("y")
    screen = term.wait_for(
        lambda s: re.search(r"clip 1 applies at step \d+", s) is not None, "the applied clip"
    )
    applied = int(re.search(r"clip 1 applies at step (\d+)", screen).group(1))  # type: ignore[union-attr]

    # the screen: the grad-norm pane now draws the threshold line and the clipped norm
    term.wait_for(
        lambda s: "max 1.00" in s and "clipped" in s, "the threshold line in the grad-norm pane"
    )

    # the records: before the clip none, from it on every step clipped at 1.0, and the loss recovers
    rows = wait_records(trainer.run_dir, applied + 80)
    before, after = rows[rows["step"] < applied], rows[rows["step"] >= applied]
    assert np.isnan(before["clip_threshold"]).all()
    assert (after["clip_threshold"] == 1.0).all()
    assert (after["grad_norm_clipped"] <= 1.0 + 1e-4).all()
    assert (after["clipped"] == 1.0).any()
    assert not np.isfinite(before["loss"]).all() or before["grad_norm"].max() > 10  # it did explode
    late = after["loss"][-30:]
    assert np.isfinite(late).all() and float(np.median(late)) < 0.7 * float(before["loss"][0])
    assert math.isfinite(float(after["grad_norm"][-1]))

    # q: the command exits cleanly, the trainer is gone, and so are its files
    term.keys("q")
    assert term.exit_status() == 0
    deadline = time.monotonic() + 15
    while same_process(trainer.pid, trainer.start_time) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not same_process(trainer.pid, trainer.start_time), "the trainer outlived the monitor"
    # the run is kept exactly when a snapshot was taken while we watched (the demo takes them
    # on grad-norm spikes), and nothing else is left behind
    kept = list((Path(trainer.run_dir) / "snapshots").glob("step-*"))
    assert Path(trainer.run_dir).exists() == bool(kept)
    assert [p for sub in ("registry", "s") for p in (run_root / sub).glob("*")] == []


def test_closing_the_terminal_stops_the_trainer_and_cleans_up(
    terminal: Callable[[str], Terminal], run_root: Path
) -> None:
    """A closed terminal (SIGHUP) mid-run must not leave the trainer training, nor files, nor a
    monitor process spinning on a terminal that no longer exists."""
    term = terminal(f"{sys.executable} -m nnwatch demo exploding")
    term.wait_for(lambda s: "LIVE" in s and "Grad norm" in s, "the live dashboard", timeout=120)
    (trainer,) = list_runs(run_root)
    monitor = psutil.Process(term.command_pid())
    term.close()  # kills the tmux server: the pane's processes get SIGHUP
    psutil.wait_procs([monitor], timeout=30)
    assert not monitor.is_running() or monitor.status() == psutil.STATUS_ZOMBIE
    deadline = time.monotonic() + 15
    while same_process(trainer.pid, trainer.start_time) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not same_process(trainer.pid, trainer.start_time), "the trainer outlived the terminal"
    assert [p for sub in ("runs", "registry", "s") for p in (run_root / sub).glob("*")] == []
