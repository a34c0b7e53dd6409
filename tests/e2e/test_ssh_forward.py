"""Remote use for real: an OpenSSH server on 127.0.0.1 with throwaway keys, the run's command
socket forwarded with ``ssh -L``, and a monitor that has nothing but the forwarded socket.

Skipped, with the reason, when OpenSSH is not installed (``scripts/system-deps.sh`` installs it).
"""

from __future__ import annotations

import getpass
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from nnwatch.channel.client import ChannelClient
from nnwatch.cli import main as cli_main
from nnwatch.sources.live import ConnectedSource
from tests.integration.test_channel_faults import Trainer, poll_until, steps_of, wait_for

SSHD = shutil.which("sshd") or ("/usr/sbin/sshd" if os.path.exists("/usr/sbin/sshd") else None)
SSH = shutil.which("ssh")
KEYGEN = shutil.which("ssh-keygen")

pytestmark = pytest.mark.skipif(
    not (SSHD and SSH and KEYGEN),
    reason="OpenSSH (sshd, ssh, ssh-keygen) is not installed; run scripts/system-deps.sh",
)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Tunnel:
    """sshd on a free local port, and ``ssh -N -L local:remote`` through it."""

    def __init__(self, workdir: Path, extra: str = "") -> None:
        """``extra``: more sshd_config lines (``SetEnv PATH=...``: the host's own environment)."""
        self.dir = workdir
        self.port = _free_port()
        for key in ("host_key", "user_key"):
            subprocess.run(
                [KEYGEN, "-q", "-t", "ed25519", "-N", "", "-f", str(workdir / key)], check=True
            )
        (workdir / "authorized_keys").write_text((workdir / "user_key.pub").read_text())
        os.chmod(workdir / "authorized_keys", 0o600)
        config = workdir / "sshd_config"
        config.write_text(
            f"Port {self.port}\nListenAddress 127.0.0.1\nHostKey {workdir}/host_key\n"
            f"PidFile {workdir}/sshd.pid\nAuthorizedKeysFile {workdir}/authorized_keys\n"
            "PubkeyAuthentication yes\nPasswordAuthentication no\n"
            "KbdInteractiveAuthentication no\nPermitRootLogin prohibit-password\n"
            "StrictModes no\nUsePAM no\nAllowStreamLocalForwarding yes\nLogLevel ERROR\n" + extra
        )
        if os.getuid() == 0:
            os.makedirs("/run/sshd", mode=0o755, exist_ok=True)  # privilege separation dir
        self.sshd = subprocess.Popen(
            [SSHD, "-D", "-e", "-f", str(config)], stderr=subprocess.PIPE, text=True
        )
        try:
            wait_for(self._listening, timeout=10)
        except AssertionError:
            self.sshd.kill()
            err = self.sshd.communicate()[1]
            pytest.skip(f"could not start a test sshd here: {err.strip()[:300]}")
        self.ssh: subprocess.Popen[str] | None = None

    def _listening(self) -> bool:
        if self.sshd.poll() is not None:
            raise AssertionError("sshd exited")
        with socket.socket() as s:
            return s.connect_ex(("127.0.0.1", self.port)) == 0

    def forward(self, local: Path, remote: Path) -> None:
        local.unlink(missing_ok=True)  # a dropped tunnel leaves its socket file behind
        self.ssh = subprocess.Popen(
            [
                SSH, "-N", "-p", str(self.port), "-i", str(self.dir / "user_key"),
                "-o", "BatchMode=yes", "-o", "StrictHostKeyChecking=no",
                "-o", "UserKnownHostsFile=/dev/null", "-o", "ExitOnForwardFailure=yes",
                "-o", "StreamLocalBindUnlink=yes", "-o", "LogLevel=ERROR",
                "-L", f"{local}:{remote}", f"{getpass.getuser()}@127.0.0.1",
            ],
            stderr=subprocess.PIPE, text=True,
        )  # fmt: skip
        try:
            wait_for(lambda: local.exists() or self.ssh.poll() is not None, timeout=15)
        finally:
            if self.ssh.poll() is not None:
                pytest.fail(f"ssh -L failed: {self.ssh.communicate()[1]}")

    def drop(self) -> None:
        """Cut the tunnel, as a laptop losing its connection would."""
        if self.ssh is not None and self.ssh.poll() is None:
            self.ssh.kill()
            self.ssh.wait()

    def close(self) -> None:
        self.drop()
        self.sshd.terminate()
        try:
            self.sshd.wait(timeout=5)
        except subprocess.TimeoutExpired:
            self.sshd.kill()


@pytest.fixture
def tunnel() -> Iterator[Tunnel]:
    workdir = Path(tempfile.mkdtemp(prefix="nnw-ssh-", dir="/tmp"))  # short: socket paths
    t = Tunnel(workdir)
    yield t
    t.close()
    shutil.rmtree(workdir, ignore_errors=True)


