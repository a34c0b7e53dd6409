"""The run as two lower layers read it: the snapshot writer and the live detectors.

Each view answers its layer's protocol (:class:`~nnwatch.diagnosis.snapshot.SnapshotSubject`,
:class:`~nnwatch.diagnosis.live.DiagnosedRun`) from the parts that hold the answer, the guard,
the snapshot taker, the buffers, the run files, so that the run object itself needs none of
those names and the layers below never hold it whole. A view reads its parts when asked, never a
copy: it is made before the first step and stays right as the run's schema and files change.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np
from torch import nn

from nnwatch.diagnosis.snapshot import RunPlace
from nnwatch.probe.optimizer_target import OptimizerTarget
from nnwatch.probe.options import WatchOptions
from nnwatch.probe.run_files import RunFiles
from nnwatch.store.events import Event
from nnwatch.store.finding import Finding
from nnwatch.store.finding_log import FindingLog
from nnwatch.store.schema import RunMeta, RunSchema

if TYPE_CHECKING:
    from nnwatch.probe._builder import Parts


class ViewedRun(RunPlace, Protocol):
    """What the views read of the run itself (the rest comes from its parts)."""

    @property
    def model(self) -> nn.Module: ...

    @property
    def optimizer(self) -> OptimizerTarget: ...

    @property
    def options(self) -> WatchOptions: ...

    @property
    def findings(self) -> FindingLog: ...

    @property
    def files(self) -> RunFiles: ...

    @property
    def parts(self) -> Parts: ...

    def warn_once(self, key: str, message: str) -> None: ...


class SnapshotView:
    """The run as a snapshot is taken of it (``SnapshotOwner``): its step, directory, records,
    model, the optimizer whose update the weights precede, and where failures are reported."""

    def __init__(self, run: ViewedRun) -> None:
        self._run = run
        #: a failed snapshot's finding goes straight to the run's findings
        self.add_finding: Callable[[Finding], None] = run.findings.add

    def log_event(self, event: Event) -> None:
        self._run.files.event(event)

    def warn_once(self, key: str, message: str) -> None:
        self._run.warn_once(key, message)

    @property
    def step_index(self) -> int:
        return self._run.step_index

    @property
    def run_dir(self) -> Path | None:
        return self._run.run_dir

    @property
    def name(self) -> str:
        return self._run.name

    @property
    def meta(self) -> RunMeta | None:
        return self._run.meta

    @property
    def schema(self) -> RunSchema:
        return self._run.schema

    @property
    def device(self) -> Any:
        return self._run.parts.buffers.device

    @property
    def model(self) -> nn.Module:
        return self._run.model

    @property
    def stepping_optimizer(self) -> Any:
        """The hooked torch optimizer (None when ``w.step()`` marks the update)."""
        return self._run.optimizer.hook

    @property
    def num_classes(self) -> int | None:
        return self._run.options.num_classes

    @property
    def findings(self) -> Sequence[Finding]:
        return self._run.findings.items

    def recent_records(self) -> np.ndarray:
        """Up to the last 500 step records, oldest first."""
        return self._run.files.recent_records(self._run.schema)

    def set_log_error(self, why: str) -> None:
        """Show ``why`` in the ring header, where monitors read the run's trouble."""
        channel = self._run.files.channel
        if channel is not None:
            channel.ring.set_log_error(why)


class DiagnosedView:
    """The run as the live detectors report to it (``DiagnosedRun``): findings and snapshot
    requests go to the run, the guard's state and this step's layer values come from the parts."""

    def __init__(self, run: ViewedRun) -> None:
        self._run = run
        #: the detectors' findings go straight to the run's findings (and events.jsonl)
        self.add_finding: Callable[[Finding], None] = run.findings.add

    @property
    def step_index(self) -> int:
        return self._run.step_index

    @property
    def guard_tripped(self) -> bool:
        """Non-finite gradients were seen before an update in this run."""
        return self._run.parts.guard.tripped

    def request_snapshot(self, reason: str) -> None:
        self._run.parts.snapshots.request(reason)

    def live_layer_state(self) -> tuple[np.ndarray | None, np.ndarray | None, float]:
        """This step's per-layer output sums and gradient norms, from the step buffers, and the
        largest finite gradient element the guard saw.

        Read only when the guard trips (on CUDA it syncs, but the guard has synced already).
        """
        parts = self._run.parts
        out: list[np.ndarray | None] = []
        for t in (parts.buffers.act_sum, parts.buffers.grad_layer):
            try:
                out.append(t.detach().float().cpu().numpy().copy() if t is not None else None)
            except Exception:  # noqa: BLE001 - a missing view only loses the origin, not the finding
                out.append(None)
        seen = parts.grads.grad_max  # taken before torch's clip zeroed an overflowed step
        return out[0], out[1], seen if seen == seen else parts.guard.grad_max
