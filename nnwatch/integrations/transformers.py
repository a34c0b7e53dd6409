"""Hugging Face Trainer: ``Trainer(..., callbacks=[NNWatchCallback()])`` and the run shows up in nnwatch.

The Trainer (transformers 4.5x-5.x) runs each optimizer step as::

    training_step(model, inputs) per micro-batch    # forward + backward, returns the loss
    accelerator.clip_grad_norm_(params, max_grad_norm)   # returns the norm BEFORE clipping
    on_pre_optimizer_step -> optimizer.step() -> on_optimizer_step
    lr_scheduler.step(); zero_grad; on_step_end

Callbacks get neither the loss nor the pre-clip norm, and no hook runs between the backward and
the clip. So at ``on_train_begin`` the callback finds the Trainer (the caller of the callback
handler, found once on the call stack) and wraps two of its entry points on that instance only:

- ``trainer.training_step``: its return value is the micro-batch loss the Trainer itself logs
  (already divided for gradient accumulation, so the micro-batches of one step add up to the
  step's loss), kept on the device. This works with a custom ``compute_loss`` too, and keeps a
  NaN loss visible (the Trainer's own ``logging_nan_inf_filter`` hides it from its logs);
- ``trainer.accelerator.clip_grad_norm_``: its return value is the total norm before clipping.

At ``on_pre_optimizer_step`` the gradients are the clipped ones: the callback measures them (global
and per layer) and rebases the record on the pre-clip norm. ``on_optimizer_step`` writes the
record, right after the update and before the LR scheduler steps, so the LR is the one it used.
Nothing here syncs with the device. If the Trainer cannot be found (an unusual caller), the run is
still recorded, without loss and with the post-clip norm only, and a warning says so.
``transformers`` is imported only here.
"""

from __future__ import annotations

import logging
import math
import sys
from typing import Any

import torch

from nnwatch.probe.framework_link import loss_of
from nnwatch.probe.optimizer_target import resolve as resolve_optimizer
from nnwatch.probe.watch import watch

log = logging.getLogger("nnwatch")


def _callback_base() -> type:
    try:
        from transformers import TrainerCallback
    except ImportError:
        raise ImportError(
            "nnwatch.integrations.transformers needs transformers: pip install transformers"
        ) from None
    return TrainerCallback  # type: ignore[no-any-return]


def _find_trainer(depth: int = 12) -> Any:
    """The ``transformers.Trainer`` whose callback handler is calling us, from the call stack."""
    from transformers import Trainer

    frame = sys._getframe(1)
    for _ in range(depth):
        if frame is None:
            return None
        candidate = frame.f_locals.get("self")
        if isinstance(candidate, Trainer):
            return candidate
        frame = frame.f_back  # type: ignore[assignment]
    return None


class NNWatchCallback(_callback_base()):  # type: ignore[misc]
    """Hugging Face ``TrainerCallback``: attaches at train begin, one record per optimizer step.

    Options are those of :func:`nnwatch.watch` (``name``, ``layer_interval``, ``tensorboard``, ...).
    After training, ``callback.watch`` is the :class:`~nnwatch.Watch`.
    """

    def __init__(self, **options: Any) -> None:
        self.options = options
        self.watch: Any = None
        self.trainer: Any = None
        self._loss: torch.Tensor | None = None
        self._inputs: Any = None
        self._pre_clip: tuple[Any, float] | None = None
        self._wrapped: list[tuple[Any, str]] = []

    # -- begin / end ----------------------------------------------------------------------------
    def on_train_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        model = kwargs.get("model")
        if model is None:
            log.warning("nnwatch: the Trainer passed no model to its callbacks; not watching")
            return
        optimizer = _torch_optimizer(kwargs.get("optimizer"))
        self.trainer = _find_trainer()
        accelerator = getattr(self.trainer, "accelerator", None)
        scaler = getattr(accelerator, "scaler", None)
        options = dict(self.options)
        options.setdefault("name", type(model).__name__)
        self.watch = watch(model, optimizer, scaler, **options)
        if self.trainer is None:
            log.warning(
                "nnwatch: could not find the Trainer that calls this callback; losses and "
                "pre-clip gradient norms are not recorded"
            )
            return
        self._wrap(self.trainer, "training_step", self._training_step)
        if accelerator is not None:
            self._wrap(accelerator, "clip_grad_norm_", self._clip_grad_norm)

    def on_train_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self._unwrap()
        if self.watch is not None:
            self.watch.close("finished")

    # -- each optimizer step ---------------------------------------------------------------------
    def on_pre_optimizer_step(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        w = self.watch
        if w is None or w.closed:
            return
        w.clip_grad_norm_(max_norm=None)  # the gradients as they are now (already clipped)
        if self._pre_clip is not None:
            total, max_norm = self._pre_clip
            w.framework.rebase_on_pre_clip(total, max_norm)
            self._pre_clip = None

    def on_optimizer_step(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        """Right after ``optimizer.step()``, before the LR scheduler steps: write the record."""
        w = self.watch
        if w is None or w.closed:
            return
        loss, self._loss = self._loss, None
        batch, self._inputs = self._inputs, None
        w.step(loss, batch)

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> Any:
        if self.watch is not None and self.watch.should_stop:
            control.should_training_stop = True  # a monitor sent "stop"
        return control

    # -- wrappers on the Trainer instance ---------------------------------------------------------
    def _training_step(self, original: Any, *args: Any, **kwargs: Any) -> Any:
        out = original(*args, **kwargs)
        loss = loss_of(out)
        if loss is not None:
            loss = loss.detach().float().reshape(-1).mean()
            self._loss = loss if self._loss is None else self._loss + loss
        inputs = args[1] if len(args) > 1 else kwargs.get("inputs")
        if inputs is not None:
            self._inputs = inputs
        return out

    def _clip_grad_norm(
        self, original: Any, parameters: Any, max_norm: Any, *args: Any, **kwargs: Any
    ) -> Any:
        total = original(parameters, max_norm, *args, **kwargs)
        try:
            limit = float(max_norm)
        except (TypeError, ValueError):
            limit = math.inf
        self._pre_clip = (total, limit)
        return total

    def _wrap(self, obj: Any, name: str, handler: Any) -> None:
        original = getattr(obj, name)

        def wrapper(*args: Any, **kwargs: Any) -> Any:
            return handler(original, *args, **kwargs)

        setattr(obj, name, wrapper)
        self._wrapped.append((obj, name))

    def _unwrap(self) -> None:
        for obj, name in self._wrapped:
            try:
                delattr(obj, name)  # the instance attribute goes; the class's method is back
            except AttributeError:
                pass
        self._wrapped.clear()


def _torch_optimizer(optimizer: Any) -> torch.optim.Optimizer | None:
    """The torch optimizer inside Accelerate's ``AcceleratedOptimizer`` (or the optimizer itself),
    found as ``watch()`` finds it, so that it needs no note about the wrapper."""
    return resolve_optimizer(optimizer).hook
