"""Commands from monitors (``nnwatch.channel.commands``), applied by the training thread.

At each step's end the step cycle hands this handler to the run's endpoint, which drains the
command socket and gives it each validated command (:meth:`CommandHandler.apply_pending`); a
reply says at which step it took effect. This part owns what
the commands switch: the pause, the stop request and a bounded stretch of anomaly detection.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, ClassVar, Protocol

import torch

from nnwatch.channel.commands import (
    ANOMALY,
    PAUSE,
    RESUME,
    SET_CLIP,
    SET_LAYER_INTERVAL,
    SNAPSHOT,
    STOP,
)
from nnwatch.channel.server import PendingCommand
from nnwatch.probe.budget import CostBudget
from nnwatch.probe.grad_recorder import GradientRecorder
from nnwatch.probe.snapshot_taker import SnapshotTaker
from nnwatch.store.events import CommandApplied, Event


class EventSink(Protocol):
    """Where the run's events go (the run files' ``event``)."""

    def event(self, event: Event) -> None: ...


class CommandOwner(Protocol):
    """What the commands need of the watch: the step, and where events go."""

    @property
    def step_index(self) -> int: ...

    @property
    def closed(self) -> bool: ...

    @property
    def files(self) -> EventSink:
        """Where events go (``files.event``)."""


class CommandHandler:
    """Owns the pause, stop and anomaly-detection state that monitors steer."""

    def __init__(
        self,
        owner: CommandOwner,
        grads: GradientRecorder,
        budget: CostBudget,
        snapshots: SnapshotTaker,
    ) -> None:
        self.owner = owner
        self.grads = grads
        self.budget = budget
        self.snapshots = snapshots
        self.paused = False  # hold the training thread at the step boundary until resumed
        self.should_stop = False  # a monitor asked the training loop to stop
        self.anomaly_left = 0  # steps still run under torch's anomaly detection
        self.anomaly_prev: bool | None = None  # anomaly detection's setting before we turned it on
        #: What the reply carries, for commands that change a setting a monitor shows.
        self._shows: dict[str, Callable[[], dict[str, Any]]] = {
            SET_CLIP: lambda: {"max_norm": self.grads.override},
            SET_LAYER_INTERVAL: lambda: {"n": self.budget.layer_interval},
        }

    def apply(self, name: str, args: dict[str, Any]) -> tuple[bool, str, int]:
        """Apply one validated command; returns (ok, error, step at which it takes effect)."""
        at = self.owner.step_index
        handler = self.HANDLERS.get(name)
        if handler is None:
            return False, f"unknown command {name!r}", at
        error = handler(self, args)
        if error:
            return False, error, at
        self.owner.files.event(CommandApplied(command=name, args=args, step=at))
        return True, "", at

    @property
    def holding(self) -> bool:
        """Hold the training thread at the step boundary: paused, not asked to stop, not ended
        (the channel's pause loop asks, :meth:`~nnwatch.channel.endpoint.RunEndpoint.at_step_boundary`)."""
        return self.paused and not self.should_stop and not self.owner.closed

    def apply_pending(self, commands: list[PendingCommand]) -> None:
        """Apply what monitors sent, in order, and reply to each with the step it applies at and
        the setting it changed, as it now stands."""
        for cmd in commands:
            try:
                ok, error, at = self.apply(cmd.name, dict(cmd.args))
            except (KeyError, TypeError, ValueError) as exc:
                ok, error, at = False, f"bad arguments for {cmd.name}: {exc}", self.owner.step_index
            cmd.reply(at, ok, error, **self.reply_data(cmd.name))

    def reply_data(self, name: str) -> dict[str, Any]:
        """What the reply to ``name`` carries: the setting it changed, as it now stands."""
        show = self._shows.get(name)
        return show() if show is not None else {}

    # -- one handler per command the training thread applies (see nnwatch.channel.commands) -----
    # Each returns an error in words, or "" when it was applied.
    def _set_clip(self, args: dict[str, Any]) -> str:
        value = args.get("max_norm")
        self.grads.override = None if value is None else float(value)
        return ""

    def _set_layer_interval(self, args: dict[str, Any]) -> str:
        self.budget.set_layer_interval(int(args["n"]))
        return ""

    def _anomaly(self, args: dict[str, Any]) -> str:
        steps = max(1, int(args.get("steps", 1)))
        if self.anomaly_prev is None:
            self.anomaly_prev = torch.is_anomaly_enabled()
        torch.autograd.set_detect_anomaly(True)
        self.anomaly_left = steps
        return ""

    def _snapshot(self, args: dict[str, Any]) -> str:
        why = self.snapshots.preflight()  # a full disk: say so now, not promise a snapshot
        if why:
            return why
        self.snapshots.request(str(args.get("reason", "requested")))
        return ""

    def _stop(self, args: dict[str, Any]) -> str:
        self.should_stop = True
        return ""

    def _pause(self, args: dict[str, Any]) -> str:
        self.paused = True
        return ""

    def _resume(self, args: dict[str, Any]) -> str:
        self.paused = False
        return ""

    #: Every command the specification (nnwatch.channel.commands) says the training thread
    #: applies, by name; a test checks that the two agree.
    HANDLERS: ClassVar[dict[str, Callable[[CommandHandler, dict[str, Any]], str]]] = {
        SET_CLIP: _set_clip,
        SET_LAYER_INTERVAL: _set_layer_interval,
        ANOMALY: _anomaly,
        SNAPSHOT: _snapshot,
        STOP: _stop,
        PAUSE: _pause,
        RESUME: _resume,
    }

    def step_done(self) -> None:
        """One anomaly-detection step fewer; the last one puts torch's setting back."""
        self.anomaly_left -= 1
        if self.anomaly_left == 0:
            self.restore()

    def restore(self) -> None:
        """Put anomaly detection back as it was (at the end of the stretch, or of the run)."""
        if self.anomaly_prev is not None:
            torch.autograd.set_detect_anomaly(self.anomaly_prev)
            self.anomaly_prev = None
