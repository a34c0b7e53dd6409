"""``nnwatch HOST``: the runs on another machine, listed through a real sshd on 127.0.0.1 with the
user's own ssh; a picked live run opens as ``nnwatch attach HOST:RUN`` would, and without a
terminal the list is printed as text; a picked finished run is copied here and opened."""

from __future__ import annotations

import asyncio
import getpass
import shlex
import subprocess
import sys
from pathlib import Path

from nnwatch.cli import _looks_like_host
from nnwatch.sources.remote import RemoteRun, RemoteSource, remote_runs
from nnwatch.store.run_reader import load_run
from nnwatch.testing.tui import wait_until
from nnwatch.tui.picker import RunPickerApp
from tests.e2e.test_remote_ssh import remote  # noqa: F401 - fixture
from tests.e2e.test_ssh_forward import pytestmark, tunnel  # noqa: F401 - fixture, skip mark
from tests.integration.test_channel_faults import Trainer, wait_for
from tests.terminal import Terminal

REPO = Path(__file__).resolve().parents[2]


def _finished_run(env: dict[str, str]) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "nnwatch.testing.synthetic", "--steps", "60", "--rate", "0",
         "--name", "done-before"],
        env=env, capture_output=True, text=True, cwd=REPO, timeout=120,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr


def test_picker_on_a_host_lists_live_and_finished_runs_and_opens_the_picked_live_one(
    remote: dict[str, object],  # noqa: F811
    subprocess_env: dict[str, str],
) -> None:
    host = f"{getpass.getuser()}@127.0.0.1"
    _finished_run(subprocess_env)
    a = Trainer(subprocess_env, "--steps", "0", "--rate", "100", "--name", "far-a")
    b = Trainer(subprocess_env, "--steps", "0", "--rate", "100", "--name", "far-b")
    try:
        wait_for(lambda: a.published() > 5 and b.published() > 5, timeout=30)
        calls: list[int] = []

        def lister() -> list[RemoteRun]:
            calls.append(1)
            rows = remote_runs(host, finished=True, **remote)  # type: ignore[arg-type]
            return [RemoteRun.from_row(r, host) for r in rows]

        app = RunPickerApp(lister=lister, refresh_s=60.0, title=f"runs on {host}")

        async def main() -> None:
            async with app.run_test(size=(180, 30)) as pilot:
                await wait_until(pilot, lambda: len(app.runs) == 3, timeout=30)
                by_name = {r.name: r for r in app.runs}
                assert by_name["far-a"].live and by_name["far-b"].live
                assert not by_name["done-before"].live
                assert by_name["done-before"].state == "finished"
                assert by_name["far-b"].host.startswith(host)
                assert "2 live, 1 on disk" in str(app.query_one("#hint").render())
                table = app.query_one("#runs")
                table.move_cursor(row=app.runs.index(by_name["far-b"]))  # type: ignore[attr-defined]
                await pilot.press("enter")

        asyncio.run(main())
        picked = app.return_value
        assert isinstance(picked, RemoteRun) and picked.name == "far-b" and calls
        source = RemoteSource(host, picked.run_dir, **remote)  # type: ignore[arg-type]
        try:
            assert source.meta.name == "far-b"
            assert source.info["pid"] == b.pid
        finally:
            source.close()
    finally:
        a.kill()
        b.kill()


def test_nnwatch_host_without_a_terminal_prints_the_runs_there(
    remote: dict[str, object],  # noqa: F811
    subprocess_env: dict[str, str],
) -> None:
    host = f"{getpass.getuser()}@127.0.0.1"
    _finished_run(subprocess_env)
    t = Trainer(subprocess_env, "--steps", "0", "--rate", "100", "--name", "listed-live")
    ssh = [f"--ssh-arg={x}" for x in remote["ssh_args"]]  # type: ignore[attr-defined]
    try:
        wait_for(lambda: t.published() > 5, timeout=30)
        out = subprocess.run(
            [sys.executable, "-m", "nnwatch", host, *ssh, "--remote-nnwatch", str(remote["remote_nnwatch"])],
            env=subprocess_env, capture_output=True, text=True, cwd=REPO, timeout=120,
        )  # fmt: skip
        assert out.returncode == 0, out.stderr
        lines = out.stdout.splitlines()
        assert lines[1].split()[:2] == ["listed-live", "running"]  # live ones first
        assert any(ln.split()[:2] == ["done-before", "finished"] for ln in lines)
        assert f"{host}:{t.run_dir}" in out.stdout
        assert lines[-1] == f"follow one: nnwatch attach {host}:listed-live"
    finally:
        t.kill()
    bad = subprocess.run(
        [sys.executable, "-m", "nnwatch", "no-such-host.invalid", "--ssh-arg=-oBatchMode=yes"],
        env=subprocess_env, capture_output=True, text=True, cwd=REPO, timeout=120,
    )  # fmt: skip
    assert bad.returncode == 1
    # ssh's own reason, and no pointer to the command list (the word was a host, not a typo)
    assert "no-such-host.invalid" in bad.stderr and "Could not resolve" in bad.stderr
    assert "--help" not in bad.stderr


def test_a_near_miss_of_a_command_is_a_typo_not_a_host() -> None:
    assert not _looks_like_host("atach") and not _looks_like_host("ls-")
    assert not _looks_like_host("./runs/x")
    assert _looks_like_host("gpu-host") and _looks_like_host("me@10.0.0.7:")


def test_picking_a_finished_run_on_a_host_copies_it_here_and_opens_the_copy(
    remote: dict[str, object],  # noqa: F811
    subprocess_env: dict[str, str],
    tmp_path: Path,
) -> None:
    """In a real terminal: ``nnwatch HOST``, Enter on a finished run; its files are pulled (checked)
    into ./nnwatch-pulled/HOST/RUN and the monitor opens the copy as ``nnwatch open`` would."""
    host = f"{getpass.getuser()}@127.0.0.1"
    _finished_run(subprocess_env)
    ssh = " ".join(shlex.quote(f"--ssh-arg={x}") for x in remote["ssh_args"])  # type: ignore[attr-defined]
    env = {**subprocess_env, "PYTHONPATH": str(REPO)}
    cmd = (
        f"cd {shlex.quote(str(tmp_path))} && {sys.executable} -m nnwatch {host} {ssh} "
        f"--remote-nnwatch {shlex.quote(str(remote['remote_nnwatch']))} --no-nvml"
    )
    term = Terminal(cmd, env)
    try:
        term.wait_for("done-before", timeout=90)
        term.keys("Enter")
        screen = term.wait_for("FINISHED", timeout=120)
        assert "done-before" in screen
        (copy,) = (tmp_path / "nnwatch-pulled" / "127.0.0.1").iterdir()
        assert copy.name.startswith("done-before")
        assert len(load_run(copy).scalars) == 60
        term.keys("q")
        assert term.exit_status() == 0
    finally:
        term.close()
