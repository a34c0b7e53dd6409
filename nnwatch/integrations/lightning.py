"""PyTorch Lightning: ``Trainer(callbacks=[NNWatch()])`` and the run shows up in nnwatch.

Lightning owns the optimizer loop, so the callback follows its hooks, in the order Lightning 2.x
calls them for each optimizer step (``Precision._wrap_closure`` / ``_after_closure``)::

    optimizer.step(closure)                 # the optimizer's step pre-hooks run here, too early
      closure: training_step, zero_grad, backward
      [AMP: scaler.unscale_]
      on_before_optimizer_step              -> gradient norms BEFORE clipping (+ guard)
      configure_gradient_clipping           -> wrapped: norm AFTER Lightning's own clipping
      the optimizer's update
    [LR schedulers step]
    on_train_batch_end                      -> w.step(loss, batch), with the LR the update used

Since the closure runs inside ``optimizer.step()``, the probe's own step pre-hook would see the
previous step's gradients; the callback removes it and runs the probe's pre-step work (the
non-finite guard, snapshots) from ``on_before_optimizer_step`` instead. The post-clip norm is
measured only when Lightning clips (``gradient_clip_val`` set, or ``configure_gradient_clipping``
overridden): it is one extra norm over the gradients. With gradient accumulation one record is
written per optimizer step, with the mean loss of its micro-batches. Each rank of a DDP run gets
its own run. ``lightning`` is imported only here, and ``pytorch_lightning`` works the same.
"""

from __future__ import annotations

import logging
import sys
from typing import Any

import torch

from nnwatch.probe.framework_link import loss_of
from nnwatch.probe.watch import watch

log = logging.getLogger("nnwatch")


def _callback_base() -> type:
    mod = sys.modules.get("pytorch_lightning")
    if mod is not None and "lightning" not in sys.modules:
        return mod.Callback  # type: ignore[no-any-return]
    try:
        from lightning.pytorch import Callback
    except ImportError:
        try:
            from pytorch_lightning import Callback  # type: ignore[assignment]
        except ImportError:
            raise ImportError(
                "nnwatch.integrations.lightning needs PyTorch Lightning: pip install lightning"
            ) from None
    return Callback  # type: ignore[no-any-return]


class NNWatch(_callback_base()):  # type: ignore[misc]
    """Lightning callback: attaches at fit start, records every optimizer step, closes at the end.

    Options are those of :func:`nnwatch.watch` (``name``, ``layer_interval``, ``tensorboard``, ...).
    After the fit, ``callback.watch`` is the :class:`~nnwatch.Watch` (its ``run_dir``, findings).
    """

    def __init__(self, **options: Any) -> None:
        super().__init__()
        self.options = options
        self.watch: Any = None
        self._loss_sum: torch.Tensor | None = None
        self._micro = 0
        self._stepped = False
        self._lrs: list[Any] | None = None
        self._clip_wrapped: Any = None

    # -- fit start / end -------------------------------------------------------------------------
    def on_fit_start(self, trainer: Any, pl_module: Any) -> None:
        optimizers = list(getattr(trainer, "optimizers", []) or [])
        if len(optimizers) > 1:
            log.warning(
                "nnwatch: %d optimizers; gradient norms cover the model, the LR comes from the first",
                len(optimizers),
            )
        optimizer = optimizers[0] if optimizers else None
        optimizer = getattr(optimizer, "optimizer", optimizer)  # LightningOptimizer -> torch
        scaler = getattr(getattr(trainer, "precision_plugin", None), "scaler", None)
        options = dict(self.options)
        options.setdefault("name", type(pl_module).__name__)
        self.watch = watch(pl_module, optimizer, scaler, **options)
        self.watch.framework.detach_step_pre_hook()
        if getattr(pl_module, "automatic_optimization", True) and self._lightning_clips(
            trainer, pl_module
        ):
            self._wrap_clipping(trainer, pl_module)

    def on_fit_end(self, trainer: Any, pl_module: Any) -> None:
        self._close(pl_module, "finished")

    def on_exception(self, trainer: Any, pl_module: Any, exception: BaseException) -> None:
        stopped = isinstance(exception, (KeyboardInterrupt, SystemExit))
        if self.watch is not None and not stopped:
            self.watch.framework.training_error(exception)
        self._close(pl_module, "stopped" if stopped else "crashed")

    def _close(self, pl_module: Any, status: str) -> None:
        if self._clip_wrapped is not None:
            try:
                del pl_module.configure_gradient_clipping  # back to the class's method
            except AttributeError:
                pass
            self._clip_wrapped = None
        if self.watch is not None:
            self.watch.close(status)

    # -- each optimizer step ---------------------------------------------------------------------
    def on_before_optimizer_step(self, trainer: Any, pl_module: Any, optimizer: Any) -> None:
        w = self.watch
        if w is None or w.closed:
            return
        w.clip_grad_norm_(max_norm=None)  # measures; clips only if a monitor set a threshold
        w.framework.before_optimizer_step()
        self._lrs = w.framework.learning_rates()  # the LRs this update uses, before any scheduler
        self._stepped = True

    def on_train_batch_end(
        self, trainer: Any, pl_module: Any, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        w = self.watch
        if w is None or w.closed:
            return
        loss = loss_of(outputs)
        if loss is not None:
            loss = loss.detach().float().reshape(-1).mean()
            self._loss_sum = loss if self._loss_sum is None else self._loss_sum + loss
            self._micro += 1
        if not self._stepped:
            return  # a micro-batch of gradient accumulation: the optimizer step comes later
        total = self._loss_sum
        if total is not None and not getattr(pl_module, "automatic_optimization", True):
            total = total / max(1, self._micro)  # manual optimization: losses are not pre-divided
        self._loss_sum, self._micro, self._stepped = None, 0, False
        with w.framework.recorded_lrs(self._lrs):
            w.step(total, batch)
        if w.should_stop:
            trainer.should_stop = True

    # -- Lightning's clipping --------------------------------------------------------------------
    @staticmethod
    def _lightning_clips(trainer: Any, pl_module: Any) -> bool:
        val = getattr(trainer, "gradient_clip_val", None)
        if val is not None and val > 0:
            return True
        own = getattr(type(pl_module), "configure_gradient_clipping", None)
        try:
            from lightning.pytorch import LightningModule
        except ImportError:  # pragma: no cover - pytorch_lightning only
            from pytorch_lightning import LightningModule  # type: ignore[assignment]
        return own is not getattr(LightningModule, "configure_gradient_clipping", None)

    def _wrap_clipping(self, trainer: Any, pl_module: Any) -> None:
        original = pl_module.configure_gradient_clipping  # the bound method of the user's class

        def configure_gradient_clipping(
            optimizer: Any, gradient_clip_val: Any = None, gradient_clip_algorithm: Any = None
        ) -> None:
            original(optimizer, gradient_clip_val, gradient_clip_algorithm)
            w = self.watch
            if w is not None and not w.closed:
                algo = str(
                    getattr(gradient_clip_algorithm, "value", gradient_clip_algorithm) or "norm"
                )
                limit = float(gradient_clip_val) if gradient_clip_val and algo == "norm" else None
                w.framework.record_clip_after(limit)

        pl_module.configure_gradient_clipping = configure_gradient_clipping
        self._clip_wrapped = original
