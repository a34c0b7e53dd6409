"""The gradient norms of one step, before and after clipping, whoever clips and however.

This part alone writes ``grad_norm``, ``grad_norm_clipped``, ``clipped``, ``nonfinite_grads``, the
per-layer gradient norms and the clip threshold. The pre-clip norm comes from the first of:

1. **torch's own clip** (``clip_grad_norm_``, ``get_total_norm``), seen through
   :mod:`nnwatch.probe.clip_intercept`: the value torch returned, bit for bit, on *every* step,
   at no cost; the threshold is the ``max_norm`` the user passed and ``clipped`` is
   ``norm > max_norm``. Per-layer norms are added on measured steps, from the same gradients
   before they are scaled. A clip over more than the watched model (a loss module with
   parameters of its own clipped with it) is recorded as torch computed it, over everything
   clipped. A model clipped in parts (an actor and a critic, each with its own call) is recorded
   once every part has been seen: the global norm is the root of the parts' squared norms (equal
   to torch's norm of the whole up to rounding), ``clipped`` says whether any part was clipped,
   and the threshold is the parts' ``max_norm`` when they share one. A clip by another norm
   (``norm_type=inf``) gives the threshold and ``clipped`` from torch's norm; the L2 norms stay
   those measured when backward ended, and the clipped one is scaled by the clip's coefficient.
2. **the end of backward**, on measured steps of a loop that does not clip with torch: the
   accumulated gradients right after the last backward of the step (gradient accumulation
   included: the micro-batch count of the previous step says which backward is the last), before
   any manual rescale or ``clip_grad_value_``. With a ``GradScaler`` the norms are divided by its
   scale. If the gradients have changed by the time of the update (clipped by value, rescaled by
   hand), the norm the update uses is measured too and recorded as the clipped norm.
3. **the update** (``optimizer.step()``'s pre-hook, or ``w.step()`` without an optimizer), when
   neither of the above ran (a backward that nnwatch could not see end).

Everything stays on the device; the only host reads are of CPU tensors.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import torch

from nnwatch.probe.buffers import DEV_INDEX, StepBuffers
from nnwatch.probe.clip_parts import (
    CLIP_EPS,
    ClipParts,
    coverage,
    finite,
    loss_scale,
    present_grads,
    still_scaled,
)
from nnwatch.probe.clip_record import clip_and_record, write_clip, write_parts_clip
from nnwatch.probe.grad_changes import GradChanges
from nnwatch.store.schema import FieldName
from nnwatch.tensors.grad_norms import (
    LayerReducer,
    global_norm,
    host_sum_of_squares,
    largest_finite,
    recorded_squares,
    squared_norms,
    total_norm,
)
from nnwatch.tensors.layers import LayerPlan

_GRAD_NORM = DEV_INDEX[FieldName.GRAD_NORM]
_NONFINITE_GRADS = DEV_INDEX[FieldName.NONFINITE_GRADS]
#: Steps without torch's clip before the recorder goes back to measuring at the end of backward.
FORGET_CLIP = 3


class GradientRecorder:
    """Owns the gradient fields of the step record and the clip threshold."""

    def __init__(
        self,
        plan: LayerPlan,
        buffers: StepBuffers,
        reducer: LayerReducer,
        scaler: Any = None,
        on_nonfinite: Callable[[], None] | None = None,
    ) -> None:
        self.plan = plan
        self.buf = buffers
        self.reducer = reducer
        self.scaler = scaler
        self.on_nonfinite = on_nonfinite  # the guard, for loops without an optimizer
        #: told when torch's norm is taken before ``scaler.unscale_()`` (see ``still_scaled``)
        self.on_scaled_norm: Callable[[], None] | None = None
        self.scaled_checks = SCALED_CHECKS  # torch norms still to check: the first show it or none
        self.override: float | None = None  # a threshold set from a monitor
        self.threshold = math.nan  # the clip threshold of this step, NaN when none was applied
        self.measure = True  # this step is one the cost budget measures in full
        self.done = False  # the pre-clip norm of this step is recorded
        self.from_torch = False  # ... and it came from torch's clip
        self.clip_seen = False  # a norm clip was applied this step (torch's or the override)
        self.total: torch.Tensor | float | None = None  # the recorded pre-clip norm
        self.backwards = 0  # backward passes that ended since the last step
        self.micro = 1  # backward passes per step, as last seen (gradient accumulation)
        self.torch_clips = 0  # recent steps clipped by torch; >0: expect it again
        self._at_backward_end = False  # the norm was taken when backward ended
        self._other_norm: torch.Tensor | None = None  # torch's non-L2 norm of this model's grads
        self._parts = ClipParts()  # this step's clips of parts of the model
        self.kept = math.nan  # grads_kept: 1.0 not cleared since the last update, 0.0 cleared
        self.layers_done = False  # this step's per-layer gradient norms are in the record
        self.changes = GradChanges()  # cleared between updates? changed before the update?
        self.cleared_params: Sequence[torch.Tensor] = plan.params  # zero_grad() clears these only
        self._host_norm = True  # the light norm through numpy (see ``light_norm``)
        self.grad_max = math.nan  # the largest finite element, when torch's norm was not (CPU)

    # -- helpers ---------------------------------------------------------------------------------
    def grads(self) -> tuple[list[int], list[torch.Tensor]]:
        return present_grads(self.plan.params)

    def _matches(self, grads: list[torch.Tensor], attr: str = "") -> bool:
        """Whether ``grads`` hold all of this model's gradients (others may come with them)."""
        return coverage(self.plan.params, grads, attr)[0] == "all"

    # -- measuring -------------------------------------------------------------------------------
    def measure_now(self, unscale: bool = False, layers: bool = True) -> torch.Tensor | float | None:
        """Global (and with ``layers``, per-layer) norms of the gradients as they are now.

        The global norm is taken on every step, measured or not: a spike between two measured
        steps is the very thing a monitor exists to see. Per-layer norms cost an index-add and
        stay on the steps the budget measures.
        """
        present, grads = self.grads()
        self.done = True
        if not grads:
            return None
        b = self.buf
        scale = loss_scale(self.scaler) if unscale else None
        if not layers and scale is None:  # the global norm alone, cheaply (unmeasured steps)
            self.layers_done, self.total = False, global_norm(grads, b.dev.device)
            _write_total(self.buf, self.total)
            return self.total
        sq, total = _squares(grads, b, scale)  # numpy on the CPU, device tensors elsewhere
        self.layers_done = layers
        if layers:
            host_layers = b.grad_layer_np
            if isinstance(sq, np.ndarray) and host_layers is not None:
                self.reducer.write_host(sq, present, host_layers)
            else:
                self.reducer.write(torch.as_tensor(sq), present, b.grad_layer, squared=True)
        _write_total(self.buf, total)
        self.total = total
        return total

    def light_norm(self) -> torch.Tensor | float | None:
        """The global norm alone (unmeasured step): numpy into the CPU record, else measure_now."""
        host = self.buf.dev_np
        sq = None
        if host is not None and self.scaler is None and self._host_norm:
            sq = host_sum_of_squares(p.grad for p in self.plan.params)
            self._host_norm = sq is not None  # else a kind numpy does not take: torch's from now
        if host is None or sq is None:
            return self.measure_now(unscale=True, layers=False)
        self.done, self.layers_done, self.total = True, False, math.sqrt(sq)
        _write_host_norm(host, self.total)
        return self.total

    def _norm_of_now(self) -> torch.Tensor | float | None:
        """The global norm of the current gradients, recorded nowhere (the post-clip check)."""
        _, grads = self.grads()
        return _squares(grads, self.buf, None)[1] if grads else None

    def on_backward_end(self) -> None:
        """The autograd engine finished a backward pass that reached the model's parameters."""
        self.backwards += 1
        self.changes.had_grad = bool(self.plan.params) and self.plan.params[-1].grad is not None
        if self.torch_clips > 0 or self.backwards < self.micro:
            return
        if not self.measure:
            self.light_norm()  # the global norm, every step
            self.from_torch = False
            return
        self.measure_now(unscale=True)
        self.from_torch = False
        self._at_backward_end = True
        self.changes.remember(self.plan.params)

    def see_cleared(self) -> None:
        """At the update: were the last update's gradients cleared before this one's backward?"""
        self.kept = self.changes.see_cleared(self.cleared_params, self.backwards)

    def _check_scaled(self) -> None:
        self.scaled_checks -= 1
        if self.on_scaled_norm is not None and still_scaled(self.scaler):
            self.scaled_checks = 0
            self.on_scaled_norm()  # torch's norm of gradients the AMP loss scale still multiplies

    # -- torch's clip (clip_intercept listener) --------------------------------------------------
    def on_total_norm(self, grads: list[torch.Tensor], norm_type: float, total: torch.Tensor) -> None:
        if self.from_torch:
            return  # the step's pre-clip norm is in: a later call sees clipped gradients
        cover, ids = coverage(self.plan.params, grads)
        if cover == "none":
            return
        if self.scaler is not None and self.scaled_checks > 0:
            self._check_scaled()
        if norm_type != 2.0:
            if cover == "all":
                self._other_norm = total  # its clip is recorded against it, see on_clip
            return
        if cover == "part":
            self._on_part_norm(ids, total)
            return
        _write_total(self.buf, total)
        bad = total.is_cpu and not math.isfinite(float(total))  # a CPU scalar: no sync
        if bad or (self.measure and not self.done):  # per layer, from the same unclipped grads
            self._layer_norms(None)  # (on a bad step to tell an overflow from a bad element)
        if bad:
            self.grad_max = largest_finite(self.plan.params)
        self._took_torch_total(total)

    def _took_torch_total(self, total: torch.Tensor | float) -> None:
        self.total = total
        self.done = self.from_torch = True
        self._at_backward_end = False
        if self.on_nonfinite is not None and not self.finite(total):
            self.on_nonfinite()

    def _layer_norms(self, only: set[int] | None) -> None:
        """Per-layer norms of this model's gradients as they are now."""
        self.layers_done = True
        present, sq = _layer_squares(self.plan.params, self.buf.dev.device, only)
        if sq is not None:
            _write_layer_squares(self.buf, self.reducer, present, sq)

    def _on_part_norm(self, ids: set[int], total: torch.Tensor) -> None:
        """torch's norm of a part of the model: recorded once the parts cover the whole model."""
        parts = self._parts
        if not parts.add_norm(ids, total):
            return  # a part seen twice: not one clip in parts
        if self.measure and not self.done:  # this part's per-layer norms, before it is scaled
            present, sq = _layer_squares(self.plan.params, self.buf.dev.device, ids)
            if sq is not None:
                parts.layers.append((present, sq))
        ours = {id(p.grad) for p in self.plan.params if p.grad is not None}
        if parts.ids == ours:
            if parts.layers:  # written once: each write covers every layer
                _write_layer_squares(
                    self.buf,
                    self.reducer,
                    [i for present, _ in parts.layers for i in present],
                    torch.cat([sq for _, sq in parts.layers]),
                )
            whole = parts.whole()
            _write_total(self.buf, whole)
            self._took_torch_total(whole)

    def clip_limit(self, params: list[torch.Tensor], max_norm: float) -> float:
        if self.override is not None and self._matches(params, "grad"):
            return self.override
        return max_norm

    def on_clip(self, params: list[torch.Tensor], max_norm: float, total: torch.Tensor) -> None:
        if self._other_norm is not None and total is self._other_norm:
            self._other_norm = None
            self.record_clip(total, max_norm, l2=self.total if self.done else math.nan)
            return
        parts = self._parts
        if parts.norms and parts.add_clip(total, max_norm):
            if self.from_torch and parts.complete():
                self.record_parts_clip(parts)
                self.torch_clips = FORGET_CLIP
            return
        # the total torch just computed over this model's gradients: no second look at them
        if not (self.from_torch and total is self.total) and not self._matches(params, "grad"):
            return
        self.record_clip(total, max_norm)
        if self.from_torch:
            self.torch_clips = FORGET_CLIP

    def on_value_clip(self, params: list[torch.Tensor], clip_value: float) -> None:
        """Clipping by value: its effect is measured at the update, like a manual rescale."""

    # -- clipping --------------------------------------------------------------------------------
    def record_clip(
        self, total: torch.Tensor | float, max_norm: float, l2: torch.Tensor | float | None = None
    ) -> None:
        """A norm clip with ``max_norm`` was applied to gradients whose norm was ``total``.

        ``l2``: the L2 norm of those gradients, when ``total`` is another norm (the clip scales
        every gradient by the same coefficient, so the clipped L2 norm is ``l2`` times it).
        """
        self.threshold = float(max_norm)
        self.clip_seen = True
        write_clip(self.buf, total, max_norm, l2)

    def record_parts_clip(self, parts: ClipParts) -> None:
        """Every part of the model was clipped by torch: one clip record for the whole."""
        self.threshold = parts.limit
        self.clip_seen = True
        write_parts_clip(self.buf, parts)

    def clip(
        self,
        params: list[torch.Tensor],
        max_norm: float | None,
        norm_type: float,
        error_if_nonfinite: bool,
        foreach: bool | None,
        *,
        per_layer: bool,
        record: bool,
        warn: Callable[[str, str], None],
    ) -> torch.Tensor:
        """``w.clip_grad_norm_``: clip like torch (bitwise) at ``max_norm`` or the monitor's
        threshold, and record both norms (with ``record``; the per-layer ones with ``per_layer``,
        when the model's own parameters are clipped). Returns the total norm, as torch does."""
        limit = self.override if self.override is not None else max_norm
        return clip_and_record(
            self, params, limit, norm_type, error_if_nonfinite, foreach,
            per_layer=per_layer, record=record, warn=warn,
        )  # fmt: skip

    def apply_override(self) -> None:
        """A monitor set a threshold and nobody clipped this step: clip here, as torch would."""
        total = self.total if self.done else self.measure_now()
        if total is None or self.override is None:
            return
        _, grads = self.grads()
        t = torch.as_tensor(total)
        coef = (self.override / (t + CLIP_EPS)).clamp(max=1.0)
        torch._foreach_mul_(grads, coef.to(grads[0].device))
        self.record_clip(t, self.override)

    def at_update(self) -> torch.Tensor | float | None:
        """Right before the update: fill in what is missing. Returns the pre-clip norm, if known."""
        self.see_cleared()
        if not self.done and (self.measure or self.override is not None):
            self.measure_now()
        elif not self.done:
            self.measure_now(layers=False)  # the global norm, every step
        elif self._at_backward_end and not self.clip_seen and loss_scale(self.scaler) is None:
            self.changes.check_changed(self.buf, self._norm_of_now)
        if self.override is not None and not self.clip_seen:
            self.apply_override()
        return self.total if self.done else None

    finite = staticmethod(finite)

    # -- step boundary ---------------------------------------------------------------------------
    def end_step(self, measure_next: bool) -> None:
        """Reset for the next step; learn the micro-batch count and whether torch clips."""
        if self.backwards:
            self.micro = self.backwards
        if self.torch_clips and not self.from_torch:
            self.torch_clips -= 1
        self.backwards = 0
        self.done = self.from_torch = self.clip_seen = self._at_backward_end = False
        self.total = None
        self.changes.sentinel, self.changes.had_grad = None, False
        self._other_norm = None
        if self._parts.norms:
            self._parts = ClipParts()
        self.threshold = math.nan
        self.measure = measure_next
        self.kept = math.nan
        self.grad_max = math.nan
        self.layers_done = False


