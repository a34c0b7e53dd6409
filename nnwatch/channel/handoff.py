"""``subscribe``: hand a command connection over to a streamer of the run's history and records.

The stream is served by a separate process (``python -m nnwatch.channel.stream``) that reads the
ring and the run log from disk, so a remote monitor costs the trainer nothing more than the
hand-over; if that process cannot be started, a thread in this process serves it instead.
"""

from __future__ import annotations

import json
import logging
import os
import socket
import subprocess
import threading
import time
from pathlib import Path
from typing import Any

from nnwatch.store.child_python import CHILD_CWD, child_env, python_argv

log = logging.getLogger("nnwatch")

MODES = ("process", "thread", "off")


class StreamHandoff:
    """Starts streamers for subscribed connections and keeps track of them until close."""

    def __init__(self, hello: dict[str, Any], mode: str) -> None:
        if mode not in MODES:
            raise ValueError("subscribe_mode must be 'process', 'thread' or 'off'")
        self.mode = mode
        self.ring, self.run_dir = hello.get("ring"), hello.get("run_dir")
        self._children: list[subprocess.Popen[bytes]] = []
        self._threads: list[threading.Thread] = []

    def refusal(self) -> str:
        """Why this run cannot stream (empty when it can)."""
        if self.mode == "off":
            return "streaming is off for this run"
        if not self.ring or not self.run_dir:
            return "this run has no ring file to stream"
        return ""

    def hand_off(self, sock: socket.socket, owed: bytes, request: dict[str, Any]) -> None:
        """Send what the connection is still owed, then give ``sock`` to a streamer (a process,
        else a thread). ``sock`` belongs to the streamer afterwards; it is closed here if none
        could take it."""
        try:
            sock.settimeout(2.0)
            if owed:
                sock.sendall(owed)
            sock.settimeout(None)
        except OSError:
            sock.close()
            return
        ring, run_dir = str(self.ring), str(self.run_dir)
        if self.mode == "process":
            try:
                self._children.append(_spawn_streamer(sock, ring, run_dir, request))
                sock.close()
                return
            except OSError as exc:
                log.debug(
                    "nnwatch: cannot start a stream process (%r); streaming from a thread", exc
                )
        from nnwatch.channel.stream import serve_subscription

        def run() -> None:
            try:
                serve_subscription(sock, ring_path=Path(ring), run_dir=Path(run_dir),
                                   request=request, mode="thread")  # fmt: skip
            finally:
                sock.close()

        t = threading.Thread(target=run, name="nnwatch-stream", daemon=True)
        self._threads = [x for x in self._threads if x.is_alive()] + [t]
        t.start()

    def reap(self) -> None:
        """Forget stream processes that have ended (called now and then by the server)."""
        if self._children:
            self._children = [p for p in self._children if p.poll() is None]

    def join(self, timeout: float) -> None:
        """Let thread-served streams send their last records and "end" (processes go on alone)."""
        deadline = time.monotonic() + timeout
        for t in self._threads:
            t.join(timeout=max(0.0, deadline - time.monotonic()))


def _spawn_streamer(
    sock: socket.socket, ring: str, run_dir: str, request: dict[str, Any]
) -> subprocess.Popen[bytes]:
    fd = sock.fileno()
    return subprocess.Popen(
        python_argv(  # never importing from the trainer's working directory (see there)
            "nnwatch.channel.stream", "--fd", str(fd), "--ring", os.path.abspath(ring),
            "--run-dir", os.path.abspath(run_dir), "--request", json.dumps(request),
        ),
        pass_fds=(fd,),
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
        env=child_env(),
        cwd=CHILD_CWD,
    )  # fmt: skip
