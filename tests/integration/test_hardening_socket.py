"""The command socket under abuse by a same-uid client: junk and endless lines are read at a
bounded rate, many connections share one budget, a client sending only junk is closed, a connection
storm is accepted at a bounded rate while a real monitor still gets in, commands for the training
thread reach it at a bounded rate (none lost), idle connections time out, and a real monitor always
gets a slot. What this costs a real training loop is measured by ``bench/flood.py``."""

from __future__ import annotations

import json
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from nnwatch.channel.client import ChannelClient
from nnwatch.channel.limits import Limits
from nnwatch.channel.server import CommandServer

JUNK = b'{"cmd": [1, 2, {"x": "' + b"j" * 200 + b'"}]}\n'


def _raw(path: Path) -> socket.socket:
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.connect(str(path))
    return s


def _serve(tmp_path: Path, **limits: float) -> CommandServer:
    srv = CommandServer(
        tmp_path / "s.sock", hello={"name": "t"}, subscribe_mode="off", limits=Limits(**limits)
    )
    srv.start()
    return srv


@pytest.fixture
def server(tmp_path: Path) -> Iterator[CommandServer]:
    srv = _serve(tmp_path, bad_streak=10**9)  # junk connections stay: their rate is what is tested
    yield srv
    srv.close()


def _flood(socks: list[socket.socket], payload: bytes, seconds: float) -> tuple[int, float]:
    """Send ``payload`` on every socket for ``seconds`` without blocking; (bytes sent, elapsed)."""
    for s in socks:
        s.setblocking(False)
    t0 = time.monotonic()
    sent = 0
    while time.monotonic() - t0 < seconds:
        progress = False
        for s in socks:
            try:
                sent += s.send(payload)
                progress = True
            except BlockingIOError:
                pass
        if not progress:
            time.sleep(0.01)  # the server stopped reading: the flood waits on its own buffers
    return sent, time.monotonic() - t0


def test_a_junk_flood_is_read_at_a_bounded_rate(server: CommandServer) -> None:
    flood = _raw(server.path)
    sent, elapsed = _flood([flood], JUNK * 50, 1.5)
    lim = server.limits
    allowed = lim.first_lines + lim.lines_per_s * (elapsed + 0.5)
    assert 0 < server.rejected <= allowed, (server.rejected, allowed)
    assert sent // len(JUNK) > 10 * server.rejected  # it sent far more than was read
    assert server.throttled > 0
    with ChannelClient(server.path, timeout=5) as c:  # a real monitor is still served
        assert c.hello()["name"] == "t"
    flood.close()


def test_many_flooding_connections_share_one_budget(tmp_path: Path) -> None:
    srv = _serve(tmp_path, bad_streak=10**9, total_lines_per_s=40.0, lines_per_s=20.0)
    try:
        floods = [_raw(srv.path) for _ in range(8)]
        _, elapsed = _flood(floods, JUNK * 50, 1.5)
        # 8 connections at their own cap would be 160 lines/s; together they get 40
        allowed = 8 * srv.limits.first_lines + 40.0 * (elapsed + 0.5)
        assert 0 < srv.rejected <= allowed, (srv.rejected, allowed)
        with ChannelClient(srv.path, timeout=5) as c:
            assert c.hello()["name"] == "t"
        for s in floods:
            s.close()
    finally:
        srv.close()


def test_a_client_sending_only_junk_is_closed_with_the_reason(tmp_path: Path) -> None:
    srv = _serve(tmp_path, bad_streak=8, first_lines=64.0)
    try:
        s = _raw(srv.path)
        s.sendall(b"not json\n" * 20)
        s.settimeout(5)
        said = b""
        while chunk := s.recv(65536):
            said += chunk
        replies = [json.loads(x) for x in said.splitlines()]
        assert len(replies) == 9  # 8 refusals, then why it is closed
        assert "8 malformed requests in a row" in replies[-1]["error"]
        assert srv.rejected == 8 and srv.evicted == 1
    finally:
        srv.close()


def test_an_endless_line_is_discarded_at_a_bounded_rate(server: CommandServer) -> None:
    flood = _raw(server.path)
    sent, _ = _flood([flood], b"x" * 65536, 1.0)
    # what was read (a 16 KiB start, then 64 KiB/s) plus what the kernel buffers for the sender
    assert sent < 1024 * 1024
    assert server.throttled > 0
    with ChannelClient(server.path, timeout=5) as c:
        assert c.hello()["name"] == "t"
    flood.close()


def test_a_connection_storm_is_accepted_at_a_bounded_rate_and_a_monitor_gets_in(
    tmp_path: Path,
) -> None:
    srv = _serve(tmp_path, accepts_per_s=20.0, accepts_burst=5.0)
    stop = threading.Event()
    attempts = [0]

    def storm() -> None:
        while not stop.is_set():
            s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            s.settimeout(0.5)
            try:
                s.connect(str(srv.path))
                s.send(JUNK)
            except OSError:
                pass
            s.close()
            attempts[0] += 1

    threads = [threading.Thread(target=storm, daemon=True) for _ in range(4)]
    try:
        t0 = time.monotonic()
        for t in threads:
            t.start()
        time.sleep(1.0)
        with ChannelClient(srv.path, timeout=10) as c:  # waits its turn in the kernel's queue
            assert c.hello()["name"] == "t"
        elapsed = time.monotonic() - t0
        stop.set()
        for t in threads:
            t.join(timeout=5)
        assert srv.accepted <= 5 + 20.0 * (elapsed + 0.5), (srv.accepted, elapsed)
        assert attempts[0] > srv.accepted  # the storm wanted more than it got
    finally:
        stop.set()
        srv.close()


