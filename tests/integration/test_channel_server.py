"""The command socket, served for real, with a training-loop thread applying commands at step
boundaries: replies carry the step, bad input is refused cleanly, a pause lifts on disconnect,
and peers of another uid are turned away by the SO_PEERCRED check itself."""

from __future__ import annotations

import json
import os
import shutil
import socket
import stat
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from nnwatch.channel.client import ChannelClient, ChannelError
from nnwatch.channel.commands import MAX_REQUEST_BYTES
from nnwatch.channel.limits import Limits
from nnwatch.channel.server import CommandServer, PendingCommand


class LoopThread:
    """A stand-in training loop: applies commands at each step boundary, as the probe does."""

    def __init__(self, server: CommandServer) -> None:
        self.server = server
        self.step = 0
        self.paused = False
        self.should_stop = False
        self.applied: list[PendingCommand] = []
        self._quit = False
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _apply(self, cmds: list[PendingCommand]) -> None:
        for c in cmds:
            self.applied.append(c)
            if c.name == "pause":
                self.paused = True
            elif c.name == "resume":
                self.paused = False
            elif c.name == "stop":
                self.should_stop = True
            c.reply(self.step, True, "", paused=self.paused)

    def _run(self) -> None:
        while not self._quit:
            self._apply(self.server.drain())
            while self.paused and not self._quit:
                if self.server.wait(0.05):
                    self._apply(self.server.drain())
            self.step += 1
            time.sleep(0.001)

    def quit(self) -> None:
        self._quit = True
        self.thread.join(timeout=5)


@pytest.fixture
def served(tmp_path: Path) -> Iterator[tuple[CommandServer, LoopThread]]:
    server = CommandServer(tmp_path / "run.sock", hello={"name": "unit", "pid": os.getpid()})
    server.start()
    loop = LoopThread(server)
    yield server, loop
    loop.quit()
    server.close()


def _raw(path: Path) -> socket.socket:
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.settimeout(5)
    s.connect(str(path))
    return s


def _lines(sock: socket.socket, count: int) -> list[dict]:
    buf = b""
    while buf.count(b"\n") < count:
        chunk = sock.recv(65536)
        if not chunk:
            break
        buf += chunk
    return [json.loads(x) for x in buf.split(b"\n") if x]


def test_socket_is_owner_only(served: tuple[CommandServer, LoopThread]) -> None:
    server, _ = served
    assert stat.S_ISSOCK(os.lstat(server.path).st_mode)
    assert stat.S_IMODE(os.lstat(server.path).st_mode) == 0o600


def test_hello_and_commands_reply_with_the_step_they_apply_at(
    served: tuple[CommandServer, LoopThread],
) -> None:
    server, loop = served
    with ChannelClient(server.path) as c:
        hello = c.hello()
        assert hello["name"] == "unit" and "set_clip" in hello["commands"]
        reply = c.command("set_clip", max_norm=0.5)
        assert reply.ok and isinstance(reply.applies_at_step, int)
        assert reply.applies_at_step <= loop.step
        applied = [p for p in loop.applied if p.name == "set_clip"]
        assert applied and applied[0].args == {"max_norm": 0.5}
        assert c.command("stop").ok
        assert loop.should_stop


def test_drain_is_empty_without_commands(tmp_path: Path) -> None:
    server = CommandServer(tmp_path / "s.sock", hello={})
    server.start()
    try:
        assert server.drain() == []
        assert server.wait(0.01) is False
    finally:
        server.close()
    assert not (tmp_path / "s.sock").exists()


