"""What the dashboard says about a remote run that is catching up, reconnects and repeats itself
(Pilot). Catching up: the source is scripted, it hands the app exactly what a resumed stream
delivers. A reconnect: a real ``ConnectedSource`` over a real Unix socket, to a far end that
sends an event again when the stream resumes (it is the source that drops the repeat)."""

from __future__ import annotations

import asyncio
import base64
import json
import socket
import threading
from pathlib import Path
from typing import Any

import numpy as np

from nnwatch.sources.base import RunSource, SourceStatus, SourceUpdate
from nnwatch.sources.live import ConnectedSource
from nnwatch.store.schema import RunMeta
from nnwatch.testing.synthetic import make_meta
from nnwatch.testing.tui import fixed_hardware, wait_until
from nnwatch.tui.app import NNWatchApp
from nnwatch.tui.widgets.header import RunHeader

EVENT = {"type": "command", "name": "pause", "args": {}, "step": 50}


class ScriptedSource(RunSource):
    """Plays a list of (rows, events, status) polls, then repeats the last status with no data."""

    def __init__(
        self, script: list[tuple[range, list[dict[str, Any]], SourceStatus]], hold_after: int = 0
    ) -> None:
        self._meta = make_meta("far", 2)
        self.script = list(script)
        self.last = script[-1][2]
        #: after this many polls, repeat the latest status with no data until ``held`` is cleared
        self.hold_after = hold_after
        self.held = hold_after > 0
        self.polls = 0
        self.now = script[0][2]

    @property
    def meta(self) -> RunMeta:
        return self._meta

    def poll(self) -> SourceUpdate:
        schema = self._meta.schema
        self.polls += 1
        if self.held and self.polls > self.hold_after:
            steps, events, status = range(0), [], self.now
        else:
            steps, events, status = self.script.pop(0) if self.script else (range(0), [], self.last)
        self.now = status
        rows = np.zeros(len(steps), schema.scalar_dtype())
        rows["step"] = np.asarray(steps, np.float64)
        return SourceUpdate(rows, np.zeros(0, schema.layer_row_dtype()), list(events), status)


def header(app: NNWatchApp) -> str:
    return app.query_one(RunHeader)._picture.plain


def test_catching_up_is_shown_and_ends_in_live() -> None:
    # the source holds the catching-up status until the test has seen it: on a loaded machine
    # the app could otherwise take in every poll before the test's first look
    source = ScriptedSource([
        (range(0, 1000), [], SourceStatus("live", catching_up=(999, 283_000))),
        (range(1000, 1001), [], SourceStatus("live", catching_up=(1000, 283_000))),
        (range(1001, 1002), [], SourceStatus("live")),
    ], hold_after=2)  # fmt: skip
    app = NNWatchApp(source, hardware=fixed_hardware, fps=20)
    seen: list[str] = []

    async def main() -> None:
        async with app.run_test(size=(160, 48)) as pilot:
            await wait_until(pilot, lambda: "catching up" in header(app))
            seen.append(header(app))
            source.held = False
            await wait_until(pilot, lambda: "LIVE" in header(app))
            seen.append(header(app))

    asyncio.run(main())
    assert "catching up: 1,000 of 283,000" in seen[0] or "catching up: 999 of 283,000" in seen[0]
    assert "CATCHING UP" in seen[0] and "LIVE" not in seen[0]
    assert "catching up" not in seen[1]


class ResumingStream:
    """The far end of a ``subscribe`` over a real Unix socket: the first connection sends steps
    0-99, ``EVENT`` and "paused", then closes when ``drop`` is set (the tunnel went); the next one
    sends steps 100-119, ``EVENT`` again (a helper that starts ``events.jsonl`` over) and
    "running", and stays open until ``done``."""

    def __init__(self, path: Path) -> None:
        self.meta = make_meta("far", 2)
        self.drop, self.done = threading.Event(), threading.Event()
        self.requests: list[dict[str, Any]] = []
        self.listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.listener.bind(str(path))
        self.listener.listen(2)
        self.path = path
        threading.Thread(target=self._serve, daemon=True).start()

    def _send(self, conn: socket.socket, steps: range, state: str) -> None:
        rows = np.zeros(len(steps), self.meta.schema.scalar_dtype())
        rows["step"] = np.asarray(steps, np.float64)
        lines = [
            {"id": 1, "ok": True, "data": {"meta": self.meta.to_json()}},
            {"type": "scalars", "rows": len(rows), "data": base64.b64encode(rows.tobytes()).decode()},
            {"type": "events", "events": [EVENT], "offset": 100},
            {"type": "status", "state": state, "heartbeat_age": 0.0},
        ]
        conn.sendall(b"".join(json.dumps(x).encode() + b"\n" for x in lines))

    def _accept(self) -> socket.socket:
        conn, _ = self.listener.accept()
        buf = b""
        while not buf.endswith(b"\n"):
            buf += conn.recv(65536)
        self.requests.append(json.loads(buf))
        return conn

    def _serve(self) -> None:
        first = self._accept()
        self._send(first, range(0, 100), "paused")
        self.drop.wait(30)
        first.close()
        second = self._accept()
        self._send(second, range(100, 120), "running")
        self.done.wait(30)
        second.close()
        self.listener.close()


def test_events_repeated_by_a_reconnect_are_listed_once_and_a_pause_label_clears(
    tmp_path: Path,
) -> None:
    stream = ResumingStream(tmp_path / "far.sock")
    source = ConnectedSource(stream.path, timeout=5.0)
    app = NNWatchApp(source, hardware=fixed_hardware, fps=20)

    async def main() -> None:
        async with app.run_test(size=(160, 48)) as pilot:
            await wait_until(pilot, lambda: app.state.history.rows >= 100)
            await wait_until(pilot, lambda: "PAUSED" in header(app))
            app.show_outcome("paused at step 50", error=False)  # while the run is paused
            stream.drop.set()
            await wait_until(pilot, lambda: app.state.history.last_step >= 119)
            await wait_until(pilot, lambda: "LIVE" in header(app))
            assert "paused at step" not in header(app)
            assert [e for e in app.state.events if e.get("name") == "pause"] == [EVENT]

    try:
        asyncio.run(main())
    finally:
        stream.done.set()
    assert source.subscriptions == 2  # it resumed: after step 99, past the event it held
    args = stream.requests[1]["args"]
    assert args.get("after_step") == 99 and args.get("events_offset") == 100, stream.requests[1]
