"""The README's commands in a real terminal: tmux runs them, capture-pane reads the screen.

This is the user's journey end to end, through the real CLI, the real terminal driver and real
key presses: ``nnwatch demo exploding`` (what ``make demo`` runs), then ``nnwatch open`` on a
finished run.
"""

from __future__ import annotations

import os
import shlex
import shutil
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from nnwatch.testing.fixture import FixtureSource, write_run
from tests.terminal import Terminal

REPO = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.skipif(
    shutil.which("tmux") is None, reason="needs tmux (scripts/system-deps.sh)"
)


@pytest.fixture
def env(run_root: Path) -> dict[str, str]:
    return {
        "NNWATCH_RUN_DIR": str(run_root),
        "PYTHONPATH": str(REPO),
        "PYTHONUNBUFFERED": "1",
        "OMP_NUM_THREADS": "1",
        "TERM": "xterm-256color",
        "PATH": os.environ.get("PATH", ""),
        "HOME": os.environ.get("HOME", "/tmp"),
    }


@pytest.fixture
def tmux_factory() -> Iterator[Callable[..., Terminal]]:
    made: list[Terminal] = []

    def make(command: str, env: dict[str, str], size: tuple[int, int] = (160, 48)) -> Terminal:
        t = Terminal(command, env, size=size)
        made.append(t)
        return t

    yield make
    for t in made:
        t.close()


def test_make_demo_command_in_a_real_terminal(
    env: dict[str, str], tmux_factory: Callable[..., Terminal]
) -> None:
    term = tmux_factory(f"{sys.executable} -m nnwatch demo exploding", env)
    screen = term.wait_for("LIVE", timeout=120)
    assert "exploding" in screen and "Loss" in screen and "Grad norm" in screen
    term.wait_for(lambda s: "step" in s and "steps/s" in s)
    term.keys("z")
    term.wait_for("last 500")
    term.keys("c")
    term.wait_for("Set the gradient clip threshold")
    term.keys("1", ".", "0", "Enter")
    term.wait_for("Clip gradients of")
    term.keys("y")
    screen = term.wait_for("clip 1 applies at step", timeout=60)
    assert "LIVE" in screen
    term.keys("q")
    assert term.exit_status() == 0


def test_open_a_finished_run_and_scrub_it(
    env: dict[str, str], tmux_factory: Callable[..., Terminal], tmp_path: Path
) -> None:
    run_dir = write_run(FixtureSource(3000), tmp_path / "finished-run")
    term = tmux_factory(
        f"{sys.executable} -m nnwatch open {shlex.quote(str(run_dir))}", env, (80, 24)
    )
    screen = term.wait_for("FINISHED")
    assert "2,999" in screen and "fixture-mlp" in screen
    term.keys("Home")
    screen = term.wait_for("cursor 0")
    assert "@ step 0" in screen
    term.keys("Right", "Right", "Right")
    term.wait_for(lambda s: "cursor 0" not in s and "cursor" in s)
    term.keys("e")
    term.wait_for("Enter: go to the step")
    term.keys("Escape", "q")
    assert term.exit_status() == 0


def test_commands_explain_bad_input_in_words(env: dict[str, str], tmp_path: Path) -> None:
    run = lambda *a: subprocess.run(  # noqa: E731
        [sys.executable, "-m", "nnwatch", *a], env=env, capture_output=True, text=True, timeout=120
    )
    picker = run()  # `nnwatch` alone opens the picker, which needs a terminal
    assert picker.returncode == 1 and "needs a terminal" in picker.stderr
    missing = run("open", str(tmp_path / "nope"))
    assert missing.returncode == 1 and "nnwatch ls --all" in missing.stderr
    assert "Traceback" not in missing.stderr
    unknown = run("attach", "no-such-run")
    assert unknown.returncode == 1 and "no registered run matches" in unknown.stderr
    run_dir = write_run(FixtureSource(100), tmp_path / "r")
    not_tty = run("open", str(run_dir))
    assert not_tty.returncode == 1 and "needs a terminal" in not_tty.stderr
    bad_keys = subprocess.run(
        [sys.executable, "-m", "nnwatch", "open", str(run_dir), "--keys", "zoomZ"],
        env={**env, "NNWATCH_FORCE_TUI": "1"}, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert bad_keys.returncode == 2 and "id=key" in bad_keys.stderr
