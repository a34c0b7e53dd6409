"""A run on another machine, reached through the user's own ``ssh``: ``nnwatch attach HOST:RUN``.

Nothing of ssh is reimplemented: the user's ``ssh`` program runs, so ``~/.ssh/config``, ProxyJump,
agents and ControlMaster all apply. Two ssh calls: ``ssh HOST nnwatch ls --json`` finds the run
and its command socket there, and ``ssh -N -L LOCAL:REMOTE HOST`` forwards that socket to a
private local path (in a fresh 0700 directory this module creates and always removes). The
monitor then follows the run in bounded bytes (:class:`SummarisedSource`: an overview sized to the
screen, the recent rows, older ones fetched on demand), and when the link drops, the tunnel is started again and the stream resumes after what is already on screen.
"""

from __future__ import annotations

import atexit
import contextlib
import json
import os
import shutil
import subprocess
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from nnwatch.sources.base import SourceError
from nnwatch.sources.pull import PullError, PullRequest, pull, pulled_run_dir
from nnwatch.sources.remote_command import explain_failure, remote_command
from nnwatch.sources.ssh_child import (
    close_on_signals,
    closed,
    spawn_tied,
    ssh_base,
    stop_process,
)
from nnwatch.sources.summarised import SummarisedSource
from nnwatch.store.paths import SNAPSHOT_MANIFEST, SNAPSHOTS_DIR

#: How long ssh gets to log in and forward (a ProxyJump over a slow link can take a while).
CONNECT_TIMEOUT = 30.0


def remote_runs(
    host: str,
    *,
    ssh: str = "ssh",
    ssh_args: Sequence[str] = (),
    remote_nnwatch: str | None = None,
    remote_root: str | None = None,
    timeout: float = CONNECT_TIMEOUT,
    finished: bool = False,
) -> list[dict[str, Any]]:
    """The runs ``nnwatch ls --json`` lists on ``host``, as its JSON rows (``finished``: also
    the finished and crashed runs still on disk there, as ``--all``). ``remote_nnwatch`` None:
    the host's own runs say which Python runs nnwatch there (``remote_command``)."""
    words = ["ls", "--json", *(["--all"] if finished else [])]
    cmd = [
        *ssh_base(ssh, ssh_args),
        host,
        remote_command(words, remote_nnwatch=remote_nnwatch, root=remote_root),
    ]
    try:
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    except FileNotFoundError:
        raise SourceError(f"cannot run {cmd[0]!r}: is OpenSSH installed here?") from None
    except subprocess.TimeoutExpired:
        raise SourceError(f"ssh {host} did not answer within {timeout:g} s") from None
    if done.returncode != 0:
        why = explain_failure(host, done.returncode, done.stderr, remote_nnwatch)
        raise SourceError(f"`nnwatch ls --json` on {host} failed: {why}")
    try:
        rows = json.loads(done.stdout)
    except ValueError:
        raise SourceError(
            f"`nnwatch ls --json` on {host} printed something that is not JSON "
            "(a login banner on stdout?)"
        ) from None
    if not isinstance(rows, list):
        raise SourceError(f"`nnwatch ls --json` on {host} did not print a list")
    return [r for r in rows if isinstance(r, dict)]


