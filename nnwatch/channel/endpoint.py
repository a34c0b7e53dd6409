"""The training side of the channel, opened and closed in one call each.

A probe needs four things per rank: a ring to publish into, a heartbeat, a command socket and a
registry entry that points monitors at both. Doing them in one place keeps their order right:
the ring exists before the entry that names it, the entry goes before the ring is marked
finished, and a failure of the socket (a path that is too long, a directory that is not ours)
costs only steering, never the ring.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path

from nnwatch.channel.server import CommandServer, PendingCommand
from nnwatch.store.registry import (
    build_entry,
    register,
    ring_path,
    socket_path,
    unregister,
)
from nnwatch.store.ring import RingWriter
from nnwatch.store.schema import RunMeta

log = logging.getLogger("nnwatch")


class RunEndpoint:
    """Ring + heartbeat + command server + registry entry for the calling process's run.

    ``publish`` and ``drain`` are for the training thread; ``drain`` returns commands to apply at
    this step boundary (a synthetic ``resume`` arrives when the connection that paused closes).
    """

    def __init__(
        self,
        meta: RunMeta,
        run_dir: Path,
        *,
        root: Path | None = None,
        serve: bool = True,
        subscribe_mode: str = "process",
        heartbeat: float | None = 1.0,
        slots: int | None = None,
        cuda_devices: list[str] | None = None,
    ) -> None:
        self.meta = meta
        self.run_dir = Path(run_dir)
        self.ring_path = ring_path(self.run_dir, meta.rank)
        self.ring = RingWriter(
            self.ring_path, meta.schema.record_size, slots, meta_json=meta.to_json()
        )
        if heartbeat:
            self.ring.start_heartbeat(heartbeat)
        self.server: CommandServer | None = None
        self.socket_path: Path | None = None
        self.problem: str | None = None  # why steering is off, in words
        entry = build_entry(
            meta, run_dir=self.run_dir, ring=self.ring_path, socket=None, cuda_devices=cuda_devices
        )
        if serve:
            try:
                self.socket_path = socket_path(os.getpid(), meta.rank, root)
                entry["socket"] = str(self.socket_path)
                self.server = CommandServer(
                    self.socket_path, hello=entry, subscribe_mode=subscribe_mode
                )
                self.server.start()
            except (OSError, ValueError) as exc:
                self.problem = f"monitors cannot steer this run: {exc}"
                log.warning("nnwatch: %s", self.problem)
                self.server = None
                self.socket_path = None
                entry["socket"] = None
        self.entry = entry
        try:
            self.entry_path: Path | None = register(entry, root)
        except OSError as exc:
            self.entry_path = None
            log.warning("nnwatch: cannot register the run (%s); `nnwatch ls` will not list it", exc)

    # -- training thread -------------------------------------------------------------------------
    def publish(self, record: memoryview) -> None:
        self.ring.publish(record)

    def drain(self) -> list[PendingCommand]:
        server = self.server
        if server is None:
            return []
        return server.drain()

    def wait(self, timeout: float) -> bool:
        """Block until a command arrives (for a paused loop); False after ``timeout``."""
        if self.server is None:
            return False
        return self.server.wait(timeout)

    def set_status(self, status: str) -> None:
        self.ring.set_status(status)

    def close(self, status: str = "finished") -> None:
        """Mark the ring ended, stop serving, unregister, unmap. Safe to call twice.

        The status goes first so that streams served from threads of this process can still
        send monitors the run's end before the server waits for them.
        """
        if not self.ring.closed:
            self.ring.set_status(status)
        if self.server is not None:
            self.server.close()
            self.server = None
        if self.entry_path is not None:
            unregister(self.entry_path)
            self.entry_path = None
        self.ring.close(status)
