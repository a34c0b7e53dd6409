"""The subscribe stream at real scale, over real Unix sockets: late attach with a ring far smaller
than the history, 0-row messages, resume instead of restart, events once, a stalled link.

The trainer is ``nnwatch.testing.synthetic`` (the real ring, run log and command socket); every
test compares what the monitor holds with the run log, step by step.
"""

from __future__ import annotations

import base64
import json
import socket
import threading
import time
from pathlib import Path

import numpy as np

from nnwatch.channel.client import Subscription
from nnwatch.sources.base import SourceError
from nnwatch.sources.live import ConnectedSource
from nnwatch.store.run_reader import load_run
from nnwatch.testing.synthetic import make_meta
from tests.integration.test_channel_faults import Trainer, poll_until, steps_of, wait_for


def _log_steps(trainer: Trainer) -> np.ndarray:
    return load_run(trainer.run_dir).scalars["step"].astype(np.int64)


def test_a_zero_row_records_message_loses_nothing(tmp_path: Path) -> None:
    """The issue's ``cannot reshape array of size 0``: a stream (an older helper) sends a
    ``records`` message with 0 rows because its batch held only dropped records. Every row read
    in that poll, before and after it, must still reach the monitor."""
    meta = make_meta("zero-rows", 4)
    schema = meta.schema
    path = tmp_path / "s.sock"
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(str(path))
    listener.listen(1)

    def b64(rows: np.ndarray) -> str:
        return base64.b64encode(rows.tobytes()).decode()

    def serve() -> None:
        conn, _ = listener.accept()
        conn.recv(65536)
        hist = np.zeros(100, schema.scalar_dtype())
        hist["step"] = np.arange(100)
        live = np.zeros(10, schema.record_dtype())
        live["step"] = np.arange(100, 110)
        lines = [
            {"id": 1, "ok": True, "data": {"meta": meta.to_json()}},
            {"type": "scalars", "rows": 100, "data": b64(hist)},
            {"type": "records", "rows": 0, "seq": 5, "dropped": 7, "torn": 0, "data": ""},
            {"type": "records", "rows": 10, "seq": 5, "dropped": 0, "torn": 0, "data": b64(live)},
        ]
        conn.sendall(b"".join(json.dumps(x).encode() + b"\n" for x in lines))
        time.sleep(5)
        conn.close()

    threading.Thread(target=serve, daemon=True).start()
    source = ConnectedSource(path, auto_reconnect=False)
    updates = poll_until(source, lambda u, all_: len(steps_of(all_)) >= 110, timeout=5)
    assert steps_of(updates) == list(range(110))
    source.close()
    listener.close()


def test_late_attach_with_a_tiny_ring_gets_every_step_and_no_false_drops(
    subprocess_env: dict[str, str],
) -> None:
    """The ring holds 64 records and the run has tens of thousands of steps: the ring wraps many
    times while the history goes out. Every step of the log arrives, once, and nothing is
    reported dropped, because the log had what the ring lost."""
    trainer = Trainer(subprocess_env, "--steps", "0", "--rate", "3000", "--slots", "64",
                      "--name", "tiny-ring")  # fmt: skip
    try:
        wait_for(lambda: trainer.published() > 20_000, timeout=60)
        source = ConnectedSource(trainer.socket)
        target = trainer.published() + 2000
        updates = poll_until(
            source, lambda u, all_: (steps_of(all_[-1:]) or [0])[-1] >= target, timeout=60
        )
        got = np.array(steps_of(updates))
        assert (np.diff(got) == 1).all() and got[0] == 0, "a step is missing or repeated"
        log = _log_steps(trainer)
        n = min(len(got), len(log))
        assert np.array_equal(got[:n], log[:n])
        assert updates[-1].status.dropped == 0, "steps the log holds were counted as dropped"
        source.close()
    finally:
        trainer.kill()


def test_reconnect_resumes_after_what_it_holds(subprocess_env: dict[str, str]) -> None:
    """``r`` (``reconnect``) sends what the monitor holds and receives only what is new: a few
    KB, not the history again; no step is lost or repeated, and events come once."""
    trainer = Trainer(subprocess_env, "--steps", "0", "--rate", "1000", "--name", "resume")
    try:
        wait_for(lambda: trainer.published() > 10_000, timeout=60)
        source = ConnectedSource(trainer.socket)
        assert source.command("set_layer_interval", n=3).ok  # one event in events.jsonl
        first = poll_until(
            source,
            lambda u, all_: len(steps_of(all_)) > 10_000 and any(x.events for x in all_),
            timeout=30,
        )
        history_bytes = source.received
        source.reconnect()
        second = poll_until(source, lambda u, all_: len(steps_of(all_)) > 300, timeout=30)
        resumed_bytes = source.received - history_bytes
        steps = np.array(steps_of(first + second))
        assert (np.diff(steps) == 1).all() and steps[0] == 0
        assert resumed_bytes < history_bytes / 10, (resumed_bytes, history_bytes)
        events = [e for u in first + second for e in u.events if e.get("type") == "command"]
        assert len(events) == 1, events
        assert source.subscriptions == 2
        source.close()
    finally:
        trainer.kill()


def test_a_stalled_link_costs_nothing_and_heals(subprocess_env: dict[str, str]) -> None:
    """A monitor that reads nothing for longer than the old 10 s send timeout: the stream
    process neither dies nor blocks the trainer; once the monitor reads again every step arrives
    (what the ring lost in the meantime is read from the log)."""
    trainer = Trainer(subprocess_env, "--steps", "0", "--rate", "2000", "--slots", "256",
                      "--name", "stall")  # fmt: skip
    try:
        wait_for(lambda: trainer.published() > 2000, timeout=30)
        sub = Subscription(trainer.socket, history=True)
        sub.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        before = trainer.published()
        time.sleep(12)  # the link stalls: nothing is read
        assert trainer.published() > before + 10_000  # the trainer went on at full rate
        steps: list[int] = []
        deadline = time.monotonic() + 60
        target = trainer.published()
        missing = 0
        while (not steps or steps[-1] < target) and time.monotonic() < deadline:
            assert not sub.lost, "the stream gave up on a stalled monitor"
            for msg in sub.poll(0.2):
                if msg["type"] == "scalars":
                    steps += [int(s) for s in msg["rows"]["step"]]
                elif msg["type"] == "records":
                    steps += [int(s) for s in msg["rows"]["step"]]
                elif msg["type"] == "gap":
                    missing += msg["missing"]
        got = np.array(steps)
        assert got[-1] >= target
        assert (np.diff(got) == 1).all() and got[0] == 0
        assert missing == 0
        sub.close()
    finally:
        trainer.kill()


def test_a_stale_forwarded_socket_says_what_to_do(tmp_path: Path) -> None:
    path = tmp_path / "old.sock"
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.bind(str(path))
    s.close()  # what a dead ssh -L leaves behind
    try:
        ConnectedSource(path)
    except SourceError as exc:
        assert f"rm {path}" in str(exc) and "StreamLocalBindUnlink" in str(exc)
    else:
        raise AssertionError("connected to a dead socket")