def test_malformed_oversize_and_unknown_are_refused_and_the_connection_goes_on(
    served: tuple[CommandServer, LoopThread],
) -> None:
    server, loop = served
    s = _raw(server.path)
    s.sendall(b"this is not json\n")
    s.sendall(b'{"cmd": "reboot", "id": 1}\n')
    s.sendall(b'{"cmd": "set_layer_interval", "id": 2, "args": {"n": -3}}\n')
    s.sendall(b"x" * (MAX_REQUEST_BYTES * 3))  # no newline: discarded up to the next one
    s.sendall(b"\n" + b'{"cmd": "hello", "id": 3}\n')
    replies = _lines(s, 5)
    assert [r["ok"] for r in replies] == [False, False, False, False, True]
    assert "not valid JSON" in replies[0]["error"]
    assert replies[1]["id"] == 1 and "unknown command" in replies[1]["error"]
    assert replies[2]["id"] == 2 and "between 1 and" in replies[2]["error"]
    assert "too large" in replies[3]["error"]
    assert replies[4]["id"] == 3 and replies[4]["data"]["name"] == "unit"
    assert not any(p.name == "set_layer_interval" for p in loop.applied)
    s.close()
    with ChannelClient(server.path) as c:  # the run goes on serving others
        assert c.command("resume").ok
    assert server.rejected == 4


def test_a_command_the_server_should_answer_but_cannot_is_refused_in_words(
    served: tuple[CommandServer, LoopThread],
) -> None:
    server, loop = served
    del server.answers["hello"]  # as if the spec had a server command this server lacks
    with ChannelClient(server.path) as c:
        reply = c.request("hello")
        assert not reply.ok and reply.error == "this run does not serve hello"
        assert c.command("resume").ok  # and the connection goes on
    assert not any(p.name == "hello" for p in loop.applied)


def test_pause_lifts_when_the_connection_that_asked_closes(
    served: tuple[CommandServer, LoopThread],
) -> None:
    server, loop = served
    c = ChannelClient(server.path)
    reply = c.command("pause")
    assert reply.ok and reply.data["paused"] is True
    step = loop.step
    time.sleep(0.2)
    assert loop.paused and loop.step == step  # the loop is held
    c.close()
    deadline = time.monotonic() + 5
    while loop.paused and time.monotonic() < deadline:
        time.sleep(0.01)
    assert not loop.paused
    resume = [p for p in loop.applied if p.name == "resume"]
    assert resume and resume[-1].synthetic and not resume[-1].connection_alive()


def test_pause_held_by_two_monitors_lifts_only_when_both_leave(
    served: tuple[CommandServer, LoopThread],
) -> None:
    server, loop = served
    a, b = ChannelClient(server.path), ChannelClient(server.path)
    assert a.command("pause").ok and b.command("pause").ok
    a.close()
    time.sleep(0.3)
    assert loop.paused
    b.close()
    deadline = time.monotonic() + 5
    while loop.paused and time.monotonic() < deadline:
        time.sleep(0.01)
    assert not loop.paused


def test_explicit_resume_from_anyone_lifts_the_pause(
    served: tuple[CommandServer, LoopThread],
) -> None:
    server, loop = served
    a, b = ChannelClient(server.path), ChannelClient(server.path)
    assert a.command("pause").ok
    assert b.command("resume").data["paused"] is False
    time.sleep(0.05)
    assert not loop.paused
    a.close()
    b.close()


def test_reply_never_blocks_even_when_the_client_reads_nothing(tmp_path: Path) -> None:
    lots = Limits(first_lines=256, lines_burst=256)  # all 201 requests are read at once
    server = CommandServer(tmp_path / "s.sock", hello={"blob": "y" * 50000}, limits=lots)
    server.start()
    try:
        s = _raw(server.path)
        s.sendall(b'{"cmd": "hello"}\n' * 200)  # ~10 MB of replies that nobody reads
        s.sendall(b'{"cmd": "stop"}\n')
        t0 = time.monotonic()
        # the server thread works through ~10 MB of replies first: a generous deadline for a
        # loaded machine (the point is that it gets there without a reader, not how fast)
        while not (cmds := server.drain()) and time.monotonic() - t0 < 120:
            time.sleep(0.01)
        assert [c.name for c in cmds] == ["stop"]
        cmds[0].reply(7)  # returns at once: the server thread owns the sending
        time.sleep(0.3)
        with ChannelClient(server.path) as c:  # and the server still serves others
            assert c.hello()["blob"] == "y" * 50000
        s.close()
    finally:
        server.close()


