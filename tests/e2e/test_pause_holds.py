"""A pause holds until the person lifts it, through a real sshd on 127.0.0.1 (issue 42, item 4).

The run's lease is 30 s: its holder must renew it, and nnwatch's holders do so by themselves
(:mod:`nnwatch.channel.pause`). Each part holds the pause for 90 s, three leases, and checks
every second that the trainer has not moved:

- the dashboard over ssh (``nnwatch attach HOST:RUN`` in tmux): ``p``, ``y``; then ``p``, ``y``
  resumes it;
- ``nnwatch ctl HOST:RUN pause`` (the socket forwarded by ssh for as long as it runs): it holds
  until Ctrl-C, then resumes the run and says so.
"""

from __future__ import annotations

import getpass
import shlex
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from nnwatch.store.ring_reader import RingReader
from tests.e2e.test_remote_ssh import remote  # noqa: F401 - fixture
from tests.e2e.test_ssh_forward import pytestmark, tunnel  # noqa: F401 - fixture, skip mark
from tests.integration.test_channel_faults import Trainer, wait_for
from tests.terminal import Terminal

pytestmark = [pytestmark, pytest.mark.slow]  # type: ignore[list-item]
REPO = Path(__file__).resolve().parents[2]
HOLD_S = 90.0


def _status(trainer: Trainer) -> str:
    with RingReader(trainer.ring) as r:
        return str(r.state().status)


def _holds(trainer: Trainer, seconds: float) -> None:
    """The trainer stays paused for ``seconds``: no step is published and the ring says so."""
    wait_for(lambda: _status(trainer) == "paused", timeout=60)
    held = trainer.published()
    start = time.monotonic()
    while time.monotonic() - start < seconds:
        time.sleep(1.0)
        assert trainer.proc.poll() is None, "the trainer died"
        now = trainer.published()
        assert now == held and _status(trainer) == "paused", (
            f"the pause lapsed after {time.monotonic() - start:.0f} s: {now - held} steps since"
        )


def _ssh_words(remote: dict[str, object]) -> str:  # noqa: F811
    ssh = " ".join(shlex.quote(f"--ssh-arg={x}") for x in remote["ssh_args"])  # type: ignore[attr-defined]
    return f"{ssh} --remote-nnwatch {shlex.quote(str(remote['remote_nnwatch']))}"


def test_a_pause_from_the_dashboard_over_ssh_holds_until_lifted(
    remote: dict[str, object],  # noqa: F811
    subprocess_env: dict[str, str],
) -> None:
    trainer = Trainer(subprocess_env, "--steps", "0", "--rate", "20", "--name", "held-dash")
    host = f"{getpass.getuser()}@127.0.0.1"
    env = {**subprocess_env, "PYTHONPATH": str(REPO)}
    term = Terminal(
        f"{sys.executable} -m nnwatch attach {host}:held-dash {_ssh_words(remote)} --no-nvml", env
    )
    try:
        term.wait_for("held-dash", timeout=120)
        wait_for(lambda: trainer.published() > 20, timeout=60)
        term.keys("p")
        term.wait_for("Pause training", timeout=30)
        term.keys("y")
        term.wait_for("PAUSED", timeout=60)
        _holds(trainer, HOLD_S)
        term.keys("p")
        term.wait_for("Resume training", timeout=30)
        term.keys("y")
        before = trainer.published()
        wait_for(lambda: trainer.published() > before + 10, timeout=60)
        term.keys("q")
        assert term.exit_status() == 0
    finally:
        term.close()
        trainer.kill()


def test_ctl_pause_over_ssh_holds_until_ctrl_c(
    remote: dict[str, object],  # noqa: F811
    subprocess_env: dict[str, str],
) -> None:
    trainer = Trainer(subprocess_env, "--steps", "0", "--rate", "20", "--name", "held-ctl")
    host = f"{getpass.getuser()}@127.0.0.1"
    env = {**subprocess_env, "PYTHONPATH": str(REPO)}
    cmd = [sys.executable, "-m", "nnwatch", "ctl", f"{host}:held-ctl", "pause",
           *shlex.split(_ssh_words(remote))]  # fmt: skip
    wait_for(lambda: trainer.published() > 20, timeout=60)
    ctl = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert ctl.stdout is not None
        said = ctl.stdout.readline() + ctl.stdout.readline()
        assert "holding the pause until Ctrl-C" in said, (said, ctl.stderr.read() if ctl.poll() is not None else "")  # type: ignore[union-attr]
        _holds(trainer, HOLD_S)
        assert ctl.poll() is None
        ctl.send_signal(signal.SIGINT)
        out, err = ctl.communicate(timeout=60)
        assert ctl.returncode == 0 and "resumed" in out, (out, err)
        before = trainer.published()
        wait_for(lambda: trainer.published() > before + 10, timeout=60)
    finally:
        if ctl.poll() is None:
            ctl.kill()
        trainer.kill()