def pick_run(rows: list[dict[str, Any]], spec: str, host: str) -> dict[str, Any]:
    """The run ``spec`` names among ``rows`` (name or its start, NAME:RANK, pid or run directory);
    plain words when none or several match."""
    live = [r for r in rows if r.get("socket") and not r.get("ended")]
    if not live:
        raise SourceError(f"no live run on {host} (`nnwatch ls` there lists none)")
    if not spec:
        if len(live) == 1:
            return live[0]
        names = ", ".join(_label(r) for r in live)
        raise SourceError(f"{len(live)} live runs on {host}: {names}; name one (HOST:RUN)")
    rank: int | None = None
    name = spec
    if ":" in spec and spec.rsplit(":", 1)[1].isdigit():
        name, rank = spec.rsplit(":", 1)[0], int(spec.rsplit(":", 1)[1])

    def matches(r: dict[str, Any], exact: bool) -> bool:
        run_name = str(r.get("name", ""))
        base = Path(str(r.get("run_dir", ""))).name
        hit = (
            str(r.get("pid")) == name or r.get("run_dir") == name or base == name
            or run_name == name or (not exact and (run_name.startswith(name) or base.startswith(name)))
        )  # fmt: skip
        return hit and (rank is None or r.get("rank") == rank)

    found = [r for r in live if matches(r, True)] or [r for r in live if matches(r, False)]
    if rank is None and len(found) > 1:
        found = sorted(found, key=lambda r: int(r.get("rank") or 0))
        if len({r.get("name") for r in found}) == 1 and len({r.get("pid") for r in found}) > 1:
            ranks = [r for r in found if (r.get("rank") or 0) == 0]
            found = ranks[:1] or found[:1]  # a job: its rank 0
    if not found:
        names = ", ".join(_label(r) for r in live)
        raise SourceError(f"no live run on {host} matches {spec!r}; there: {names}")
    if len(found) > 1:
        names = ", ".join(_label(r) for r in found)
        raise SourceError(f"{spec!r} matches several runs on {host}: {names}; name one")
    return found[0]


@dataclass(frozen=True)
class RemoteRun:
    """One run as ``nnwatch ls --json`` on another host described it: what a run list shows.
    ``live`` is the far host's own judgement (its pids and heartbeats mean nothing here).
    ``host`` is the name the user reached it by (the ssh alias: every node of a cluster may call
    itself ``vm``), ``machine`` the hostname the run recorded there."""

    name: str
    state: str
    step: int | None
    steps_per_s: float | None
    pid: int
    host: str
    rank: int
    world_size: int
    age: float
    run_dir: str
    live: bool
    machine: str = ""
    #: findings in its events, as the host counted them (None: that host's nnwatch is older)
    findings: int | None = None

    @classmethod
    def from_row(cls, row: dict[str, Any], host: str) -> RemoteRun:
        def num(key: str) -> float | None:
            v = row.get(key)
            return float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else None

        step = num("step")
        return cls(
            name=str(row.get("name", "?")), state=str(row.get("state", "?")),
            step=int(step) if step is not None else None, steps_per_s=num("steps_per_s"),
            pid=int(num("pid") or 0), host=host, machine=str(row.get("host") or ""),
            rank=int(num("rank") or 0), world_size=int(num("world_size") or 1),
            age=num("age") or 0.0, run_dir=str(row.get("run_dir", "")),
            live=bool(row.get("live")) and bool(row.get("socket")) and not row.get("ended"),
            findings=int(row["findings"]) if isinstance(row.get("findings"), int) else None,
        )  # fmt: skip


def _label(r: dict[str, Any]) -> str:
    return f"{r.get('name')} (pid {r.get('pid')}, rank {r.get('rank')})"