def _squares(
    grads: list[torch.Tensor], b: StepBuffers, scale: torch.Tensor | None
) -> tuple[np.ndarray | torch.Tensor, torch.Tensor | float]:
    """Each gradient's squared norm and the global norm (see :func:`recorded_squares`), unscaled
    by the AMP ``scale`` when one is given; numpy arrays for a CPU record."""
    if scale is None:
        sq, total = recorded_squares(grads, b.dev.device)
    else:
        sq = squared_norms(grads, b.dev.device)
        sq = sq / scale.to(sq.device, sq.dtype).square()
        total = total_norm(sq)  # a float on the CPU, a device tensor on a GPU
    return (sq.numpy() if isinstance(sq, torch.Tensor) and b.dev_np is not None else sq), total


def _write_total(b: StepBuffers, total: torch.Tensor | float) -> None:
    """The recorded pre-clip norm into the step record: as a number on the CPU (no sync), on
    the device elsewhere."""
    host = b.dev_np
    if host is not None:
        _write_host_norm(host, float(total))  # a CPU tensor or a float: no sync
    else:
        t = torch.as_tensor(total).detach()
        b.slot(FieldName.NONFINITE_GRADS).copy_(~torch.isfinite(t))
        b.slot(FieldName.GRAD_NORM).copy_(t.to(b.dev.device))


