"""``nnwatch attach HOST:RUN`` end to end through a real sshd on 127.0.0.1: the user's own ssh
finds the run with ``nnwatch ls --json`` on the host, forwards its socket to a private path, and
when the tunnel dies mid-catch-up it is started again and the stream resumes: every step equals
the run log, none missing, none twice.
"""

from __future__ import annotations

import getpass
import sys
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from nnwatch.channel.client import ChannelClient
from nnwatch.cli.attach import open_live
from nnwatch.sources.base import SourceError
from nnwatch.sources.remote import RemoteSource
from nnwatch.store.runlog import load_run
from tests.test_channel_faults import Trainer, poll_until, steps_of, wait_for
from tests.test_ssh_forward import Tunnel, pytestmark, tunnel  # noqa: F401 - fixture, skip mark

REPO = Path(__file__).resolve().parent.parent


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


def test_attach_host_run_survives_a_tunnel_killed_mid_catch_up(
    remote: dict[str, object], subprocess_env: dict[str, str]
) -> None:
    trainer = Trainer(subprocess_env, "--steps", "0", "--rate", "0", "--name", "far-away")
    host = f"{getpass.getuser()}@127.0.0.1"
    try:
        wait_for(lambda: trainer.published() > 300_000, timeout=60)
        pause = ChannelClient(trainer.socket)  # hold the run still while the monitor catches up
        assert pause.request("pause").ok
        wait_for(lambda: pause.request("hello").ok)
        source, _, job = open_live(f"{host}:far-away", None, remote)
        assert isinstance(source, RemoteSource) and job is None
        assert source.meta.name == "far-away"
        tunnel_dir = source.tunnel.dir
        assert source.tunnel.local.exists() and oct(tunnel_dir.stat().st_mode)[-3:] == "700"
        first = poll_until(source, lambda u, all_: len(steps_of(all_)) > 0, timeout=30)
        held = trainer.published()
        # usually still catching up when the link drops; on a fast, idle machine the first poll
        # can already hold every step (13 bytes a step): then the kill tests a reconnect after it
        if len(steps_of(first)) < held:
            assert first[-1].status.catching_up is not None
        source.tunnel.proc.kill()  # type: ignore[union-attr]
        pause.close()  # training goes on
        target = held + 1000
        rest = poll_until(
            source, lambda u, all_: (steps_of(all_[-1:]) or [0])[-1] >= target, timeout=90
        )
        assert source.tunnel.starts == 2 and source.subscriptions == 2
        got = np.array(steps_of(first + rest))
        assert got[0] == 0 and (np.diff(got) == 1).all(), "a step is missing or repeated"
        log = load_run(trainer.run_dir).scalars["step"].astype(np.int64)
        assert np.array_equal(got[: len(log)], log[: len(got)])
        assert rest[-1].status.dropped == 0 and rest[-1].status.state == "live"
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
