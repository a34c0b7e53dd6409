"""Commands from monitors (``nnwatch.channel.commands``), applied by the training thread.

The channel link drains the command socket at a step boundary and hands each validated command
to :meth:`CommandHandler.apply`; a reply says at which step it took effect. This part owns what
the commands switch: the pause, the stop request and a bounded stretch of anomaly detection.
"""

from __future__ import annotations

from typing import Any, Protocol

import torch

from nnwatch.probe.budget import CostBudget
from nnwatch.probe.grad_recorder import GradientRecorder
from nnwatch.probe.snapshot_taker import SnapshotTaker


class CommandOwner(Protocol):
    """What the commands need of the watch: the step, and where events go."""

    @property
    def step_index(self) -> int: ...

    def log_event(self, event: dict[str, Any]) -> None: ...


class CommandHandler:
    """Owns the pause, stop and anomaly-detection state that monitors steer."""

    def __init__(
        self, owner: CommandOwner, grads: GradientRecorder, budget: CostBudget, snapshots: SnapshotTaker
    ) -> None:
        self.owner = owner
        self.grads = grads
        self.budget = budget
        self.snapshots = snapshots
        self.paused = False  # hold the training thread at the step boundary until resumed
        self.should_stop = False  # a monitor asked the training loop to stop
        self.anomaly_left = 0  # steps still run under torch's anomaly detection
        self.anomaly_prev: bool | None = None  # anomaly detection's setting before we turned it on

    def apply(self, name: str, args: dict[str, Any]) -> tuple[bool, str, int]:
        """Apply one validated command; returns (ok, error, step at which it takes effect)."""
        at = self.owner.step_index
        if name == "set_clip":
            value = args.get("max_norm")
            self.grads.override = None if value is None else float(value)
        elif name == "set_layer_interval":
            self.budget.set_layer_interval(int(args["n"]))
        elif name == "anomaly":
            steps = max(1, int(args.get("steps", 1)))
            if self.anomaly_prev is None:
                self.anomaly_prev = torch.is_anomaly_enabled()
            torch.autograd.set_detect_anomaly(True)
            self.anomaly_left = steps
        elif name == "snapshot":
            from nnwatch.diagnosis.snapshot import preflight

            why = preflight(self.owner)  # a full disk: say so now, not promise a snapshot
            if why:
                return False, why, at
            self.snapshots.request(str(args.get("reason", "requested")))
        elif name == "stop":
            self.should_stop = True
        elif name == "pause":
            self.paused = True
        elif name == "resume":
            self.paused = False
        else:
            return False, f"unknown command {name!r}", at
        self.owner.log_event({"type": "command", "command": name, "args": args, "step": at})
        return True, "", at

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
