"""One terminal for a whole multi-node job, end to end on this machine.

Two torchrun invocations with ``--nnodes 2`` (2 ranks each, gloo, CPU) play two nodes: each has
its own run root (``NNWATCH_RUN_DIR``) and its own sshd on a local port (which sets that run root
for whoever logs in), so neither node's files are visible to the other's ``nnwatch``. Then:

- through SSH (``attach --job JOB --hosts node0,node1``: one ControlMaster per host, ``nnwatch
  ranks --json --follow`` on each), the job view holds all four ranks, and so does the ranks
  pane of the job screen, driven through Textual's Pilot;
- through rank 0's job summary alone (node 0's files only), the same four ranks;
- rank 3 is killed: the SSH view names it as the rank that died, and rank 0's last job summary
  (written as its own collective fails) does too. How long each took is printed, not asserted.
"""

from __future__ import annotations

import asyncio
import getpass
import os
import re
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from nnwatch.sources.job_fanout import JobFanout
from nnwatch.sources.job_monitor import JobMonitor
from nnwatch.store.jobs import group_jobs, run_info_from_dir
from tests.conftest import REPO
from tests.e2e.test_ssh_forward import KEYGEN, SSHD, pytestmark  # noqa: F401 - the skip mark

pytestmark = [pytestmark, pytest.mark.slow]  # type: ignore[list-item]
BAD = {"killed", "crashed", "stopped", "exited", "frozen"}


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _wait(pred: Any, timeout: float, what: str) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        got = pred()
        if got:
            return got
        time.sleep(0.1)
    raise AssertionError(f"timed out waiting for {what}")


class Node:
    """A simulated node: a run root, and an sshd that gives logins that run root."""

    def __init__(self, name: str, base: Path, key: Path) -> None:
        self.name, self.dir, self.port = name, base / name, _free_port()
        self.dir.mkdir()
        self.root = self.dir / "runs"
        self.root.mkdir(mode=0o700)
        subprocess.run([KEYGEN, "-q", "-t", "ed25519", "-N", "", "-f", str(self.dir / "host_key")],
                       check=True)  # fmt: skip
        (self.dir / "authorized_keys").write_text(Path(f"{key}.pub").read_text())
        os.chmod(self.dir / "authorized_keys", 0o600)
        config = self.dir / "sshd_config"
        config.write_text(
            f"Port {self.port}\nListenAddress 127.0.0.1\nHostKey {self.dir}/host_key\n"
            f"PidFile {self.dir}/sshd.pid\nAuthorizedKeysFile {self.dir}/authorized_keys\n"
            "PubkeyAuthentication yes\nPasswordAuthentication no\n"
            "KbdInteractiveAuthentication no\nPermitRootLogin prohibit-password\n"
            "StrictModes no\nUsePAM no\nAllowStreamLocalForwarding yes\nLogLevel ERROR\n"
            f"SetEnv NNWATCH_RUN_DIR={self.root}\nMaxSessions 50\n"
        )
        if os.getuid() == 0:
            os.makedirs("/run/sshd", mode=0o755, exist_ok=True)
        self.sshd = subprocess.Popen([SSHD, "-D", "-e", "-f", str(config)], stderr=subprocess.PIPE,
                                     text=True)  # fmt: skip

        def listening() -> bool:
            if self.sshd.poll() is not None:
                pytest.skip(f"could not start a test sshd: {self.sshd.communicate()[1][:300]}")
            with socket.socket() as s:
                return s.connect_ex(("127.0.0.1", self.port)) == 0

        _wait(listening, 10, f"sshd of {name}")

    def close(self) -> None:
        self.sshd.terminate()
        self.sshd.wait(timeout=10)


@pytest.fixture
def nodes(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[list[Node], Path]]:
    import tempfile

    base = Path(tempfile.mkdtemp(prefix="nnw-job-", dir="/tmp"))  # short: socket paths
    key = base / "user_key"
    subprocess.run([KEYGEN, "-q", "-t", "ed25519", "-N", "", "-f", str(key)], check=True)
    made = [Node(f"node{i}", base, key) for i in range(2)]
    cfg = base / "ssh_config"
    cfg.write_text("".join(
        f"Host {n.name}\n  HostName 127.0.0.1\n  Port {n.port}\n  User {getpass.getuser()}\n"
        f"  IdentityFile {key}\n  BatchMode yes\n  StrictHostKeyChecking no\n"
        "  UserKnownHostsFile /dev/null\n  LogLevel ERROR\n" for n in made
    ))  # fmt: skip
    yield made, cfg
    for n in made:
        n.close()
    import shutil

    shutil.rmtree(base, ignore_errors=True)


