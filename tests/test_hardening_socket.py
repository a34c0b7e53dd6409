"""The command socket under abuse by a same-uid client: junk and endless lines are read at a
bounded rate, idle connections time out, and a real monitor always gets a slot."""

from __future__ import annotations

import socket
import time
from pathlib import Path

import pytest

from nnwatch.channel import server as server_mod
from nnwatch.channel.client import ChannelClient
from nnwatch.channel.server import CommandServer


def _raw(path: Path) -> socket.socket:
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.connect(str(path))
    return s


@pytest.fixture
def server(tmp_path: Path) -> CommandServer:
    srv = CommandServer(tmp_path / "s.sock", hello={"name": "t"}, subscribe_mode="off")
    srv.start()
    yield srv
    srv.close()


def test_a_junk_flood_is_read_at_a_bounded_rate(server: CommandServer) -> None:
    flood = _raw(server.path)
    flood.setblocking(False)
    junk = b'{"cmd": [1, 2, {"x": "' + b"j" * 200 + b'"}]}\n'
    t0 = time.monotonic()
    sent = 0
    while time.monotonic() - t0 < 1.5:
        try:
            sent += flood.send(junk * 50)
        except BlockingIOError:
            time.sleep(0.01)  # the server stopped reading: the flood waits on its own buffer
    elapsed = time.monotonic() - t0
    allowed = server_mod.LINES_BURST + server_mod.LINES_PER_S * (elapsed + 0.5)
    assert server.rejected <= allowed, (server.rejected, allowed)
    assert sent // len(junk) > server.rejected  # it did send more than was read
    assert server.throttled > 0
    with ChannelClient(server.path, timeout=5) as c:  # a real monitor is still served
        assert c.hello()["name"] == "t"
    flood.close()


def test_an_endless_line_is_discarded_at_a_bounded_rate(server: CommandServer) -> None:
    flood = _raw(server.path)
    flood.setblocking(False)
    t0 = time.monotonic()
    sent = 0
    while time.monotonic() - t0 < 1.0:
        try:
            sent += flood.send(b"x" * 65536)
        except BlockingIOError:
            time.sleep(0.01)
    assert sent < 4 * 1024 * 1024  # the writer was held back, not drained at memory speed
    assert server.throttled > 0
    with ChannelClient(server.path, timeout=5) as c:
        assert c.hello()["name"] == "t"
    flood.close()


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


def test_silent_connections_time_out_but_a_pause_holder_stays(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(server_mod, "HANDSHAKE_TIMEOUT", 0.3)
    monkeypatch.setattr(server_mod, "IDLE_TIMEOUT", 0.6)
    srv = CommandServer(tmp_path / "s.sock", hello={"name": "t"}, subscribe_mode="off")
    srv.start()
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
