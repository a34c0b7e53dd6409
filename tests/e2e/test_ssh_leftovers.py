"""What a remote attach leaves behind when its monitor ends badly (issue 33, item 12), through a
real sshd on 127.0.0.1: a closed terminal (SIGHUP) removes the private tunnel directory and its
socket, and a ``kill -9`` of the monitor does not leave its ``ssh -N -L`` running, orphaned."""

from __future__ import annotations

import getpass
import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.e2e.test_remote_ssh import REPO, remote  # noqa: F401 - fixture
from tests.e2e.test_ssh_forward import Tunnel, pytestmark, tunnel  # noqa: F401 - fixture, skip mark
from tests.integration.test_channel_faults import Trainer, wait_for

MONITOR = """
import json, sys, time
from nnwatch.sources.remote import RemoteSource
opts = json.loads(sys.argv[1])
source = RemoteSource(opts["host"], "far", ssh_args=opts["ssh_args"], remote_nnwatch=opts["remote_nnwatch"])
print(json.dumps({"dir": str(source.tunnel.dir), "ssh": source.tunnel.proc.pid}), flush=True)
while True:
    source.poll()
    time.sleep(0.1)
"""


def _alive(pid: int) -> bool:
    """The pid runs (a zombie does not: it only waits for its parent to reap it)."""
    try:
        with open(f"/proc/{pid}/stat") as fh:
            return fh.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


@pytest.fixture
def monitor(
    remote: dict[str, object],  # noqa: F811
    subprocess_env: dict[str, str],
    tmp_path: Path,
) -> Iterator[tuple[subprocess.Popen[str], Path, int]]:
    trainer = Trainer(subprocess_env, "--steps", "0", "--rate", "50", "--name", "far")
    script = tmp_path / "monitor.py"
    script.write_text(textwrap.dedent(MONITOR))
    opts = {**remote, "host": f"{getpass.getuser()}@127.0.0.1"}
    env = {**subprocess_env, "PYTHONPATH": str(REPO)}
    proc = subprocess.Popen(
        [sys.executable, str(script), json.dumps(opts)],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
        start_new_session=True,  # its own terminal-less session, as a login shell's job
    )  # fmt: skip
    assert proc.stdout is not None
    line = proc.stdout.readline()
    if not line:
        trainer.kill()
        raise AssertionError(proc.communicate()[1])
    info = json.loads(line)
    ssh = int(info["ssh"])
    try:
        yield proc, Path(info["dir"]), ssh
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        if _alive(ssh):
            os.kill(ssh, signal.SIGKILL)
        trainer.kill()


def test_a_hangup_during_a_remote_attach_removes_the_private_tunnel_dir(
    monitor: tuple[subprocess.Popen[str], Path, int],
) -> None:
    proc, tunnel_dir, ssh = monitor
    assert (tunnel_dir / "run.sock").exists()
    proc.send_signal(signal.SIGHUP)  # the terminal was closed
    proc.wait(timeout=30)
    assert proc.returncode == -signal.SIGHUP  # it still dies of the hang-up
    assert not tunnel_dir.exists(), sorted(p.name for p in tunnel_dir.iterdir())
    wait_for(lambda: not _alive(ssh), timeout=10)


def test_a_kill_9_of_the_monitor_does_not_leave_ssh_running(
    monitor: tuple[subprocess.Popen[str], Path, int],
) -> None:
    proc, tunnel_dir, ssh = monitor
    assert _alive(ssh)
    proc.kill()
    proc.wait(timeout=30)
    started = time.monotonic()
    try:
        wait_for(lambda: not _alive(ssh), timeout=10)
    except AssertionError:
        raise AssertionError(f"ssh -N -L (pid {ssh}) still runs, orphaned, after the monitor's kill -9") from None
    print(f"ssh ended {time.monotonic() - started:.2f} s after the monitor's kill -9")


FANOUT = """
import json, sys, time
from nnwatch.sources.job_fanout import JobFanout
opts = json.loads(sys.argv[1])
fanout = JobFanout("nojob", [opts["host"]], ssh_args=opts["ssh_args"], remote_nnwatch=opts["remote_nnwatch"])
link = fanout.links[0]
while not link.control.exists():
    time.sleep(0.05)
print(json.dumps({"dir": str(fanout.dir), "ssh": link.master.pid}), flush=True)
while True:
    fanout.poll()
    time.sleep(0.1)
"""


def test_a_hangup_of_the_job_view_removes_its_control_sockets_and_ends_ssh(
    remote: dict[str, object],  # noqa: F811
    subprocess_env: dict[str, str],
    tmp_path: Path,
) -> None:
    script = tmp_path / "fanout.py"
    script.write_text(textwrap.dedent(FANOUT))
    opts = {**remote, "host": f"{getpass.getuser()}@127.0.0.1"}
    proc = subprocess.Popen(
        [sys.executable, str(script), json.dumps(opts)],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        env={**subprocess_env, "PYTHONPATH": str(REPO)}, start_new_session=True,
    )  # fmt: skip
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        assert line, proc.communicate()[1]
        info = json.loads(line)
        control_dir, ssh = Path(info["dir"]), int(info["ssh"])
        assert any(control_dir.iterdir())
        proc.send_signal(signal.SIGHUP)
        proc.wait(timeout=30)
        assert proc.returncode == -signal.SIGHUP
        assert not control_dir.exists(), sorted(p.name for p in control_dir.iterdir())
        wait_for(lambda: not _alive(ssh), timeout=10)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
