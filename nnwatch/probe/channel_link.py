"""The probe's end of the live channel: ring file, command socket and registry entry.

Created at the first ``w.step()`` (when the record layout is known). Publishing is one memcpy
into the ring; commands are applied here, by the training thread, at the step boundary; a pause
holds the training thread in :meth:`after_step` until a ``resume`` arrives, or until the
connection that asked for the pause closes (the server then queues a ``resume`` itself).
"""

from __future__ import annotations

import logging
import threading
from pathlib import Path
from typing import Any, Protocol

from nnwatch.channel.server import CommandServer
from nnwatch.probe.command_handler import CommandHandler
from nnwatch.probe.sysmon import SystemSampler
from nnwatch.store import registry
from nnwatch.store.ring import RingWriter
from nnwatch.store.schema import RunMeta, RunSchema

log = logging.getLogger("nnwatch")

#: Instance numbers of the watches of this process whose channel is open (see registry).
_open_instances: set[int] = set()
_lock = threading.Lock()


def _claim_instance() -> int:
    with _lock:
        n = 1
        while n in _open_instances:
            n += 1
        _open_instances.add(n)
        return n


class RankOf(Protocol):
    """This process's place in the job (``run_files.RankInfo``)."""

    @property
    def rank(self) -> int: ...


class ChannelOwner(Protocol):
    """What the channel needs of the watch: where the run is, and the state commands steer."""

    @property
    def rank(self) -> RankOf: ...

    @property
    def run_dir(self) -> Path: ...

    @property
    def schema(self) -> RunSchema: ...

    @property
    def meta(self) -> RunMeta: ...

    @property
    def sysmon(self) -> SystemSampler: ...

    @property
    def step_index(self) -> int: ...

    @property
    def closed(self) -> bool: ...

    @property
    def paused(self) -> bool: ...

    @property
    def should_stop(self) -> bool: ...

    @property
    def commands(self) -> CommandHandler: ...

    def apply_command(self, name: str, args: dict[str, Any]) -> tuple[bool, str, int]: ...


class ChannelLink:
    def __init__(self, w: ChannelOwner) -> None:
        self.owner = w
        rank = w.rank.rank
        self.ring_path = registry.ring_path(w.run_dir, rank)
        self.ring = RingWriter(self.ring_path, w.schema.record_size, meta_json=w.meta.to_json())
        self.ring.set_status("running")
        w.sysmon.beats.append(self.ring.beat)
        self.server: CommandServer | None = None
        self.entry_path: Path | None = None
        self.instance = _claim_instance()
        try:
            self._start(w, rank)
        except BaseException:
            w.sysmon.beats.remove(self.ring.beat)
            if self.server is not None:
                self.server.close()
            self.ring.close("crashed", unlink=True)
            _open_instances.discard(self.instance)
            raise

    def _start(self, w: ChannelOwner, rank: int) -> None:
        sock = None
        try:
            sock = registry.socket_path(w.meta.pid, rank, instance=self.instance)
            entry = registry.build_entry(w.meta, run_dir=w.run_dir, ring=self.ring_path, socket=sock)
            entry["instance"] = self.instance
            self.server = CommandServer(sock, hello=entry)
            self.server.start()
        except (OSError, ValueError) as exc:
            log.warning("nnwatch: commands from monitors are off (%s); monitors can still watch", exc)
            self.server = None
            entry = registry.build_entry(w.meta, run_dir=w.run_dir, ring=self.ring_path, socket=None)
            entry["instance"] = self.instance
        self.entry_path = registry.register(entry)

    def publish(self, record: memoryview) -> None:
        self.ring.publish(record)

    def event(self, event: dict[str, Any]) -> None:
        """Events reach monitors through ``events.jsonl``; nothing to do on the hot path."""

    def after_step(self) -> None:
        """At the step boundary: apply what monitors sent; hold the thread while paused."""
        server = self.server
        if server is None:
            return
        commands = server.drain()
        if not commands:
            return
        w = self.owner
        self._apply(w, commands)
        if w.paused:
            self.ring.set_status("paused")
            while w.paused and not w.should_stop and not w.closed:
                if server.wait(0.2):
                    self._apply(w, server.drain())
            self.ring.set_status("running")

    def _apply(self, w: ChannelOwner, commands: list[Any]) -> None:
        for cmd in commands:
            try:
                ok, error, at = w.apply_command(cmd.name, dict(cmd.args))
            except (KeyError, TypeError, ValueError) as exc:
                ok, error, at = False, f"bad arguments for {cmd.name}: {exc}", w.step_index
            cmd.reply(at, ok, error, **w.commands.reply_data(cmd.name))

    def close(self, status: str, *, remove_ring: bool = False) -> None:
        # status first: a stream still being served must read "finished", not "lost"
        self.ring.set_status(status)
        if self.server is not None:
            self.server.close()
        self.ring.close(status, unlink=remove_ring)  # attached readers keep their mapping
        if self.entry_path is not None:
            registry.unregister(self.entry_path)
        _open_instances.discard(self.instance)
