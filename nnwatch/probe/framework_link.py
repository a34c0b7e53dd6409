"""What a framework's callback needs of a watched run beyond ``watch()``, ``clip_grad_norm_`` and
``step()``: ``w.framework``.

Frameworks clip the gradients themselves, at moments a callback cannot always reach, so the
callbacks record a clip that somebody else did; and Lightning runs the forward and backward
*inside* ``optimizer.step(closure)``, after the optimizer's step pre-hooks. These operations are
one public object of the watch, so that the integrations (and anyone writing one for another
framework) never reach into the run behind it.

All of them are device ops (no host sync) and never raise: recording must not break a step.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

import torch

from nnwatch.store.events import TrainingError
from nnwatch.store.schema import FieldName
from nnwatch.tensors import torch_clip as gradmath

if TYPE_CHECKING:
    from nnwatch.probe.watched_run import WatchedRun


class FrameworkLink:
    """The framework-facing operations on one watched run (``Watch.framework``)."""

    def __init__(self, run: WatchedRun) -> None:
        self._run = run

    def detach_step_pre_hook(self) -> bool:
        """Remove the probe's ``optimizer.step()`` pre-hook (the caller measures at the right
        moment): Lightning calls ``optimizer.step(closure)`` and the closure runs the forward and
        backward, so a step pre-hook would see the previous step's gradients."""
        run = self._run
        opt = run.optimizer.hook
        if opt is None or getattr(opt, "_optimizer_step_pre_hooks", None) is None:
            return False
        return run.parts.attachment.detach_step_pre_hook()

    def before_optimizer_step(self) -> None:
        """The probe's own pre-step work (non-finite guard, snapshot of the pre-update weights)."""
        run = self._run
        run.parts.cycle.before_optimizer_step(run.optimizer.hook, (), {})

    def record_clip_after(self, max_norm: float | None) -> None:
        """Someone else just clipped the gradients this run measured before: record the result.

        ``max_norm`` is the threshold of a norm clip, or None for other clips (by value, custom):
        then "clipped" means the norm went down.
        """
        run = self._run
        parts = run.parts
        if run.disabled or not parts.plan.params:
            return
        grads = parts.grads
        try:
            b = parts.buffers
            post = gradmath.global_norm(list(parts.plan.params)).to(b.dev.device, torch.float64)
            pre = b.slot(FieldName.GRAD_NORM)
            b.slot(FieldName.GRAD_NORM_CLIPPED).copy_(post)
            limits = [x for x in (max_norm, grads.override) if x is not None and math.isfinite(x)]
            if limits:
                grads.threshold = float(min(limits))
                b.slot(FieldName.CLIPPED).copy_(pre > grads.threshold)
            else:
                b.slot(FieldName.CLIPPED).copy_(post < pre)
        except Exception as exc:  # noqa: BLE001
            run.warn_once("integration-clip", f"could not record the framework's clip: {exc!r}")

    def rebase_on_pre_clip(self, pre_total: Any, max_norm: float | None) -> None:
        """This run measured gradients that a framework had already clipped; ``pre_total`` is the
        norm the framework saw before clipping. Norm clipping scales every gradient by the same
        factor, so the per-layer norms before clipping are the measured ones divided by it."""
        run = self._run
        if run.disabled or not isinstance(pre_total, torch.Tensor):
            return
        grads = run.parts.grads
        try:
            b = run.parts.buffers
            pre = pre_total.detach().reshape(()).to(b.dev.device, torch.float64)
            measured = b.slot(FieldName.GRAD_NORM).clone()
            scale = torch.where(measured > 0, pre / measured, torch.ones_like(pre))
            b.grad_layer.mul_(scale)
            b.slot(FieldName.GRAD_NORM).copy_(pre)
            b.slot(FieldName.NONFINITE_GRADS).copy_(~torch.isfinite(pre))
            if max_norm is not None and math.isfinite(max_norm):
                if grads.override is None:
                    b.slot(FieldName.GRAD_NORM_CLIPPED).copy_(measured)
                    grads.threshold = float(max_norm)
                else:
                    grads.threshold = float(min(max_norm, grads.override))
                b.slot(FieldName.CLIPPED).copy_(pre > grads.threshold)
        except Exception as exc:  # noqa: BLE001
            run.warn_once("integration-preclip", f"could not record the pre-clip norm: {exc!r}")

    def learning_rates(self) -> list[Any] | None:
        """The optimizer's LRs now (Python numbers, no sync), to record them for this step later."""
        opt = self._run.optimizer.hook
        return None if opt is None else [g.get("lr") for g in opt.param_groups]

    @contextmanager
    def recorded_lrs(self, lrs: list[Any] | None) -> Iterator[None]:
        """Let ``w.step()`` record ``lrs`` (the LRs the update used) although a scheduler has
        stepped since. The optimizer's own values are back as soon as the record is written."""
        opt = self._run.optimizer.hook
        if opt is None or lrs is None:
            yield
            return
        groups = opt.param_groups
        now = [g.get("lr") for g in groups]
        try:
            for g, lr in zip(groups, lrs, strict=False):
                g["lr"] = lr
            yield
        finally:
            for g, lr in zip(groups, now, strict=False):
                g["lr"] = lr

    def training_error(self, exception: BaseException) -> None:
        """The framework saw the training step raise: the run's events say so, at this step."""
        run = self._run
        run.files.event(TrainingError(step=run.step_index, error=repr(exception)))


def loss_of(output: Any) -> torch.Tensor | None:
    """The loss in what a training step returned: a tensor, or the ``"loss"`` of a mapping."""
    if isinstance(output, torch.Tensor):
        return output
    get = getattr(output, "get", None)
    if callable(get):
        loss = get("loss")
        return loss if isinstance(loss, torch.Tensor) else None
    return None