def _write_host_norm(host: Any, value: float) -> None:
    """The global norm and its non-finite flag into the CPU record (float64: kept as it is)."""
    host[_GRAD_NORM] = value
    host[_NONFINITE_GRADS] = 0.0 if math.isfinite(value) else 1.0
SCALED_CHECKS = 16  # torch norms checked for a clip before scaler.unscale_() (see on_total_norm)


def _layer_squares(
    params: Sequence[torch.Tensor], device: torch.device, only: set[int] | None
) -> tuple[list[int], torch.Tensor | None]:
    """Squared norms of the gradients of ``params`` as they are now (``only``: of those ids),
    with the indices of their parameters (the per-layer norms taken beside torch's clip)."""
    present, ours = present_grads(params)
    if only is not None:
        keep = [k for k, g in enumerate(ours) if id(g) in only]
        present, ours = [present[k] for k in keep], [ours[k] for k in keep]
    if not ours:
        return present, None
    return present, squared_norms(ours, device)


def _write_layer_squares(
    b: StepBuffers, reducer: LayerReducer, present: list[int], sq: torch.Tensor
) -> None:
    """Per-parameter squared norms into the record's per-layer gradient norms."""
    if b.dev_np is not None and b.grad_layer_np is not None:
        reducer.write_host(sq.numpy(), present, b.grad_layer_np)
    else:
        reducer.write(sq, present, b.grad_layer, squared=True)
