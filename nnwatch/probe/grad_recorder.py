"""The gradient norms of one step, before and after clipping, whoever clips and however.

This part alone writes ``grad_norm``, ``grad_norm_clipped``, ``clipped``, ``nonfinite_grads``, the
per-layer gradient norms and the clip threshold. The pre-clip norm comes from the first of:

1. **torch's own clip** (``clip_grad_norm_``, ``get_total_norm``), seen through
   :mod:`nnwatch.probe.clip_intercept`: the value torch returned, bit for bit, on *every* step,
   at no cost; the threshold is the ``max_norm`` the user passed and ``clipped`` is
   ``norm > max_norm``. Per-layer norms are added on measured steps, from the same gradients
   before they are scaled.
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
from collections.abc import Callable
from typing import Any

import torch

from nnwatch import grad as gradmath
from nnwatch.probe.buffers import DEV_INDEX, StepBuffers
from nnwatch.tensors.grad_norms import LayerReducer, squared_norms, total_norm
from nnwatch.tensors.layers import LayerPlan

_GRAD_NORM = DEV_INDEX["grad_norm"]
_NONFINITE_GRADS = DEV_INDEX["nonfinite_grads"]
_NORM_CLIPPED = DEV_INDEX["grad_norm_clipped"]
_CLIPPED = DEV_INDEX["clipped"]
_CLIP_EPS = 1e-6  # torch's epsilon in the clip coefficient
#: Steps without torch's clip before the recorder goes back to measuring at the end of backward.
FORGET_CLIP = 3


def _fingerprint(g: torch.Tensor) -> torch.Tensor:
    flat = g.detach().reshape(-1).float()
    return torch.dot(flat, flat)


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
        self._sentinel: tuple[torch.Tensor, torch.Tensor | float] | None = None

    # -- helpers ---------------------------------------------------------------------------------
    def grads(self) -> tuple[list[int], list[torch.Tensor]]:
        present, grads = [], []
        for i, p in enumerate(self.plan.params):
            if p.grad is not None:
                present.append(i)
                grads.append(p.grad)
        return present, grads

    def _matches(self, grads: list[torch.Tensor], attr: str = "") -> bool:
        """Whether ``grads`` (or params, with ``attr="grad"``) are exactly this model's gradients.

        The usual call (``clip_grad_norm_(model.parameters(), ...)`` with every parameter
        trained) passes them in the model's order: its ends and its length say so without
        building two sets of the whole model's gradients on every step.
        """
        params = self.plan.params
        if params and len(grads) == len(params):
            first, last = grads[0], grads[-1]
            if attr:
                first, last = getattr(first, attr), getattr(last, attr)
            if first is not None and first is params[0].grad and last is params[-1].grad:
                return True
        ours = {id(p.grad) for p in self.plan.params if p.grad is not None}
        if not ours or len(grads) < len(ours):
            return False
        seen = {id(getattr(g, attr) if attr else g) for g in grads}
        seen.discard(id(None))
        return seen == ours

    def _scale(self) -> torch.Tensor | None:
        sc = self.scaler
        if sc is None or not getattr(sc, "is_enabled", lambda: False)():
            return None
        scale = getattr(sc, "_scale", None)
        return scale if isinstance(scale, torch.Tensor) else None

    def _write_total(self, total: torch.Tensor | float) -> None:
        b = self.buf
        host = b.dev_np
        if host is not None:
            value = float(total)  # a CPU tensor or a float: no sync
            host[_GRAD_NORM] = value
            host[_NONFINITE_GRADS] = 0.0 if math.isfinite(value) else 1.0
        else:
            t = torch.as_tensor(total).detach().to(device=b.dev.device, dtype=torch.float32)
            b.slot("grad_norm").copy_(t)
            b.slot("nonfinite_grads").copy_(~torch.isfinite(t))

    # -- measuring -------------------------------------------------------------------------------
    def measure_now(self, unscale: bool = False) -> torch.Tensor | float | None:
        """Global and per-layer norms of the gradients as they are now."""
        present, grads = self.grads()
        self.done = True
        if not grads:
            return None
        b = self.buf
        sq = squared_norms(grads, b.dev.device)
        scale = self._scale() if unscale else None
        if scale is not None:
            sq = sq / scale.to(sq.device, torch.float32).square()
        total = total_norm(sq)  # a float on the CPU, a device tensor on a GPU
        host_layers = b.grad_layer_np
        if b.dev_np is not None and host_layers is not None:
            self.reducer.write_host(sq.numpy(), present, host_layers)
        else:
            self.reducer.write(sq, present, b.grad_layer, squared=True)
        self._write_total(total)
        self.total = total
        return total

    def _norm_of_now(self) -> torch.Tensor | float | None:
        """The global norm of the current gradients, recorded nowhere (the post-clip check)."""
        _, grads = self.grads()
        if not grads:
            return None
        return total_norm(squared_norms(grads, self.buf.dev.device))

    def _remember_sentinel(self) -> None:
        """A cheap fingerprint of one gradient, to see later whether anything changed them.

        The squared norm of a small gradient on the output side: the input side's can be all
        zero (dead units upstream), and a sum can be zero by symmetry (an output bias under
        softmax), but a rescale or a clamp changes a non-zero squared norm.
        """
        self._sentinel = None
        for p in reversed(self.plan.params):
            g = p.grad
            if g is not None and g.numel() <= 65536:
                self._sentinel = (p, _fingerprint(g) if g.is_cuda else float(_fingerprint(g)))
                return

    def on_backward_end(self) -> None:
        """The autograd engine finished a backward pass that reached the model's parameters."""
        self.backwards += 1
        if not self.measure or self.torch_clips > 0 or self.backwards < self.micro:
            return
        self.measure_now(unscale=True)
        self.from_torch = False
        self._at_backward_end = True
        self._remember_sentinel()

    # -- torch's clip (clip_intercept listener) --------------------------------------------------
    def on_total_norm(self, grads: list[torch.Tensor], norm_type: float, total: torch.Tensor) -> None:
        if norm_type != 2.0 or not self._matches(grads):
            return
        self._write_total(total)
        if self.measure and not self.done:  # per-layer norms from the same, unclipped gradients
            present, ours = self.grads()
            if ours:
                b = self.buf
                sq = squared_norms(ours, b.dev.device)
                if b.dev_np is not None and b.grad_layer_np is not None:
                    self.reducer.write_host(sq.numpy(), present, b.grad_layer_np)
                else:
                    self.reducer.write(sq, present, b.grad_layer, squared=True)
        self.total = total
        self.done = self.from_torch = True
        self._at_backward_end = False
        if self.on_nonfinite is not None and not self.finite(total):
            self.on_nonfinite()

    def clip_limit(self, params: list[torch.Tensor], max_norm: float) -> float:
        if self.override is not None and self._matches(params, "grad"):
            return self.override
        return max_norm

    def on_clip(self, params: list[torch.Tensor], max_norm: float, total: torch.Tensor) -> None:
        # the total torch just computed over this model's gradients: no second look at them
        if not (self.from_torch and total is self.total) and not self._matches(params, "grad"):
            return
        self.record_clip(total, max_norm)
        if self.from_torch:
            self.torch_clips = FORGET_CLIP

    def on_value_clip(self, params: list[torch.Tensor], clip_value: float) -> None:
        """Clipping by value: its effect is measured at the update, like a manual rescale."""

    # -- clipping --------------------------------------------------------------------------------
    def record_clip(self, total: torch.Tensor | float, max_norm: float) -> None:
        """A norm clip with ``max_norm`` was applied to gradients whose norm was ``total``."""
        b = self.buf
        self.threshold = float(max_norm)
        self.clip_seen = True
        host = b.dev_np
        if host is not None:  # CPU: Python floats straight into the record, no torch call
            t = total if isinstance(total, float) else float(total.detach())
            host[_NORM_CLIPPED] = t * min(max_norm / (t + _CLIP_EPS), 1.0)
            host[_CLIPPED] = 1.0 if t > max_norm else 0.0
            return
        tt = torch.as_tensor(total).detach().to(device=b.dev.device, dtype=torch.float32)
        coef = (max_norm / (tt + _CLIP_EPS)).clamp(max=1.0)
        b.slot("grad_norm_clipped").copy_(tt * coef)
        b.slot("clipped").copy_(tt > max_norm)

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
        if not record:
            if limit is None:
                return gradmath.global_norm(params, norm_type)
            return gradmath.clip_grad_norm_(params, limit, norm_type, error_if_nonfinite, foreach)
        total, present, norms = gradmath.param_grad_norms(params, norm_type, foreach)
        if error_if_nonfinite and not bool(torch.isfinite(total)):
            raise RuntimeError(
                f"The total norm of order {norm_type} for gradients from `parameters` is "
                "non-finite, so it cannot be clipped. To disable this error and scale the "
                "gradients by the non-finite norm anyway, set `error_if_nonfinite=False`"
            )
        if limit is not None:
            gradmath.clip_grads_with_norm_(params, limit, total, foreach)
        try:
            b = self.buf
            tot32 = total.to(device=b.dev.device, dtype=torch.float32)
            b.slot("grad_norm").copy_(tot32)
            b.slot("nonfinite_grads").copy_(~torch.isfinite(tot32))
            if per_layer and norms:
                self.reducer.write(torch.stack([n.float() for n in norms]), present, b.grad_layer, norm_type)
            if limit is not None:
                self.record_clip(tot32, float(limit))
            self.done, self.total = True, tot32
        except Exception as exc:  # noqa: BLE001 - clipping happened; recording must not raise
            warn("clip-record", f"could not record the clip: {exc!r}")
        return total

    def apply_override(self) -> None:
        """A monitor set a threshold and nobody clipped this step: clip here, as torch would."""
        total = self.total if self.done else self.measure_now()
        if total is None or self.override is None:
            return
        _, grads = self.grads()
        t = torch.as_tensor(total, dtype=torch.float32)
        coef = (self.override / (t + _CLIP_EPS)).clamp(max=1.0)
        torch._foreach_mul_(grads, coef.to(grads[0].device))
        self.record_clip(t, self.override)

    def at_update(self) -> torch.Tensor | float | None:
        """Right before the update: fill in what is missing. Returns the pre-clip norm, if known."""
        if not self.done and (self.measure or self.override is not None):
            self.measure_now()
        elif self._at_backward_end and not self.clip_seen and self._scale() is None:
            self._check_changed()
        if self.override is not None and not self.clip_seen:
            self.apply_override()
        return self.total if self.done else None

    def _check_changed(self) -> None:
        """Gradients measured when backward ended and changed since: record the norm the update uses."""
        ref = self._sentinel
        if ref is None:
            return
        param, before = ref
        g = param.grad
        if g is None:
            return
        b = self.buf
        if isinstance(before, float):
            now = float(_fingerprint(g))
            if now == before or (math.isnan(now) and math.isnan(before)):
                return
            post = self._norm_of_now()
            if post is None:
                return
            b.slot("grad_norm_clipped").fill_(float(post))
            b.slot("clipped").fill_(1.0)
            return
        post = self._norm_of_now()
        if post is None:
            return
        changed = _fingerprint(g) != before
        post_t = torch.as_tensor(post).to(b.dev.device, torch.float32)
        nan = torch.full((), math.nan, device=b.dev.device)
        b.slot("grad_norm_clipped").copy_(torch.where(changed, post_t, nan))
        b.slot("clipped").copy_(torch.where(changed, torch.ones((), device=b.dev.device), nan))

    @staticmethod
    def finite(total: torch.Tensor | float) -> bool:
        """Whether the recorded norm is finite: a CPU scalar is read (no ``isfinite`` kernel,
        tens of microseconds on a cold cache), a device one is checked there (the guard's sync)."""
        if isinstance(total, float):
            return math.isfinite(total)
        if total.is_cpu and total.numel() == 1:
            return math.isfinite(total.item())
        return bool(torch.isfinite(total).all())

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
        self._sentinel = None
        self.threshold = math.nan
        self.measure = measure_next
