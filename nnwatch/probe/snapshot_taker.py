"""Snapshots of one step: asked for ahead, prepared while the step runs, written at ``w.step()``.

A snapshot holds what an exact replay of the step needs: the batch, the RNG states at the start
of the step, and the weights (and optimizer state) from *before* its update. So a request arms
the next step at its forward start (RNG), the state is copied right before ``optimizer.step()``,
and :mod:`nnwatch.diagnosis.snapshot` writes it all when the step is recorded.
"""

from __future__ import annotations

import random
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np
import torch
from torch import nn

from nnwatch.diagnosis.snapshot import SnapshotSubject, preflight, write_snapshot
from nnwatch.diagnosis.snapshot_record import SnapshotRecords
from nnwatch.store.events import Event, SnapshotFailed, SnapshotTaken

if TYPE_CHECKING:
    from nnwatch.diagnosis.live import Diagnosis


class SnapshotOwner(SnapshotSubject, Protocol):
    """What taking a snapshot needs of the run: what the snapshot writer reads of it
    (:class:`~nnwatch.diagnosis.snapshot.SnapshotSubject`), and where events and warnings go."""

    def log_event(self, event: Event) -> None: ...

    def warn_once(self, key: str, message: str) -> None: ...


_default_generator = torch.default_generator


def capture_rng(full: bool = True) -> dict[str, Any]:
    """RNG states at the start of a step, for an exact replay of its forward pass.

    torch's own generators cost about 1 us and are taken on every guarded step of a model that
    draws random numbers; numpy's and Python's (about 40 us together) only when a snapshot was
    asked for ahead of the step, since a model's forward rarely draws from them.
    """
    state: dict[str, Any] = {"torch": _default_generator.get_state()}
    if torch.cuda.is_initialized():  # initialised implies available: one check, not two
        state["cuda"] = torch.cuda.get_rng_state_all()
    if full:
        state["numpy"] = np.random.get_state()
        state["python"] = random.getstate()
    return state


def to_cpu(obj: Any) -> Any:
    """A detached CPU copy of a nested structure of tensors (a state_dict, a batch)."""
    if isinstance(obj, torch.Tensor):
        return obj.detach().to("cpu", copy=True)
    if isinstance(obj, dict):
        return {k: to_cpu(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        items = [to_cpu(v) for v in obj]
        return type(obj)(items) if isinstance(obj, list) else tuple(items)
    return obj


def draws_random_numbers(model: nn.Module) -> bool:
    """Whether the forward pass may draw from the RNG (dropout and friends, by module type).

    Capturing the RNG state costs ~50 us a step on a CPU right after a step; a model without such
    modules replays exactly without it (functional ``F.dropout`` calls are not seen here: the
    replay then reports that it diverged).
    """
    random_types: tuple[type, ...] = (nn.modules.dropout._DropoutNd, nn.RReLU)
    return any(isinstance(m, random_types) or "dropout" in type(m).__name__.lower() for m in model.modules())


class SnapshotTaker:
    """Owns the pending snapshot request and what the step it arms keeps for it."""

    def __init__(self, model: nn.Module, optimizer: Any, scaler: Any, owner: SnapshotOwner) -> None:
        self.model = model
        self.optimizer = optimizer
        self.scaler = scaler
        self.owner = owner
        self.reason: str | None = None  # a snapshot is pending, and why
        self.armed = False  # a snapshot was pending when this step's forward began
        self._rng: dict[str, Any] | None = None  # the RNG states at this step's start, if taken
        self._torch_rng: torch.Tensor | None = None  # ... or torch's alone, on a guarded step
        self._cuda_rng: list[torch.Tensor] | None = None
        self.pre_state: dict[str, Any] | None = None  # the weights before this step's update
        self.random_forward = draws_random_numbers(model)
        #: the snapshots waiting for their step's record (see :meth:`register_with`)
        self.records = SnapshotRecords()

    def register_with(self, diagnosis: Diagnosis) -> None:
        """Have the detectors pass the records on, which completes each snapshot's record.json."""
        diagnosis.add_observer(self.records)

    @property
    def rng_at_start(self) -> dict[str, Any] | None:
        """The RNG states at the start of this step, when they were kept (see :meth:`arm`)."""
        if self._rng is None and self._torch_rng is not None:
            # a guarded step keeps the bare state (no dict per step): the dict is made when read
            self._rng = {"torch": self._torch_rng}
            if self._cuda_rng is not None:
                self._rng["cuda"] = self._cuda_rng
        return self._rng

    def request(self, reason: str = "requested") -> None:
        """Snapshot the next step: its batch, RNG, and the weights from before its update."""
        if self.reason is None:
            self.reason = reason

    def arm(self, guard: bool) -> None:
        """At a step's forward start: keep the RNG state when this step may be snapshotted.

        That is every step of a guarded model whose forward draws random numbers (the guard
        may snapshot and re-run any step), but there only torch's generators, without a dict.
        """
        if self.reason is not None:
            self.armed = True
            self._rng = capture_rng(full=True)
            self._torch_rng = self._cuda_rng = None
            return
        self.armed = False
        self._rng = None
        if guard and self.random_forward:
            # the guard may snapshot this step; its replay needs the RNG the forward drew from
            self._torch_rng = _default_generator.get_state()
            self._cuda_rng = torch.cuda.get_rng_state_all() if torch.cuda.is_initialized() else None
        else:
            self._torch_rng = self._cuda_rng = None

    def capture_state(self) -> dict[str, Any]:
        state: dict[str, Any] = {"model": to_cpu(self.model.state_dict())}
        opt = self.optimizer
        if opt is not None:
            if callable(getattr(opt, "state_dict", None)):
                state["optimizer"] = to_cpu(opt.state_dict())
            groups = getattr(opt, "param_groups", None) or []
            state["lr"] = [g.get("lr") for g in groups]
        if self.scaler is not None and hasattr(self.scaler, "state_dict"):
            state["scaler"] = self.scaler.state_dict()
        return state

    def for_nonfinite(self) -> None:
        """The guard tripped for the first time: this very step is snapshotted, before its update."""
        if not self.armed:
            self.reason = None  # a request that arrived mid-step gives way
        self.request("nonfinite")
        self.armed = True
        if self.pre_state is None:
            self.pre_state = self.capture_state()

    def preflight(self) -> str | None:
        """Why a snapshot would fail now (a full disk), or None: checked before one is promised."""
        return preflight(self.owner)

    def write(self, batch: Any) -> None:
        owner = self.owner
        reason = self.reason or "requested"
        self.reason = None
        state = self.pre_state or self.capture_state()
        self.pre_state = None
        rng = self.rng_at_start or capture_rng()
        try:
            path = write_snapshot(owner, reason=reason, state=state, rng=rng, batch=batch)
        except Exception as exc:  # noqa: BLE001 - a failed snapshot is a finding, never a crash
            owner.log_event(SnapshotFailed(step=owner.step_index, error=str(exc)))
            owner.warn_once("snapshot-failed", f"could not write the snapshot: {exc}")
            return
        self.records.expect(int(owner.step_index), path)
        owner.log_event(SnapshotTaken(step=owner.step_index, reason=reason, path=str(path)))
