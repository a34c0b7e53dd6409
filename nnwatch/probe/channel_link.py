"""The probe's end of the live channel: ring file, command socket and registry entry.

Created at the first ``w.step()`` (when the record layout is known). Publishing is one memcpy
into the ring; commands are applied here, by the training thread, at the step boundary; a pause
holds the training thread in :meth:`after_step` until a ``resume`` arrives, or until the
connection that asked for the pause closes (the server then queues a ``resume`` itself).
"""

from __future__ import annotations

import contextlib
import logging
from pathlib import Path
from typing import Any, Protocol

from nnwatch.channel.endpoint import RunEndpoint
from nnwatch.channel.server import CommandServer
from nnwatch.probe.command_handler import CommandHandler
from nnwatch.probe.sysmon import SystemSampler
from nnwatch.store.schema import RunMeta, RunSchema

log = logging.getLogger("nnwatch")

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
    """The probe's use of the one trainer-side endpoint (:class:`RunEndpoint`): beats from the
    system sampler's thread, commands applied by the training thread, a pause held here."""

    def __init__(self, w: ChannelOwner) -> None:
        self.owner = w
        self.endpoint = RunEndpoint(w.meta, w.run_dir, heartbeat=None)
        self.ring = self.endpoint.ring
        self.ring_path = self.endpoint.ring_path
        w.sysmon.beats.append(self.ring.beat)

    @property
    def server(self) -> CommandServer | None:
        return self.endpoint.server

    @property
    def instance(self) -> int:
        return self.endpoint.instance

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
        with contextlib.suppress(ValueError):
            self.owner.sysmon.beats.remove(self.ring.beat)
        self.endpoint.close(status, remove_ring=remove_ring)
