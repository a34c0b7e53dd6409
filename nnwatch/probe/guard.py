"""The non-finite guard: what happens when a step's gradients hold a NaN or an Inf.

Checked right before ``optimizer.step()`` (the one place where a sync pays for itself, see
DESIGN.md): on a measured step from the recorded total norm, on a light one from a few sentinel
parameters near the input. When it trips, the step is looked at closely: an unmeasured step's
forward is re-run with the layer hooks on (to find the layer where the NaN starts), the step is
snapshotted with its still-good weights, the detectors hear of it at once, the following steps are
all measured, and with ``skip_nonfinite`` the update is skipped.
"""

from __future__ import annotations

import math
from typing import Any, Protocol

import torch
from torch import nn

from nnwatch.probe.buffers import StepBuffers
from nnwatch.probe.layer_hooks import LayerHooks
from nnwatch.probe.run_files import RunFiles
from nnwatch.probe.schedule import Schedule
from nnwatch.probe.snapshot_taker import SnapshotTaker
from nnwatch.store.events import StepSkipped
from nnwatch.tensors.grad_norms import largest_finite, sentinel_params, sentinels_finite
from nnwatch.tensors.layers import LayerPlan


class GuardOwner(Protocol):
    """What the guard needs of the watch: the step, the detectors, events and warnings."""

    @property
    def step_index(self) -> int: ...

    @property
    def files(self) -> RunFiles:
        """Where the detectors are (``files.diagnosis``, from the first step on) and where events
        go (``files.event``)."""

    def warn_once(self, key: str, message: str) -> None: ...


class Guard:
    """Owns the sentinels, the step's forward arguments (for a re-run) and the tripped flag."""

    def __init__(
        self,
        model: nn.Module,
        plan: LayerPlan,
        buffers: StepBuffers,
        schedule: Schedule,
        layers: LayerHooks,
        snapshots: SnapshotTaker,
        owner: GuardOwner,
        skip_nonfinite: bool = False,
    ) -> None:
        self.model = model
        self.params = plan.params
        self.buf = buffers
        self.schedule = schedule
        self.layers = layers
        self.snapshots = snapshots
        self.owner = owner
        self.skip = skip_nonfinite  # drop the gradients of a bad step, so the update skips it
        #: a few parameters near the input, checked on light steps (:meth:`sentinels_finite`)
        self.sentinels = sentinel_params(plan.params, plan.param_layer_index)
        self._plan = plan
        self.inputs: tuple[Any, Any] | None = None  # this step's forward arguments (references)
        self.tripped = False  # non-finite gradients were seen in this run
        #: the largest finite gradient element of the step the guard last tripped on: a norm
        #: whose float32 sum overflowed has finite elements, which this shows
        self.grad_max = math.nan
        #: a sharded model (FSDP2, tensor parallel): its forward is collective, so a bad step's
        #: forward is not re-run on this rank alone (the others may not have seen the NaN)
        self.sharded = False

    def choose_sentinels(self) -> None:
        """Pick the sentinels again, once a lazy model's parameters have their sizes."""
        self.sentinels = sentinel_params(self._plan.params, self._plan.param_layer_index)

    def sentinels_finite(self) -> bool:
        """True unless a sentinel gradient holds NaN or Inf: the light step's whole guard.

        One torch sum and ``.item()`` (on CUDA the guard's one sync). Measured after a cache
        flush, that is cheaper than handing the gradient to numpy (~11 us against ~13).
        """
        return sentinels_finite(self.sentinels)

    def hit(self) -> None:
        """This step's gradients are not finite (called before its update)."""
        owner, sched = self.owner, self.schedule
        step = owner.step_index
        sched.after_trouble(step)
        self.grad_max = largest_finite(self.params)
        if not sched.measure and self.layers.present and self.layers.sums_always:
            sched.measure = True  # the forward's sums were taken anyway: this step is measured
        if not sched.measure and self.layers.present and not self.sharded:
            self.rerun_forward()
        elif self.layers.present:
            # a measured step: its layer sums are still in the hooks; the diagnosis reads them
            # from the buffers right away (unstored, they read as "not finite" in every layer)
            self.layers.store(self.buf)
        if not self.tripped:
            self.tripped = True
            self.snapshots.for_nonfinite()
        diagnosis = owner.files.diagnosis
        if diagnosis is not None:
            diagnosis.on_nonfinite_grads(step)
        if self.skip:
            for p in self.params:
                p.grad = None  # optimizers skip parameters without a gradient
            owner.files.event(StepSkipped(step=step, reason="nonfinite"))

    def rerun_forward(self) -> None:
        """Run a bad unmeasured step's forward again with the layer hooks on, to find its origin.

        It runs before ``optimizer.step()``, so the weights are the ones that produced the NaN;
        the RNG is set to its state at the start of the step (when the model draws from it) and
        restored after, and buffers (BatchNorm's running stats) are put back, so the training run
        goes on exactly as it would have. A forward that has side effects of its own, or that ran
        under autocast, may not reproduce the NaN: its origin then stays unknown.
        """
        if self.inputs is None:
            return
        args, kwargs = self.inputs
        model, layers, sched = self.model, self.layers, self.schedule
        rng = torch.get_rng_state()
        saved = [(b, b.detach().clone()) for b in model.buffers()]
        layers.arm(True)
        layers.rerun = True
        try:
            at_start = self.snapshots.rng_at_start
            if at_start is not None:
                torch.set_rng_state(at_start["torch"])
            with torch.no_grad():
                model(*args, **kwargs)
            sched.measure = True  # this step's layer sums now exist: record them
        except Exception as exc:  # noqa: BLE001 - the origin is a nicety; the finding still comes
            self.owner.warn_once("rerun", f"could not re-run the bad step's forward pass: {exc!r}")
            layers.clear_sums()
        finally:
            layers.rerun = False
            layers.arm(sched.measure or sched.sampled)
            torch.set_rng_state(rng)
            with torch.no_grad():
                for buf, value in saved:
                    buf.copy_(value)
        if sched.measure:
            layers.store(self.buf)  # the diagnosis reads them from the buffers right away
