"""A GPU host with nothing configured, through a real sshd on 127.0.0.1: its non-interactive PATH
has no nnwatch, the trainer runs from a venv, and the laptop passes no nnwatch flag and has no
config file. ``nnwatch HOST``, ``attach HOST:RUN``, ``pull`` and ``ctl HOST:RUN pause`` find
nnwatch through the Python the run's registry entry names; the lists show the ssh alias.

The only ssh set-up is what a user's ``~/.ssh/config`` holds (the alias, its port and key), given
here by an ``ssh`` earlier on the PATH that adds ``-F`` with that file.
"""

from __future__ import annotations

import getpass
import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from nnwatch.cli.attach import open_live
from nnwatch.sources.base import SourceError
from nnwatch.sources.remote import RemoteRun, RemoteSource, remote_runs
from nnwatch.store.registry import list_runs
from tests.conftest import REPO
from tests.e2e.test_ssh_forward import SSH, Tunnel, pytestmark  # noqa: F401 - the skip mark
from tests.integration.test_channel_faults import poll_until, steps_of, wait_for

ALIAS = "gpu-host"
#: The far host's PATH for a non-interactive ssh: no venv on it.
HOST_PATH = "/usr/bin:/bin"


class Host:
    """sshd whose sessions get ``HOST_PATH`` and the run root, and a laptop-side ssh that knows
    the alias, as a user's ~/.ssh/config would."""

    def __init__(self, root: Path) -> None:
        self.dir = Path(tempfile.mkdtemp(prefix="nnw-host-", dir="/tmp"))
        self.sshd = Tunnel(self.dir, extra=f"SetEnv PATH={HOST_PATH} NNWATCH_RUN_DIR={root}\n")
        (self.dir / "ssh_config").write_text(
            f"Host {ALIAS}\n  HostName 127.0.0.1\n  Port {self.sshd.port}\n"
            f"  User {getpass.getuser()}\n  IdentityFile {self.dir / 'user_key'}\n"
            "  BatchMode yes\n  StrictHostKeyChecking no\n  UserKnownHostsFile /dev/null\n"
            "  LogLevel ERROR\n"
        )
        self.bin = self.dir / "bin"
        self.bin.mkdir()
        (self.bin / "ssh").write_text(f'#!/bin/sh\nexec {SSH} -F {self.dir / "ssh_config"} "$@"\n')
        os.chmod(self.bin / "ssh", 0o755)

    def laptop_env(self, base: dict[str, str]) -> dict[str, str]:
        env = dict(base)
        env["PATH"] = f"{self.bin}{os.pathsep}{env.get('PATH', '')}"
        env["NNWATCH_CONFIG"] = str(self.dir / "no-config.toml")  # there is none
        return env

    def run_there(self, command: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [str(self.bin / "ssh"), ALIAS, command], capture_output=True, text=True, timeout=60
        )

    def close(self) -> None:
        self.sshd.close()
        shutil.rmtree(self.dir, ignore_errors=True)


@pytest.fixture
def host(run_root: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Host]:
    h = Host(run_root)
    env = h.laptop_env(dict(os.environ))
    monkeypatch.setenv("PATH", env["PATH"])
    monkeypatch.setenv("NNWATCH_CONFIG", env["NNWATCH_CONFIG"])
    yield h
    h.close()


