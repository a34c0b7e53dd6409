"""The probe's end of the live channel: ring file, command socket and registry entry.

Created at the first ``w.step()`` (when the record layout is known). Publishing is one memcpy
into the ring; commands are applied here, by the training thread, at the step boundary; a pause
holds the training thread in :meth:`after_step` until a ``resume`` arrives, or until the
connection that asked for the pause closes (the server then queues a ``resume`` itself). It is
opened, steered and closed through :class:`~nnwatch.channel.endpoint.RunEndpoint`; only the hot
path skips it: ``publish`` is the ring's own method, bound once, so a record costs one call.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable
from pathlib import Path

from nnwatch.channel.endpoint import RunEndpoint
from nnwatch.probe.command_handler import CommandHandler
from nnwatch.probe.sysmon import SystemSampler
from nnwatch.store.schema import RunMeta

log = logging.getLogger("nnwatch")


class ChannelLink:
    """The probe's use of the one trainer-side endpoint (:class:`RunEndpoint`): beats from the
    system sampler's thread, commands applied by the training thread, a pause held here."""

    def __init__(
        self, commands: CommandHandler, sysmon: SystemSampler, meta: RunMeta, run_dir: Path
    ) -> None:
        #: what applies the commands and holds the pause state they steer
        self.commands = commands
        self.sysmon = sysmon
        self.endpoint = RunEndpoint(meta, run_dir, heartbeat=None)
        #: one record into the ring (the ring's own method, bound once: the hot path)
        self.publish: Callable[[bytes], None] = self.endpoint.ring.publish
        #: the ring's capacity, and where a failed log says why (the ring header)
        self.slots = self.endpoint.slots
        #: the ring file (the detectors' own process, when they move there, reads it)
        self.ring_path: Path = self.endpoint.ring_path
        self.set_log_error: Callable[[str], None] = self.endpoint.set_log_error
        self._beat = self.endpoint.beat
        sysmon.beats.append(self._beat)

    def after_step(self) -> None:
        """At the step boundary: apply what monitors sent; hold the thread while paused."""
        server = self.endpoint.server
        if server is None or not server.pending:
            return  # the usual step: no command came (checked here, on every step, for less)
        self.endpoint.at_step_boundary(self.commands)  # the handler applies, and holds a pause

    def close(self, status: str, *, remove_ring: bool = False) -> None:
        with contextlib.suppress(ValueError):
            self.sysmon.beats.remove(self._beat)
        self.endpoint.close(status, remove_ring=remove_ring)