def _start_job(made: list[Node]) -> tuple[list[subprocess.Popen[str]], dict[int, Path]]:
    port = _free_port()
    procs = []
    for i, node in enumerate(made):
        env = {**os.environ, "NNWATCH_RUN_DIR": str(node.root), "OMP_NUM_THREADS": "1",
               "PYTHONUNBUFFERED": "1", "PYTHONPATH": str(REPO)}  # fmt: skip
        procs.append(subprocess.Popen(
            [sys.executable, "-m", "torch.distributed.run", "--nnodes", "2", "--node-rank", str(i),
             "--nproc-per-node", "2", "--master-addr", "127.0.0.1", "--master-port", str(port),
             "--max-restarts", "0", "-m", "tests.trainers.job_trainer", "--steps", "0",
             "--sleep", "0.1", "--summary-every", "2"],
            cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        ))  # fmt: skip
    dirs: dict[int, Path] = {}
    lines: list[str] = []

    def pump(p: subprocess.Popen[str]) -> None:
        assert p.stdout is not None
        for line in p.stdout:  # read to the end, so the job never blocks on a full pipe
            lines.append(line)
            for rank, d in re.findall(r"rank (\d) run_dir (\S+)", line):
                dirs[int(rank)] = Path(d)

    import threading

    for p in procs:
        threading.Thread(target=pump, args=(p,), daemon=True).start()

    def read() -> bool:
        return len(dirs) == 4

    try:
        _wait(read, 180, "four ranks: " + "".join(lines)[-2000:])
    except BaseException:
        for p in procs:
            p.kill()
        raise
    return procs, dirs


def test_one_view_of_a_two_node_job_through_ssh_and_through_rank_0(
    nodes: tuple[list[Node], Path],
) -> None:
    made, cfg = nodes
    procs, dirs = _start_job(made)
    remote = f"env PYTHONPATH={REPO} {sys.executable} -m nnwatch"
    fanout = JobFanout("job", ["node0", "node1"], ssh_args=["-F", str(cfg)], remote_nnwatch=remote)
    try:
        # through SSH: every rank of both nodes, grouped by the job identity
        view = _wait(lambda: _full(fanout.poll()), 90, "all four ranks over ssh")
        assert [r.rank for r in view.rows] == [0, 1, 2, 3] and view.via == "ssh"
        assert not view.unreachable
        assert {fanout.where[r][0] for r in (0, 1)} == {"node0"}
        assert {fanout.where[r][0] for r in (2, 3)} == {"node1"}

        # the job screen's ranks pane shows them all
        from nnwatch.tui.job_app import JobApp
        from nnwatch.tui.widgets.ranks import RanksPane

        app = JobApp(fanout, interval=0.3)

        async def screen() -> tuple[str, str]:
            async with app.run_test(size=(160, 30)) as pilot:
                for _ in range(100):
                    await pilot.pause(0.1)
                    if app.views >= 2:
                        break
                pane = app.query_one(RanksPane)
                return pane.text, str(pane.border_subtitle)

        text, subtitle = asyncio.run(screen())
        for rank in range(4):
            assert re.search(rf"^\s+{rank}\s+\S+\s+\d+", text, re.M), text
        assert "4/4 ranks via ssh" in subtitle

        # through rank 0's job summary alone: node 0's files hold ranks 0 and 1 only
        here = group_jobs([run_info_from_dir(dirs[r]) for r in (0, 1)])
        assert len(here) == 1 and here[0].missing == (2, 3)
        monitor = JobMonitor(here[0])
        summary = _wait(lambda: _full(monitor.poll()), 60, "four ranks in rank 0's job summary")
        assert summary.via == "summary" and [r.rank for r in summary.rows] == [0, 1, 2, 3]
        assert all(r.loss == r.loss and r.step is not None for r in summary.rows)

        # kill rank 3 (a SIGKILL: no word from it); both routes name it
        pid = int(re.search(r"-(\d+)-r3$", dirs[3].name).group(1))  # type: ignore[union-attr]
        killed = time.monotonic()
        os.kill(pid, signal.SIGKILL)
        dead = _wait(lambda: _names_rank3(fanout.poll()), 30, "the ssh view to report rank 3")
        print(f"ssh view reported rank 3 after {time.monotonic() - killed:.2f} s: {dead}")
        for p in procs:
            p.wait(timeout=60)
        last = _wait(lambda: _names_rank3(monitor.poll()), 30, "rank 0's summary to report rank 3")
        print(f"rank 0's job summary: {last}")
    finally:
        fanout.close()
        for p in procs:
            if p.poll() is None:
                p.kill()


def _full(view: Any) -> Any:
    if view is None or len(view.rows) != 4 or any(r.step is None for r in view.rows):
        return None
    return view


def _names_rank3(view: Any) -> str:
    """The words that name rank 3 as the rank that died ('' while none do)."""
    if view is None:
        return ""
    row = next((r for r in view.rows if r.rank == 3), None)
    if row is None or row.status not in BAD:
        return ""
    stops = view.stops
    if 3 not in stops.first and 3 not in stops.holders:
        return ""
    return stops.summary
