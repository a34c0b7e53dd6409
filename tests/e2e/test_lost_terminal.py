"""A dashboard whose terminal went away without a hangup ends (issue 42, item 5), and the pause
it held lifts with it.

The dashboard runs in tmux with SIGHUP ignored (as under ``nohup``); it pauses the run, then the
tmux server is killed outright, which deletes the pty. Before, such a dashboard kept running on
the deleted pty at a fifth of a core, and its command connection would have renewed the pause
for ever; now it sees that its terminal is gone, closes its source and exits.
"""

from __future__ import annotations

import os
import signal
import sys
from pathlib import Path

import psutil
import pytest

from nnwatch.store.ring_reader import RingReader
from tests.integration.test_channel_faults import Trainer, wait_for
from tests.terminal import Terminal

REPO = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.skipif(
    not any(os.access(os.path.join(d, "tmux"), os.X_OK) for d in os.environ["PATH"].split(":")),
    reason="tmux is not installed; run scripts/system-deps.sh",
)


def _status(trainer: Trainer) -> str:
    with RingReader(trainer.ring) as r:
        return str(r.state().status)


def test_a_dashboard_on_a_terminal_gone_without_a_hangup_exits_and_lifts_its_pause(
    subprocess_env: dict[str, str],
) -> None:
    trainer = Trainer(subprocess_env, "--steps", "0", "--rate", "20", "--name", "lost-term")
    env = {**subprocess_env, "PYTHONPATH": str(REPO)}
    term = Terminal(f"trap '' HUP; exec {sys.executable} -m nnwatch attach lost-term --no-nvml", env)
    try:
        term.wait_for("lost-term", timeout=120)
        monitor = psutil.Process(int(term.tmux("display-message", "-p", "-t", "t", "#{pane_pid}")))
        assert "nnwatch" in " ".join(monitor.cmdline()), monitor.cmdline()
        term.keys("p")
        term.wait_for("Pause training", timeout=30)
        term.keys("y")
        term.wait_for("PAUSED", timeout=60)
        wait_for(lambda: _status(trainer) == "paused", timeout=60)

        server = int(term.tmux("display-message", "-p", "#{pid}"))
        os.kill(server, signal.SIGKILL)  # the terminal vanishes; SIGHUP is ignored
        wait_for(lambda: not monitor.is_running() or monitor.status() == psutil.STATUS_ZOMBIE,
                 timeout=90)  # fmt: skip
        before = trainer.published()
        wait_for(lambda: trainer.published() > before + 10, timeout=90)  # the pause lifted
        assert _status(trainer) == "running"
    finally:
        term.close()
        trainer.kill()
