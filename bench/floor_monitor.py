"""The least a live monitor can do per step, written out by hand: the overhead benchmark's floor.

What nnwatch's light (unmeasured) step cannot drop, and nothing else:

- a forward pre-hook on the model (a step starts),
- a post-accumulate-grad hook on the parameters at both ends, which queues one callback for the
  end of the backward pass: the global gradient norm, taken there before anything clips (on the
  CPU through numpy, one BLAS dot per gradient; on a GPU one ``_foreach_norm`` into a device
  buffer),
- an optimizer step pre-hook (where a non-finite guard would go; empty here),
- and in ``step(loss)`` one fixed-size record (step, time, loss, norm, LR) packed into a slot of
  a memory-mapped ring file. On a GPU the loss and norm are copied to pinned memory without a
  sync and published a step late.

No loss trend, no budget, no run log, no commands, no detectors, no per-layer anything. Its time
ratio in the benchmark is the physical floor of a Python probe that takes the global norm on
every step: the hooks' dispatch and the norm's read of every gradient on a cache the step has
just used. nnwatch's distance to it is what its own bookkeeping costs.
"""

from __future__ import annotations

import math
import mmap
import struct
import tempfile
import time
from collections.abc import Callable
from typing import Any

import numpy as np
import torch
from torch import nn

_ENGINE = torch.autograd.Variable._execution_engine  # type: ignore[attr-defined]
_RECORD = struct.Struct("<5d")
SLOTS = 4096


def _cpu_norm(params: list[torch.Tensor]) -> float:
    total = 0.0
    for p in params:
        g = p.grad
        if g is not None:
            a = g.numpy().ravel(order="K")
            total += float(np.vdot(a, a))
    return math.sqrt(total)


class FloorMonitor:
    """Hooks, the global norm, one record a step into an mmap ring (see the module docstring)."""

    def __init__(self, model: nn.Module, optimizer: torch.optim.Optimizer,
                 wrap: Callable[[Callable[..., Any]], Callable[..., Any]] = lambda f: f) -> None:
        self.params = [p for p in model.parameters() if p.requires_grad]
        self.optimizer = optimizer
        self.cuda = self.params[0].is_cuda
        self.step_index = 0
        self.open = False
        self.queued = False
        self.norm: Any = math.nan
        self._file = tempfile.TemporaryFile()
        self._file.truncate(SLOTS * _RECORD.size)
        self._ring = mmap.mmap(self._file.fileno(), SLOTS * _RECORD.size)
        if self.cuda:  # two device values a step, copied without a sync, published a step late
            self._dev = torch.zeros(2, device=self.params[0].device)
            self._host = torch.zeros(2, pin_memory=True)
            self._pending: tuple[int, float, torch.cuda.Event] | None = None
        self._end = wrap(self._on_backward_end)
        self.handles = [
            model.register_forward_pre_hook(wrap(self._on_forward)),
            optimizer.register_step_pre_hook(wrap(self._before_update)),
            *(p.register_post_accumulate_grad_hook(wrap(self._on_grad))
              for p in dict.fromkeys((self.params[0], self.params[-1]))),
        ]
        self.step = wrap(self._step)

    def _on_forward(self, module: nn.Module, args: Any) -> None:
        self.open = True

    def _on_grad(self, param: torch.Tensor) -> None:
        if not self.queued:
            self.queued = True
            _ENGINE.queue_callback(self._end)

    def _on_backward_end(self) -> None:
        self.queued = False
        if self.cuda:
            grads = [p.grad for p in self.params if p.grad is not None]
            torch.stack(torch._foreach_norm(grads)).norm(out=self._dev[1])
        else:
            self.norm = _cpu_norm(self.params)

    def _before_update(self, optimizer: Any, args: Any, kwargs: Any) -> None:
        pass  # a guard's one check would go here

    def _step(self, loss: torch.Tensor) -> None:
        now = time.time()
        lr = self.optimizer.param_groups[0]["lr"]
        if self.cuda:
            self._dev[0].copy_(loss.detach())
            pending = self._pending
            if pending is not None and pending[2].query():
                self._publish(pending[0], pending[1], float(self._host[0]), float(self._host[1]), lr)
            self._host.copy_(self._dev, non_blocking=True)
            event = torch.cuda.Event()
            event.record()
            self._pending = (self.step_index, now, event)
        else:
            self._publish(self.step_index, now, loss.item(), self.norm, lr)
        self.step_index += 1
        self.open = False

    def _publish(self, step: int, now: float, loss: float, norm: float, lr: float) -> None:
        _RECORD.pack_into(self._ring, (step % SLOTS) * _RECORD.size, step, now, loss, norm, lr)

    def close(self) -> None:
        for h in self.handles:
            h.remove()
        self._ring.close()
        self._file.close()
