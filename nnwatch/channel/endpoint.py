"""The training side of the channel, opened and closed in one call each: the one endpoint the
probe uses (its run files hold it, its step cycle hands it the command handler at each step
boundary), the synthetic trainer uses, and ``bench/channel.py`` measures.

A trainer needs four things per rank: a ring to publish into, a heartbeat, a command socket and
a registry entry that points monitors at both. Doing them in one place keeps their order right:
the ring exists before the entry that names it, the entry goes before the ring is marked
finished, and a failure of the socket (a path that is too long, a directory that is not ours)
costs only steering, never the ring. Several watches in one process (a notebook) each get their
own instance number, so their sockets and entries never collide.
"""

from __future__ import annotations

import contextlib
import logging
import threading
from pathlib import Path
from typing import Protocol

from nnwatch.channel.server import CommandServer, PendingCommand
from nnwatch.store.registry_entry import build_entry, register, socket_path, unregister
from nnwatch.store.ring import RingWriter
from nnwatch.store.ring_layout import ring_path
from nnwatch.store.schema import RunMeta

log = logging.getLogger("nnwatch")

#: Instance numbers of this process's endpoints that are open (``-w2`` sockets and up).
_open_instances: set[int] = set()
_lock = threading.Lock()


def _claim_instance() -> int:
    with _lock:
        n = 1
        while n in _open_instances:
            n += 1
        _open_instances.add(n)
        return n


class CommandTarget(Protocol):
    """What the pause loop steers: whoever applies the commands, and holds the pause state."""

    @property
    def holding(self) -> bool:
        """Hold the training thread at this step boundary (paused, not stopping, not ended)."""

    def apply_pending(self, commands: list[PendingCommand]) -> None:
        """Apply each command and reply to it (with the step at which it takes effect)."""


class RunEndpoint:
    """Ring + heartbeat + command server + registry entry for the calling process's run.

    ``ring.publish`` and :meth:`at_step_boundary` are for the training thread: the second hands the
    commands that came to a target that applies them, and waits while it holds a pause (a
    synthetic ``resume`` arrives when the connection that paused closes, or stops renewing its
    lease). ``heartbeat=None`` leaves the beats to the caller (the probe beats from its system
    sampler thread: ``ring.beat``). The ring's other parts (its capacity, the log's failure in
    its header) are the ring's own: ``ring.slots``, ``ring.set_log_error``.
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
        self.ring.set_status("running")
        self.server: CommandServer | None = None
        self.socket_path: Path | None = None
        self.problem: str | None = None  # why steering is off, in words
        self.entry_path: Path | None = None
        self.instance = _claim_instance()
        try:
            self._open(root, serve, subscribe_mode, cuda_devices)
        except BaseException:
            # each step on its own, and none may replace what is propagating: a cleanup error
            # raised here would turn a Ctrl-C into "live monitoring is off" and training on
            if self.server is not None:
                with contextlib.suppress(Exception):
                    self.server.close()
            with contextlib.suppress(Exception):
                self.ring.close("crashed", unlink=True)
            _open_instances.discard(self.instance)
            raise
        if heartbeat:
            self.ring.start_heartbeat(heartbeat)

    def _open(
        self, root: Path | None, serve: bool, subscribe_mode: str, cuda_devices: list[str] | None
    ) -> None:
        entry = build_entry(
            self.meta, run_dir=self.run_dir, ring=self.ring_path, socket=None,
            cuda_devices=cuda_devices,
        )  # fmt: skip
        entry["instance"] = self.instance
        if serve:
            try:
                self.socket_path = socket_path(self.meta.pid, self.meta.rank, root, self.instance)
                entry["socket"] = str(self.socket_path)
                self.server = CommandServer(
                    self.socket_path, hello=entry, subscribe_mode=subscribe_mode
                )
                self.server.start()
            except (OSError, ValueError) as exc:
                self.problem = f"commands from monitors are off ({exc}); monitors can still watch"
                log.warning("nnwatch: %s", self.problem)
                self.server = None
                self.socket_path = None
                entry["socket"] = None
        self.entry = entry
        try:
            self.entry_path = register(entry, root)
        except OSError as exc:
            log.warning("nnwatch: cannot register the run (%s); `nnwatch ls` will not list it", exc)

    # -- training thread: ``ring.publish`` (one call a record), then this at each step's end ----
    def at_step_boundary(self, target: CommandTarget, poll: float = 0.2) -> None:
        """Hand what monitors sent to ``target``, then hold the calling thread while the target
        is ``holding`` (a pause), handing it what arrives meanwhile; the ring says "paused"
        meanwhile.

        The one pause loop of every trainer (the probe's command handler and the synthetic
        trainer's controls are targets): the state lives in the target, the waiting here.
        """
        server = self.server
        if server is None or not server.pending:
            return  # the usual step: no command came (one truth test of a deque)
        commands = server.drain()
        target.apply_pending(commands)
        if target.holding:
            self.ring.set_status("paused")
            while target.holding:
                if server.wait(poll):  # a command came (a resume, a stop): apply it now
                    target.apply_pending(server.drain())
            self.ring.set_status("running")

    def close(self, status: str = "finished", *, remove_ring: bool = False) -> None:
        """Mark the ring ended, stop serving, unmap, unregister. Safe to call twice.

        The status goes first so that streams still being served read the run's end, not
        "lost"; readers that have the ring mapped keep their mapping even when it is removed.
        """
        if not self.ring.closed:
            self.ring.set_status(status)
        if self.server is not None:
            self.server.close()
            self.server = None
        self.ring.close(status, unlink=remove_ring)
        if self.entry_path is not None:
            unregister(self.entry_path)
            self.entry_path = None
        _open_instances.discard(self.instance)