def test_commands_for_the_trainer_arrive_at_a_bounded_rate_and_none_is_lost(
    tmp_path: Path,
) -> None:
    srv = _serve(tmp_path, first_trainer=3.0, trainer_per_s=5.0, total_trainer_per_s=5.0)
    try:
        s = _raw(srv.path)
        s.sendall(b"".join(b'{"cmd": "resume", "id": %d}\n' % i for i in range(10)))
        time.sleep(0.3)
        early = srv.drain()
        assert 1 <= len(early) <= 3 + 5 * 0.5
        got = list(early)
        deadline = time.monotonic() + 10
        while len(got) < 10 and time.monotonic() < deadline:
            got += srv.drain()
            time.sleep(0.05)
        assert [c.id for c in got] == list(range(10))  # held, not refused, in order
        s.close()
    finally:
        srv.close()


def test_a_costly_command_has_a_rate_of_its_own_and_the_queue_a_bound(tmp_path: Path) -> None:
    srv = _serve(tmp_path, max_pending=2)
    try:
        with ChannelClient(srv.path, timeout=5) as c:
            c.sock.sendall(
                b'{"cmd": "snapshot", "id": 1}\n{"cmd": "snapshot", "id": 2}\n'
                b'{"cmd": "stop", "id": 3}\n{"cmd": "stop", "id": 4}\n'
            )
            replies = [json.loads(c._lines.readline(5) or b"{}") for _ in range(2)]
        by_id = {r["id"]: r for r in replies}
        assert "at most 1 a second" in by_id[2]["error"]  # snapshot's own rate (spec per_s)
        assert "the run is busy: 2 commands wait" in by_id[4]["error"]
        assert [p.id for p in srv.drain()] == [1, 3]
    finally:
        srv.close()


def test_a_real_monitor_gets_a_slot_past_idle_connections(server: CommandServer) -> None:
    idle = [_raw(server.path) for _ in range(server.max_connections)]
    deadline = time.monotonic() + 5
    while server.connections < server.max_connections and time.monotonic() < deadline:
        time.sleep(0.01)
    with ChannelClient(server.path, timeout=5) as c:
        assert c.hello()["name"] == "t"
        c.sock.sendall(b'{"cmd": "pause"}\n')  # holds a pause (nobody applies it here)
        time.sleep(0.2)
        others = [ChannelClient(server.path, timeout=5) for _ in range(3)]
        assert all(o.hello()["name"] == "t" for o in others)
        assert c.still_open()
        for o in others:
            o.close()
    assert server.evicted >= 4
    for s in idle:
        s.close()


def test_silent_connections_time_out_but_a_pause_holder_stays(tmp_path: Path) -> None:
    srv = _serve(tmp_path, handshake_timeout=0.3, idle_timeout=0.6)
    try:
        silent = _raw(srv.path)
        talker = ChannelClient(srv.path, timeout=5)
        assert talker.hello()["name"] == "t"
        holder = ChannelClient(srv.path, timeout=5)
        holder.sock.sendall(b'{"cmd": "pause"}\n')
        time.sleep(2.5)
        silent.settimeout(2)
        assert b"no request within" in silent.recv(4096)
        talker.sock.settimeout(2)
        said = b""
        while chunk := talker.sock.recv(4096):
            said += chunk
        assert b"idle for" in said  # told why, then closed
        holder.sock.settimeout(0.2)
        with pytest.raises(TimeoutError):
            holder.sock.recv(1)  # nothing said, still open
        assert srv.timed_out == 2
        holder.close()
        talker.close()
        silent.close()
    finally:
        srv.close()


def wait_until(cond: Any, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < deadline, "condition not met in time"
        time.sleep(0.02)


class _TrainingThread:
    """Applies commands at "step boundaries" like a trainer's thread, and keeps their names."""

    def __init__(self, srv: CommandServer) -> None:
        self.srv, self.names, self.stop = srv, [], threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        while not self.stop.is_set():
            for cmd in self.srv.drain():
                self.names.append(cmd.name)
                cmd.reply(0, True, "")
            time.sleep(0.02)


def test_a_pause_is_a_lease_that_lapses_when_its_holder_goes_silent(tmp_path: Path) -> None:
    """A frozen link (a holder that neither closes nor speaks) cannot hold a run paused; one that
    renews holds it past the lease, and learns when it has lost it."""
    from nnwatch.channel.commands import PAUSE, RENEW
    from nnwatch.channel.pause import KeptConnection

    srv = _serve(tmp_path, pause_lease=0.8)
    trainer = _TrainingThread(srv)
    try:
        kept = KeptConnection(srv.path, timeout=5, renew_s=0.2)  # renews by itself
        assert kept.send(PAUSE).ok
        deadline = time.monotonic() + 2.0  # over twice the lease: the renewals hold it
        while time.monotonic() < deadline:
            assert kept.holding, kept.lost
            time.sleep(0.05)
        assert trainer.names == ["pause"]
        kept.close()
        wait_until(lambda: trainer.names == ["pause", "resume"])  # closing lifts it

        silent = ChannelClient(srv.path, timeout=5)  # one that never renews
        assert silent.request(PAUSE).ok and silent.request(RENEW).data["held"] is True
        wait_until(lambda: trainer.names == ["pause", "resume", "pause", "resume"])
        silent.sock.settimeout(2)
        told = b""
        while b"\n" not in told:
            told += silent.sock.recv(4096)
        assert b"held a pause but sent nothing" in told  # the server lifted the pause itself
        silent.close()
    finally:
        trainer.stop.set()
        srv.close()