@pytest.fixture
def trainer(subprocess_env: dict[str, str]) -> Iterator[subprocess.Popen[str]]:
    """A real watch() in the project's venv, stepping until it is stopped."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "tests.trainers.mlp_trainer", "--steps", "100000", "--delay",
         "0.01", "--name", "far-run"],
        cwd=REPO, env=subprocess_env, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
    )  # fmt: skip
    assert proc.stdout is not None
    for line in proc.stdout:
        if line.startswith("step 5"):
            break
    # it prints a line a step: drained, or a full pipe would stall it
    threading.Thread(target=proc.stdout.read, daemon=True).start()
    wait_for(lambda: any(r.name == "far-run" and r.live for r in list_runs()), timeout=30)
    yield proc
    proc.kill()
    proc.wait(timeout=10)


def _nnwatch(
    env: dict[str, str], *words: str, cwd: Path | None = None, timeout: float = 120
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "nnwatch", *words], env=env, cwd=cwd, capture_output=True,
        text=True, timeout=timeout, stdin=subprocess.DEVNULL,
    )  # fmt: skip


def _step(name: str) -> int:
    run = next(r for r in list_runs() if r.name == name)
    return int(run.step or 0)


def test_the_host_has_no_nnwatch_on_its_path(host: Host) -> None:
    """The premise: what a non-interactive ssh gets there cannot run nnwatch by name."""
    done = host.run_there(
        "echo $PATH; command -v nnwatch || echo none; python3 -c 'import nnwatch' || echo no-module"
    )
    assert done.returncode == 0, done.stderr
    lines = done.stdout.split()
    # the login shell's own rc files may add to it (here pyenv's shims): none of it has nnwatch
    assert lines[0].endswith(HOST_PATH) and ".venv" not in lines[0], done.stdout
    assert "none" in lines and "no-module" in lines, done.stdout


def test_host_attach_pull_and_ctl_work_with_no_flag_and_no_config(
    host: Host, trainer: subprocess.Popen[str], subprocess_env: dict[str, str], tmp_path: Path
) -> None:
    env = host.laptop_env(subprocess_env)

    listed = _nnwatch(env, ALIAS)  # `nnwatch HOST`, without a terminal: the list as text
    assert listed.returncode == 0, listed.stderr
    assert "far-run" in listed.stdout and f"{ALIAS}:" in listed.stdout, listed.stdout
    assert f"nnwatch attach {ALIAS}:far-run" in listed.stdout

    rows = remote_runs(ALIAS)  # what the picker lists: the HOST column is the alias typed
    runs = [RemoteRun.from_row(r, ALIAS) for r in rows]
    far = next(r for r in runs if r.name == "far-run")
    assert far.host == ALIAS and far.live and far.machine  # the machine's own name kept apart

    source, _, job = open_live(f"{ALIAS}:far-run", None, {})  # attach HOST:RUN
    try:
        assert isinstance(source, RemoteSource) and job is None
        assert source.meta.name == "far-run"
        updates = poll_until(source, lambda u, all_: len(steps_of(all_)) > 5, timeout=30)
        assert steps_of(updates)[-1] > 5
    finally:
        source.close()

    pulled = _nnwatch(env, "pull", f"{ALIAS}:far-run", "--run", cwd=tmp_path)
    assert pulled.returncode == 0, pulled.stderr
    copied = list((tmp_path / "nnwatch-pulled" / ALIAS).iterdir())
    assert len(copied) == 1 and (copied[0] / "meta.json").is_file(), copied
    assert (
        json.loads((copied[0] / "meta.json").read_text())["extra"]["executable"] == sys.executable
    )

    ctl = subprocess.Popen(
        [sys.executable, "-m", "nnwatch", "ctl", f"{ALIAS}:far-run", "pause", "--for", "6"],
        env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        assert ctl.stdout is not None
        first = ctl.stdout.readline()
        assert "pause applies at step" in first, first + (ctl.stderr.read() if ctl.poll() else "")
        time.sleep(1.0)
        held = _step("far-run")
        time.sleep(2.0)
        assert _step("far-run") <= held + 1, "the pause through the forwarded socket did not hold"
        out, err = ctl.communicate(timeout=30)
        assert ctl.returncode == 0, err
        assert "resumed" in out
    finally:
        if ctl.poll() is None:
            ctl.kill()
    wait_for(lambda: _step("far-run") > held + 5, timeout=30)  # it trains again


def test_a_finished_run_still_names_its_python(host: Host, subprocess_env: dict[str, str]) -> None:
    """Once every run closed cleanly, no registry entry is left: the runs' meta.json names the
    Python, so `nnwatch HOST` still lists them."""
    done = subprocess.run(
        [sys.executable, "-m", "tests.trainers.mlp_trainer", "--steps", "5", "--name", "done-run"],
        cwd=REPO, env=subprocess_env, capture_output=True, text=True, timeout=240,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert not list_runs(), "a registry entry was left behind"
    listed = _nnwatch(host.laptop_env(subprocess_env), ALIAS)
    assert listed.returncode == 0, listed.stderr
    assert "done-run" in listed.stdout and "finished" in listed.stdout, listed.stdout


def test_a_host_without_nnwatch_says_what_to_install(host: Host, tmp_path: Path) -> None:
    empty = tmp_path / "empty-root"
    empty.mkdir()
    with pytest.raises(SourceError) as err:
        remote_runs(ALIAS, remote_root=str(empty))
    text = str(err.value)
    assert f"nnwatch is not installed on {ALIAS}" in text, text
    assert "pip install nnwatch" in text and "--remote-nnwatch" in text
    assert "--help" not in text


def test_the_job_view_reaches_each_host_with_no_flag_and_reads_its_config_table(
    host: Host, trainer: subprocess.Popen[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`attach --job`'s fan-out runs `nnwatch ranks --follow` on every host found as above; a
    host's table in the config file (here a command that cannot run) applies to that host."""
    from nnwatch.cli._config import ssh_options
    from nnwatch.sources.job_fanout import JobFanout

    fanout = JobFanout("", [ALIAS], options_for=ssh_options)
    try:
        link = fanout.links[0]
        wait_for(lambda: link.latest is not None or link.error, timeout=60)
        assert link.latest is not None and "jobs" in link.latest, link.error
    finally:
        fanout.close()
    config = tmp_path / "config.toml"
    config.write_text(f'[hosts.{ALIAS}]\nremote_nnwatch = "/no/such/nnwatch"\n')
    monkeypatch.setenv("NNWATCH_CONFIG", str(config))
    fanout = JobFanout("", [ALIAS], options_for=ssh_options)
    try:
        link = fanout.links[0]
        wait_for(lambda: link.error, timeout=60)
        assert "/no/such/nnwatch" in link.error and "config.toml" in link.error, link.error
    finally:
        fanout.close()