def test_monitor_follows_and_steers_through_an_ssh_forwarded_socket(
    tunnel: Tunnel, subprocess_env: dict[str, str], capsys: pytest.CaptureFixture[str]
) -> None:
    trainer = Trainer(subprocess_env, "--steps", "0", "--rate", "200", "--name", "remote")
    try:
        wait_for(lambda: trainer.published() > 100)
        local = tunnel.dir / "run.sock"
        tunnel.forward(local, trainer.socket)
        source = ConnectedSource(local)
        assert source.meta.name == "remote"
        updates = poll_until(source, lambda u, all_: len(steps_of(all_)) > 200)
        steps = steps_of(updates)
        assert steps[:100] == list(range(100))  # history first, through the tunnel

        reply = source.command("set_layer_interval", n=4)
        assert reply.ok and reply.applies_at_step is not None
        assert cli_main(["ctl", "--connect", str(local), "set_clip", "0.75"]) == 0
        assert "set_clip applies at step" in capsys.readouterr().out

        # a pause asked for through the tunnel lifts itself when the tunnel drops
        assert source.command("pause").ok
        poll_until(source, lambda u, _: u.status.state == "paused")
        paused_at = trainer.published()
        tunnel.drop()
        wait_for(lambda: trainer.published() > paused_at + 20, timeout=15)
        assert source.poll().status.state == "lost"

        # reconnect through a new tunnel: the stream resumes without repeating steps
        tunnel.forward(local, trainer.socket)
        source.reconnect()
        more = poll_until(source, lambda u, all_: len(steps_of(all_)) > 20)
        new_steps = steps_of(more)
        assert new_steps[0] > steps[-1] and new_steps == sorted(set(new_steps))
        assert cli_main(["ctl", "--connect", str(local), "stop", "--json"]) == 0
        assert json.loads(capsys.readouterr().out)[0]["ok"] is True
        final = poll_until(source, lambda u, _: u.status.state == "finished", timeout=15)
        assert final[-1].status.message
        assert trainer.finish()["status"] == "stopped"
        source.close()
    finally:
        trainer.kill()


def test_crash_is_reported_through_the_tunnel(
    tunnel: Tunnel, subprocess_env: dict[str, str]
) -> None:
    trainer = Trainer(subprocess_env, "--steps", "0", "--rate", "200", "--name", "remote-crash")
    try:
        local = tunnel.dir / "crash.sock"
        tunnel.forward(local, trainer.socket)
        source = ConnectedSource(local)
        poll_until(source, lambda u, all_: len(steps_of(all_)) > 20)
        trainer.proc.kill()
        trainer.proc.wait()
        t0 = time.monotonic()
        poll_until(source, lambda u, _: u.status.state == "crashed", timeout=5)
        print(f"crash reported through ssh after {time.monotonic() - t0:.2f} s")
        source.close()
    finally:
        trainer.kill()


def test_forwarded_stream_ignores_extra_bytes_from_the_monitor(
    tunnel: Tunnel, subprocess_env: dict[str, str]
) -> None:
    """A monitor speaking garbage on its stream connection does not disturb the run."""
    trainer = Trainer(subprocess_env, "--steps", "0", "--rate", "200", "--name", "noisy")
    try:
        local = tunnel.dir / "noisy.sock"
        tunnel.forward(local, trainer.socket)
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
            s.settimeout(10)
            s.connect(str(local))
            s.sendall(b'{"cmd": "subscribe", "id": 9, "args": {"history": false}}\n')
            s.sendall(b"garbage\n" * 1000)
            buf = b""
            while b'"type": "records"' not in buf:
                chunk = s.recv(65536)
                assert chunk
                buf += chunk
            first = json.loads(buf.split(b"\n")[0])
            assert first["id"] == 9 and first["ok"] is True
        start = trainer.published()
        wait_for(lambda: trainer.published() > start + 50)  # the run goes on
        with ChannelClient(local) as c:  # and still answers through the tunnel
            assert c.hello()["name"] == "noisy"
    finally:
        trainer.kill()


@pytest.mark.skipif(shutil.which("tmux") is None, reason="tmux is not installed")
def test_nnwatch_attach_connect_shows_the_run_through_the_tunnel(
    tunnel: Tunnel, subprocess_env: dict[str, str]
) -> None:
    """The journey a laptop user takes: ``nnwatch attach --connect`` on the forwarded socket,
    in a real terminal (tmux), showing the remote run and its steps advancing."""
    trainer = Trainer(subprocess_env, "--steps", "0", "--rate", "100", "--name", "over-ssh")
    session = f"nnw-ssh-{os.getpid()}"
    local = tunnel.dir / "attach.sock"
    try:
        tunnel.forward(local, trainer.socket)
        env_args = [
            f"{k}={v}" for k, v in subprocess_env.items() if k.startswith(("NNWATCH", "PYTHON"))
        ]
        command = f"env {' '.join(env_args)} {sys.executable} -m nnwatch attach --connect {local}"
        subprocess.run(
            ["tmux", "new-session", "-d", "-s", session, "-x", "120", "-y", "40", command],
            check=True,
        )

        def screen() -> str:
            res = subprocess.run(
                ["tmux", "capture-pane", "-p", "-t", session], capture_output=True, text=True
            )
            return res.stdout

        def header_step() -> int | None:
            for line in screen().splitlines():
                if "nnwatch over-ssh" in line and " step " in line:
                    return int(line.split(" step ", 1)[1].split()[0])
            return None

        first = wait_for(header_step, timeout=30)
        wait_for(lambda: (header_step() or 0) > first, timeout=15)  # live: the step advances
        assert "Traceback" not in screen()
        subprocess.run(["tmux", "send-keys", "-t", session, "q"], check=True)
        wait_for(
            lambda: (
                subprocess.run(
                    ["tmux", "has-session", "-t", session], capture_output=True
                ).returncode
                != 0
            ),
            timeout=10,
        )
        start = trainer.published()
        wait_for(
            lambda: trainer.published() > start + 20
        )  # quitting the monitor left training alone
    finally:
        subprocess.run(["tmux", "kill-session", "-t", session], capture_output=True)
        trainer.kill()