def test_stale_socket_file_is_replaced_but_a_live_one_is_not(tmp_path: Path) -> None:
    path = tmp_path / "s.sock"
    dead = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    dead.bind(str(path))
    dead.close()  # leaves the file with nobody listening, as a crashed run would
    first = CommandServer(path, hello={"n": 1})
    first.start()
    try:
        with pytest.raises(OSError, match="already serves"):
            CommandServer(path, hello={"n": 2}).start()
        with ChannelClient(path) as c:
            assert c.hello()["n"] == 1
    finally:
        first.close()


def test_client_errors_are_plain_words(tmp_path: Path) -> None:
    with pytest.raises(ChannelError, match="no socket at"):
        ChannelClient(tmp_path / "nothing.sock")
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.bind(str(tmp_path / "dead.sock"))
    s.close()
    with pytest.raises(ChannelError, match="nobody answers"):
        ChannelClient(tmp_path / "dead.sock")


def _as_other_user(path: Path, uid: int) -> dict:
    """Fork, drop to ``uid``, try the socket; report what happened through a pipe."""
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # child
        try:
            os.close(r)
            os.setgid(uid)
            os.setuid(uid)
            out: dict = {}
            try:
                s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
                s.settimeout(5)
                s.connect(str(path))
                out = {"connected": True}
                try:
                    s.sendall(b'{"cmd": "stop", "id": 1}\n')
                except OSError:
                    pass  # the refusal may already have closed the connection
                out["reply"] = s.recv(65536).decode(errors="replace")
            except OSError as exc:
                out.setdefault("connected", False)
                out["errno"] = exc.errno
            os.write(w, json.dumps(out).encode())
        finally:
            os._exit(0)
    os.close(w)
    data = b""
    while chunk := os.read(r, 65536):
        data += chunk
    os.close(r)
    os.waitpid(pid, 0)
    return json.loads(data)


needs_root = pytest.mark.skipif(os.getuid() != 0, reason="needs root to act as another uid")


@pytest.fixture
def world_dir() -> Iterator[Path]:
    """A directory other users can traverse (pytest's own tmp root is private to its owner)."""
    path = Path(tempfile.mkdtemp(prefix="nnw-peer-", dir="/tmp"))
    os.chmod(path, 0o755)
    yield path
    shutil.rmtree(path, ignore_errors=True)


@needs_root
def test_peer_of_another_uid_is_refused_by_so_peercred(world_dir: Path) -> None:
    public = world_dir / "public"
    public.mkdir()
    os.chmod(public, 0o777)
    server = CommandServer(public / "s.sock", hello={})
    server.start()
    loop = LoopThread(server)
    try:
        os.chmod(server.path, 0o666)  # file modes no longer protect it: only the uid check does
        result = _as_other_user(server.path, 65534)
        assert result["connected"] is True
        reply = json.loads(result["reply"])
        assert reply["ok"] is False and "refused" in reply["error"] and "65534" in reply["error"]
        assert server.refused == 1
        assert not loop.should_stop  # the stop it sent was never applied
        with ChannelClient(server.path) as c:  # the owner is still served
            assert c.command("resume").ok
    finally:
        loop.quit()
        server.close()


@needs_root
def test_socket_in_a_private_dir_is_unreachable_for_other_users(world_dir: Path) -> None:
    private = world_dir / "private"
    private.mkdir(mode=0o700)
    server = CommandServer(private / "s.sock", hello={})
    server.start()
    try:
        result = _as_other_user(server.path, 65534)
        assert result == {"connected": False, "errno": 13}  # EACCES
    finally:
        server.close()
