"""A pulled copy of a run is a copy (issue 33, item 11), through a real sshd on 127.0.0.1: the
source is this very machine, so the copy's pid is a live local process while the trainer runs
(the case that read LIVE) and a dead one after (the case that read crashed). Neither may decide
the copy's status; what the source said at copy time is shown instead. And ``pull --run`` leaves
the 16 MiB ring out when the log holds every step it does."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

from nnwatch.channel.client import ChannelClient
from nnwatch.sources.recorded import RecordedSource
from nnwatch.store.registry import find_runs, inspect_dir
from nnwatch.store.run_reader import load_run
from tests.e2e.test_pull_ssh import HOST, REPO, pull  # noqa: F401 - fixture
from tests.e2e.test_remote_ssh import remote  # noqa: F401 - fixture
from tests.e2e.test_ssh_forward import Tunnel, pytestmark, tunnel  # noqa: F401 - fixture, skip mark
from tests.integration.test_channel_faults import wait_for


def _opened(run_dir: Path) -> tuple[str, str]:
    """The state and message ``nnwatch open`` shows once the copy is loaded."""
    source = RecordedSource(run_dir)
    while True:
        update = source.poll()
        if not update.status.message.startswith("loading"):
            return update.status.state, update.status.message


def test_a_pulled_copy_is_not_judged_by_a_pid_here_and_the_ring_is_left_out_when_logged(
    pull: object, subprocess_env: dict[str, str]  # noqa: F811 - the fixture
) -> None:
    proc = subprocess.Popen(
        [sys.executable, "-m", "tests.trainers.mlp_trainer", "--steps", "100000",
         "--delay", "0.01", "--name", "far-copy"],
        stdout=subprocess.PIPE, text=True, env=subprocess_env, cwd=REPO,
    )  # fmt: skip
    try:
        assert proc.stdout is not None
        run_dir = Path(proc.stdout.readline().split(" ", 1)[1].strip())
        info = wait_for(lambda: next(iter(find_runs("far-copy")), None), timeout=60)
        wait_for(lambda: (run_dir / "scalars.bin").exists(), timeout=30)
        done = pull(f"{HOST}:far-copy", "--run", "--into", "live")  # type: ignore[operator]
        assert done.returncode == 0, done.stderr
        copy = pull.cwd / "live"  # type: ignore[attr-defined]
        # the trainer runs, with the pid the copy names, on this very host: still not "running"
        run = load_run(copy)
        assert run.status == "copied", (run.status, run.warnings)
        state, message = _opened(copy)
        assert state != "live" and "attach to it" not in message, message
        assert "a copy pulled from 127.0.0.1" in message and "there it was running" in message
        listed = inspect_dir(copy)
        assert listed is not None and listed.status == "copied" and listed.alive is None

        # held still: the log catches up with the ring, and the copy leaves the ring out
        with ChannelClient(info.socket) as client:
            assert client.request("pause").ok
            time.sleep(1.5)  # the log's writer drains every ~100 ms
            held = pull(f"{HOST}:far-copy", "--run", "--into", "held")  # type: ignore[operator]
        assert held.returncode == 0, held.stderr
        assert not (pull.cwd / "held" / "ring").exists()  # type: ignore[attr-defined]
        assert "ring (every step it holds is in the log)" in held.stdout, held.stdout
        assert len(load_run(pull.cwd / "held")) >= len(run)  # type: ignore[attr-defined]
    finally:
        proc.kill()
        proc.wait(timeout=10)
    # the source's trainer is gone now: the copy does not turn "crashed" for it
    run = load_run(copy)
    assert run.status == "copied"
    state, message = _opened(copy)
    assert state != "crashed" and "there it was running" in message