class SshTunnel:
    """``ssh -N -L LOCAL:REMOTE HOST`` to a private local path; ``close`` removes it all, also
    on SIGHUP (a closed terminal) and SIGTERM; ssh ends with this process, even a ``kill -9``."""

    def __init__(
        self,
        host: str,
        remote_socket: str,
        *,
        ssh: str = "ssh",
        ssh_args: Sequence[str] = (),
        timeout: float = CONNECT_TIMEOUT,
    ) -> None:
        self.host = host
        self.remote_socket = remote_socket
        self.ssh = ssh
        self.ssh_args = list(ssh_args)
        self.timeout = timeout
        # short, private and ours: a Unix socket path must stay under 108 bytes
        self.dir = Path(tempfile.mkdtemp(prefix="nnw-", dir="/tmp"))
        os.chmod(self.dir, 0o700)
        self.local = self.dir / "run.sock"
        self.proc: subprocess.Popen[bytes] | None = None
        self.starts = 0
        atexit.register(self.close)  # removed however the monitor ends
        close_on_signals(self)

    def start(self) -> None:
        """Start ssh and wait until the forwarded socket exists; SourceError if it cannot."""
        self.stop()
        self.local.unlink(missing_ok=True)
        cmd = [
            *ssh_base(self.ssh, self.ssh_args), "-N",
            "-o", "ExitOnForwardFailure=yes", "-o", "StreamLocalBindUnlink=yes",
            "-o", "ServerAliveInterval=10", "-o", "ServerAliveCountMax=3",
            "-L", f"{self.local}:{self.remote_socket}", self.host,
        ]  # fmt: skip
        err = self.dir / "ssh.err"
        with open(err, "wb") as errf:
            try:
                self.proc = spawn_tied(
                    cmd, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=errf
                )
            except FileNotFoundError:
                raise SourceError(f"cannot run {cmd[0]!r}: is OpenSSH installed here?") from None
        self.starts += 1
        deadline = time.monotonic() + self.timeout
        while not self.local.exists():
            if self.proc.poll() is not None or time.monotonic() > deadline:
                self.stop()
                text = err.read_text(errors="replace").strip().splitlines()
                why = text[-1] if text else "it gave no reason"
                raise SourceError(f"ssh could not forward the run's socket from {self.host}: {why}")
            time.sleep(0.02)

    @property
    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def stop(self) -> None:
        proc, self.proc = self.proc, None
        stop_process(proc)
        self.local.unlink(missing_ok=True)

    def close(self) -> None:
        self.stop()
        shutil.rmtree(self.dir, ignore_errors=True)
        closed(self)


class RemoteSource(SummarisedSource):
    """A run on ``host`` through an ssh tunnel this source starts, restarts and removes: the
    overview first, detail on demand, live rows in proportion to the screen."""

    def __init__(
        self,
        host: str,
        spec: str = "",
        *,
        ssh: str = "ssh",
        ssh_args: Sequence[str] = (),
        remote_nnwatch: str | None = None,
        remote_root: str | None = None,
        timeout: float = 10.0,
        max_hz: float = 20.0,
    ) -> None:
        self.host = host
        self._ssh, self._ssh_args, self._remote_nnwatch = ssh, tuple(ssh_args), remote_nnwatch
        self._remote_root = remote_root
        rows = remote_runs(
            host, ssh=ssh, ssh_args=ssh_args, remote_nnwatch=remote_nnwatch, remote_root=remote_root
        )
        self.info = pick_run(rows, spec, host)
        self.tunnel = SshTunnel(host, str(self.info["socket"]), ssh=ssh, ssh_args=ssh_args)
        try:
            self.tunnel.start()
            super().__init__(self.tunnel.local, timeout=timeout, max_hz=max_hz)
        except BaseException:
            with contextlib.suppress(Exception):  # never in place of what is propagating
                self.tunnel.close()
            raise

    @property
    def files_host(self) -> str:
        return self.host

    def _pulled_dir(self) -> Path:
        run_dir = str(self.info.get("run_dir") or "")
        return pulled_run_dir(self.host, run_dir, str(self.info.get("name") or ""))

    def pulled_snapshot(self, step: int, name: str = "") -> Path | None:
        local = self._pulled_dir() / SNAPSHOTS_DIR / (name or f"step-{int(step)}")
        return local if (local / SNAPSHOT_MANIFEST).is_file() else None

    def pull_snapshot(self, step: int, name: str = "") -> Path:
        """The snapshot copied (once) into ``nnwatch-pulled/HOST/RUN/snapshots``, checked."""
        done = self.pulled_snapshot(step, name)
        if done is not None:
            return done  # pulled before: the same bytes, checked then
        run_dir = str(self.info.get("run_dir") or "")
        into = self._pulled_dir()
        req = PullRequest(
            self.host, run=run_dir, step=int(step), into=into, ssh=self._ssh,
            ssh_args=self._ssh_args, remote_nnwatch=self._remote_nnwatch, root=self._remote_root,
        )  # fmt: skip
        try:
            return pull(req).path
        except PullError as exc:
            raise SourceError(str(exc)) from None

    def _resubscribe(self) -> None:
        if not self.tunnel.alive:
            self.tunnel.start()  # the link dropped and took ssh with it
        super()._resubscribe()

    def close(self) -> None:
        try:
            super().close()
        finally:
            self.tunnel.close()
