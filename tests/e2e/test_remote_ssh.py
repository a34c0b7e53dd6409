"""``nnwatch attach HOST:RUN`` end to end through a real sshd on 127.0.0.1: the user's own ssh
finds the run with ``nnwatch ls --json`` on the host, forwards its socket to a private path, and
when the tunnel dies it is started again and the stream resumes after what is held; every step
can then be fetched on demand, equal to the run log, none missing, none twice.
"""

from __future__ import annotations

import getpass
import os
import signal
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from nnwatch.channel.client import ChannelClient
from nnwatch.cli.attach import open_live
from nnwatch.sources.base import SourceError
from nnwatch.sources.remote import RemoteSource
from nnwatch.store.run_reader import load_run
from nnwatch.tui.model import RunState
from tests.e2e.test_ssh_forward import Tunnel, pytestmark, tunnel  # noqa: F401 - fixture, skip mark
from tests.integration.test_channel_faults import Trainer, poll_until, steps_of, wait_for

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture
def remote(tunnel: Tunnel, subprocess_env: dict[str, str]) -> Iterator[dict[str, object]]:  # noqa: F811
    """What ``nnwatch attach`` gets from its options to reach the test sshd as a real host."""
    ssh_args = [
        "-p", str(tunnel.port), "-i", str(tunnel.dir / "user_key"), "-o", "BatchMode=yes",
        "-o", "StrictHostKeyChecking=no", "-o", "UserKnownHostsFile=/dev/null",
        "-o", "LogLevel=ERROR",
    ]  # fmt: skip
    nnwatch = (
        f"env NNWATCH_RUN_DIR={subprocess_env['NNWATCH_RUN_DIR']} PYTHONPATH={REPO} "
        f"{sys.executable} -m nnwatch"
    )
    yield {"ssh_args": ssh_args, "remote_nnwatch": nnwatch}


def test_attach_host_run_survives_a_killed_tunnel_and_fetches_every_step_equal_to_the_log(
    remote: dict[str, object], subprocess_env: dict[str, str]
) -> None:
    """Overview first (the whole run summarised, the recent window at full resolution), a tunnel
    killed, the stream resumed after what is held, and then every step fetched on demand through
    the same channel, byte for byte the run log."""
    trainer = Trainer(subprocess_env, "--steps", "0", "--rate", "0", "--name", "far-away")
    host = f"{getpass.getuser()}@127.0.0.1"
    try:
        wait_for(lambda: trainer.published() > 300_000, timeout=60)
        pause = ChannelClient(trainer.socket)  # hold the run still while the monitor attaches
        assert pause.request("pause").ok
        wait_for(lambda: pause.request("hello").ok)
        source, _, job = open_live(f"{host}:far-away", None, remote)
        assert isinstance(source, RemoteSource) and job is None
        assert source.meta.name == "far-away"
        tunnel_dir = source.tunnel.dir
        assert source.tunnel.local.exists() and oct(tunnel_dir.stat().st_mode)[-3:] == "700"
        state = RunState(source.meta)
        held = trainer.published()
        first = poll_until(
            source, lambda u, all_: state.ingest(u) is not None
            and state.history.last_step >= held - 1, timeout=30,
        )  # fmt: skip
        assert any(u.summary is not None for u in first), "no overview"
        assert source.received < 2_000_000, "the first screen took more than 2 MB"
        source.tunnel.proc.kill()  # type: ignore[union-attr]
        pause.close()  # training goes on
        target = held + 1000
        rest = poll_until(
            source, lambda u, all_: state.ingest(u) is not None
            and state.history.last_step >= target, timeout=90,
        )  # fmt: skip
        assert source.tunnel.starts == 2 and source.subscriptions == 2
        starts = [
            float(u.summary["first"][0]) if u.summary is not None else float(u.scalars["step"][0])
            for u in rest if u.summary is not None or len(u.scalars)
        ]  # fmt: skip
        assert starts[0] == held, "resumed elsewhere than after what was held: " + repr(
            [
                (u.summary["first"][:3], u.summary["last"][:3], len(u.summary))
                if u.summary is not None
                else (u.scalars["step"][:3], len(u.scalars))
                for u in rest[:4]
            ]
        )
        assert (np.diff(np.array(steps_of(rest))) >= 1).all(), "a step came twice"
        # Known gap (issue 20, left open): when live aggregates follow a reconnect overview in
        # one poll, the monitor's bucket count can lag its last step by a few thousand rows
        # until later buckets arrive; the rows themselves are all fetched below, equal to the log.
        assert rest[-1].status.state == "live"
        still = ChannelClient(trainer.socket)  # hold the run: the fetches are checked, not raced
        assert still.request("pause").ok
        # A fetch is served from the log, whose writer drains a few times a second: a fetch of
        # steps the ring has published but the log not yet written waits for them. At an
        # unthrottled step rate the writer may also drop rows it cannot keep up with (it counts
        # them); a fetch is by step, so it is compared with the log's rows of those steps.
        fetched = [
            (a, min(a + 150_000, held) - 1, source.fetch(float(a), float(min(a + 150_000, held) - 1), timeout=60))
            for a in range(0, held, 150_000)
        ]  # fmt: skip
        log = load_run(trainer.run_dir).scalars
        assert log["step"][-1] >= held - 1
        for a, b, got in fetched:  # every step, fetched at full resolution
            assert got is not None
            want = np.asarray(log[(log["step"] >= a) & (log["step"] <= b)])
            assert len(got[0]) == len(want), f"fetch from {a}: {len(got[0])} rows, log {len(want)}"
            as_bytes = f"V{want.dtype.itemsize}"  # NaN != NaN: rows are compared as bytes
            differ = np.flatnonzero(
                np.frombuffer(got[0].tobytes(), as_bytes) != np.frombuffer(want.tobytes(), as_bytes)
            )
            assert not len(differ), (
                f"fetch from {a}: rows differ at steps {want['step'][differ[:5]]}"
            )
        still.close()
        source.close()
        assert not tunnel_dir.exists()  # the private socket and its directory are gone
    finally:
        trainer.kill()


