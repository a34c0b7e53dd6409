"""Process-level faults, each with real subprocesses: frozen and killed readers, a trainer killed
with ``kill -9``, a trainer that stops stepping, two monitors at once, a late monitor.

The trainer here is ``nnwatch.testing.synthetic``: the real ring, run log, command socket and
registry, driven by a loop that needs no torch (tests/integration/test_channel_probe.py repeats the key faults
with a real ``nnwatch.watch`` training loop).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from nnwatch.channel.client import ChannelClient
from nnwatch.sources.live import ConnectedSource, LiveSource
from nnwatch.store.registry import list_runs
from nnwatch.store.registry_gc import gc
from nnwatch.store.ring_reader import RingReader
from nnwatch.store.run_reader import load_run

PYTHON = sys.executable


class Trainer:
    """A synthetic trainer subprocess and the paths it announced."""

    def __init__(self, env: dict[str, str], *args: str) -> None:
        self.proc = subprocess.Popen(
            [PYTHON, "-m", "nnwatch.testing.synthetic", *args],
            stdout=subprocess.PIPE, text=True, env=env,
        )  # fmt: skip
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()
        if not line:
            raise AssertionError(f"the synthetic trainer died at start (rc {self.proc.wait()})")
        info = json.loads(line)
        self.pid = int(info["pid"])
        self.run_dir = Path(info["run_dir"])
        self.ring = Path(info["ring"])
        self.socket = Path(info["socket"])

    def published(self) -> int:
        with RingReader(self.ring) as r:
            return r.state().write_seq

    def finish(self, timeout: float = 30) -> dict[str, Any]:
        out, _ = self.proc.communicate(timeout=timeout)
        lines = [json.loads(x) for x in out.splitlines() if x.startswith("{")]
        return lines[-1] if lines else {}

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait(timeout=10)


@pytest.fixture
def trainers(subprocess_env: dict[str, str]) -> Iterator[Callable[..., Trainer]]:
    started: list[Trainer] = []

    def start(*args: str) -> Trainer:
        t = Trainer(subprocess_env, *args)
        started.append(t)
        return t

    yield start
    for t in started:
        t.kill()


def wait_for(cond: Callable[[], Any], timeout: float = 15.0, every: float = 0.02) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        value = cond()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"condition not met within {timeout} s")
        time.sleep(every)


def poll_until(source: Any, cond: Callable[[Any, list], bool], timeout: float = 15.0) -> list:
    """Poll a source, collecting updates, until ``cond(last_update, all_updates)`` holds."""
    updates: list = []

    def step() -> bool:
        updates.append(source.poll())
        return cond(updates[-1], updates)

    wait_for(step, timeout, every=0.05)
    return updates


def steps_of(updates: list) -> list[int]:
    parts = [u.scalars["step"] for u in updates if len(u.scalars)]
    return [int(s) for s in np.concatenate(parts)] if parts else []


_READER = textwrap.dedent(
    """
    import sys, time
    from nnwatch.store.ring_reader import RingReader
    r = RingReader(sys.argv[1])
    while True:
        n = len(r.read())
        print(n, r.dropped, flush=True)
        time.sleep(0.01)
    """
)


def test_frozen_then_killed_readers_never_block_the_trainer(
    trainers: Callable[..., Trainer], subprocess_env: dict[str, str]
) -> None:
    t = trainers("--steps", "0", "--rate", "500", "--slots", "64")
    ring_reader = subprocess.Popen(
        [PYTHON, "-c", _READER, str(t.ring)], stdout=subprocess.PIPE, text=True, env=subprocess_env
    )
    subscriber = subprocess.Popen(  # a remote-style monitor: its stream is served by the run
        [PYTHON, "-c", "import sys, time\nfrom nnwatch.sources.live import ConnectedSource\n"
         "s = ConnectedSource(sys.argv[1]); print('subscribed', flush=True)\n"
         "while True:\n    s.poll(); time.sleep(0.05)", str(t.socket)],
        stdout=subprocess.PIPE, text=True, env=subprocess_env,
    )  # fmt: skip
    try:
        assert ring_reader.stdout is not None and subscriber.stdout is not None
        ring_reader.stdout.readline()
        assert subscriber.stdout.readline().strip() == "subscribed"
        os.kill(ring_reader.pid, signal.SIGSTOP)
        os.kill(subscriber.pid, signal.SIGSTOP)
        # while both monitors are frozen, the trainer laps its 64-slot ring many times over
        frozen_at = t.published()
        wait_for(lambda: t.published() > frozen_at + 20 * 64, timeout=30)
        os.kill(ring_reader.pid, signal.SIGKILL)
        os.kill(subscriber.pid, signal.SIGKILL)
        killed_at = t.published()
        wait_for(lambda: t.published() > killed_at + 200, timeout=30)
        with ChannelClient(t.socket) as c:  # and it still answers commands promptly
            assert c.command("stop").ok
        result = t.finish()
        assert result["status"] == "stopped" and result["steps"] > killed_at + 200
        run = load_run(t.run_dir)
        steps = run.scalars["step"]
        assert len(steps) == result["steps"] and (np.diff(steps) == 1).all()  # nothing skipped
    finally:
        for p in (ring_reader, subscriber):
            p.kill()
            p.wait()


def test_kill_9_trainer_is_reported_crashed_and_its_files_stay_readable(
    trainers: Callable[..., Trainer],
) -> None:
    t = trainers("--steps", "0", "--rate", "200")
    local = LiveSource(t.run_dir, socket=t.socket)
    remote = ConnectedSource(t.socket)
    poll_until(local, lambda u, all_: len(steps_of(all_)) > 50)
    poll_until(remote, lambda u, all_: len(steps_of(all_)) > 50)
    t.proc.send_signal(signal.SIGKILL)
    t.proc.wait()
    killed = time.monotonic()
    updates = poll_until(local, lambda u, _: u.status.state == "crashed", timeout=2.0)
    local_delay = time.monotonic() - killed
    assert "gone" in updates[-1].status.message
    # the stream process outlives the trainer just long enough to say so
    updates = poll_until(remote, lambda u, _: u.status.state == "crashed", timeout=5.0)
    assert remote._sub.ended is not None and remote._sub.ended["state"] == "crashed"
    print(f"crash seen by the local reader {local_delay:.2f} s after kill -9")
    # the log and the ring stay readable
    run = load_run(t.run_dir)
    assert run.status == "crashed" and len(run.scalars) > 50
    with RingReader(t.ring) as r:
        assert len(r.read()) > 50
    # a new monitor can open the crashed run and gets all of its history
    late = LiveSource(t.run_dir)
    update = late.poll()
    assert update.status.state == "crashed" and len(update.scalars) == len(run.scalars)
    assert late.command("pause").ok is False
    (info,) = list_runs()
    assert info.state == "crashed"
    assert [r.pid for r in gc()] == [t.pid]
    for s in (local, remote, late):
        s.close()


def test_trainer_that_stops_stepping_is_reported_hung(
    trainers: Callable[..., Trainer], subprocess_env: dict[str, str]
) -> None:
    t = trainers("--steps", "0", "--rate", "200", "--hang-after", "40")
    source = LiveSource(t.run_dir, socket=t.socket, hung_min=0.5)
    updates = poll_until(source, lambda u, _: u.status.state == "hung", timeout=15)
    assert "no step for" in updates[-1].status.message
    assert steps_of(updates)[-1] == 40
    assert updates[-1].status.heartbeat_age is not None and updates[-1].status.heartbeat_age < 5
    ls = subprocess.run(
        [PYTHON, "-m", "nnwatch", "ls", "--json", "--hung-after", "0.5"],
        capture_output=True, text=True, env=subprocess_env, check=True,
    )  # fmt: skip
    (row,) = json.loads(ls.stdout)
    assert row["state"] == "hung" and row["live"] is True
    source.close()


def test_two_monitors_follow_and_steer_one_run(trainers: Callable[..., Trainer]) -> None:
    t = trainers("--steps", "0", "--rate", "300")
    a = LiveSource(t.run_dir)  # finds its socket through the registry
    b = ConnectedSource(t.socket)
    ua = poll_until(a, lambda u, all_: len(steps_of(all_)) > 100)
    ub = poll_until(b, lambda u, all_: len(steps_of(all_)) > 100)
    reply_a = a.command("set_layer_interval", n=3)
    reply_b = b.command("set_clip", max_norm=0.25)
    assert reply_a.ok and reply_b.ok
    assert reply_b.applies_at_step is not None and reply_a.applies_at_step is not None
    assert reply_b.applies_at_step >= reply_a.applies_at_step
    assert b.command("pause").ok
    ua += poll_until(a, lambda u, _: u.status.state == "paused")
    b.close()  # the monitor that paused goes away: the pause lifts itself
    ua += poll_until(a, lambda u, _: u.status.state == "live" and len(u.scalars) > 0)
    assert a.command("stop").ok
    ua += poll_until(a, lambda u, _: u.status.state == "finished")
    steps = steps_of(ua)
    assert steps == list(range(steps[-1] + 1))  # complete, in order, no duplicates
    assert len(steps_of(ub)) > 100
    events = [e for u in ua for e in u.events if e.get("type") == "command"]
    assert [e["name"] for e in events][:2] == ["set_layer_interval", "set_clip"]
    assert t.finish()["status"] == "stopped"
    a.close()


def test_late_monitor_gets_history_from_the_log_then_the_live_tail(
    trainers: Callable[..., Trainer],
) -> None:
    t = trainers("--steps", "0", "--rate", "300", "--slots", "64")
    wait_for(lambda: t.published() > 400)  # far more than the ring holds
    for source in (LiveSource(t.run_dir, socket=t.socket), ConnectedSource(t.socket)):
        updates = poll_until(source, lambda u, all_: len(steps_of(all_)) > 600)
        steps = steps_of(updates)
        assert steps[:400] == list(range(400))  # the start came from the log, not the ring
        assert steps == sorted(set(steps))  # no overlap between history and tail
        # a gap is only allowed where the reader fell behind the ring, and it is reported
        missing = steps[-1] + 1 - len(steps)
        assert missing <= updates[-1].status.dropped
        layer_steps = [int(s) for u in updates for s in u.layers["step"]]
        assert layer_steps == sorted(set(layer_steps)) and layer_steps[:2] == [0, 10]
        source.close()


def test_stream_served_from_a_thread_when_no_process_can_be_started(
    trainers: Callable[..., Trainer],
) -> None:
    """``subscribe_mode="thread"``: the fallback when the run cannot start a stream process."""
    t = trainers("--steps", "0", "--rate", "200", "--subscribe-mode", "thread")
    source = ConnectedSource(t.socket)
    assert source._sub.info["mode"] == "thread"
    updates = poll_until(source, lambda u, all_: len(steps_of(all_)) > 50)
    assert steps_of(updates) == list(range(len(steps_of(updates))))
    assert source.command("stop").ok
    poll_until(source, lambda u, _: u.status.state == "finished")
    assert t.finish()["status"] == "stopped"
    source.close()