def test_attach_host_names_what_is_there(
    remote: dict[str, object], subprocess_env: dict[str, str]
) -> None:
    host = f"{getpass.getuser()}@127.0.0.1"
    trainer = Trainer(subprocess_env, "--steps", "0", "--rate", "100", "--name", "only-one")
    try:
        wait_for(lambda: trainer.published() > 10, timeout=30)
        with pytest.raises(SourceError, match="no live run on .* matches 'nope'.*only-one"):
            open_live(f"{host}:nope", None, remote)
        source, _, _ = open_live(f"{host}:", None, remote)  # HOST: takes the only live run
        assert source.meta.name == "only-one"  # type: ignore[attr-defined]
        source.close()  # type: ignore[attr-defined]
    finally:
        trainer.kill()


def test_a_frozen_ssh_link_costs_the_trainer_nothing_lets_a_held_pause_lapse_and_heals(
    remote: dict[str, object], subprocess_env: dict[str, str]
) -> None:
    """The link freezes for 60 s (the local ssh stopped: nothing closes, nothing moves) while the
    monitor holds a pause through it: the pause lapses with its lease, the trainer then steps at
    its usual rate, and when the link moves again the monitor catches up without a restart."""
    from nnwatch.channel.pause import KeptConnection

    trainer = Trainer(subprocess_env, "--steps", "0", "--rate", "400", "--name", "frozen-link")
    host = f"{getpass.getuser()}@127.0.0.1"
    try:
        wait_for(lambda: trainer.published() > 50, timeout=30)
        source = RemoteSource(host, "frozen-link", **remote)  # type: ignore[arg-type]
        state = RunState(source.meta)
        poll_until(source, lambda u, all_: state.ingest(u) is not None
                   and state.history.last_step > 50, timeout=30)  # fmt: skip
        t0, n0 = time.monotonic(), trainer.published()
        time.sleep(3)
        rate = (trainer.published() - n0) / (time.monotonic() - t0)
        line = KeptConnection(source.tunnel.local, timeout=10)  # renews its pause by itself
        assert line.send("pause").ok  # through the tunnel
        time.sleep(1)
        held = trainer.published()
        time.sleep(2)
        assert trainer.published() <= held + 1, "the pause did not hold"
        ssh = source.tunnel.proc
        assert ssh is not None
        os.kill(ssh.pid, signal.SIGSTOP)  # the link freezes
        try:
            time.sleep(40)  # the lease (30 s) lapses: the run steps again
            t1, n1 = time.monotonic(), trainer.published()
            assert n1 > held + 400, "a frozen link still held the pause"
            time.sleep(20)
            frozen_rate = (trainer.published() - n1) / (time.monotonic() - t1)
        finally:
            os.kill(ssh.pid, signal.SIGCONT)
        assert frozen_rate > 0.9 * rate, f"{frozen_rate:.0f} steps/s frozen, {rate:.0f} before"
        target = trainer.published()
        poll_until(source, lambda u, all_: state.ingest(u) is not None
                   and state.history.last_step >= target, timeout=60)  # fmt: skip
        line.close()
        source.close()
    finally:
        trainer.kill()
