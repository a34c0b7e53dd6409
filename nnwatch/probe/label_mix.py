"""How mixed a classifier's batch is: the entropy of its labels, on measured steps.

A data set sorted by label and never shuffled hands the model one class at a time; the loss then
jumps at every class boundary and looks like an unstable LR. The batch itself shows the cause:
its labels have almost no entropy where a shuffled batch's are close to the data's own. Only the
batch's targets are read (``w.step(loss, batch=(x, y))``, or a dict's ``labels``), on the device,
into the step record: one scatter-add and a sum, no host sync.
"""

from __future__ import annotations

from typing import Any

import torch

from nnwatch.probe.buffers import DEV_INDEX, StepBuffers

MAX_CLASSES = 1024  # beyond this the labels are tokens of a language model: not a data order
_TARGET_KEYS = ("labels", "label", "targets", "target", "y")
_INTEGER = (torch.int64, torch.int32, torch.int16, torch.uint8, torch.int8)
_SLOT = DEV_INDEX["label_entropy"]


def batch_targets(batch: Any) -> torch.Tensor | None:
    """The batch's class labels, when it has a 1-D integer tensor where labels usually are."""
    if isinstance(batch, dict):
        t = next((batch[k] for k in _TARGET_KEYS if k in batch), None)
    elif isinstance(batch, (tuple, list)) and len(batch) >= 2:
        t = batch[-1]
    else:
        return None
    if type(t) is not torch.Tensor or t.dim() != 1 or t.dtype not in _INTEGER or t.numel() < 2:
        return None
    return t


class LabelMix:
    """Writes ``label_entropy`` for a classifier of ``num_classes`` classes."""

    def __init__(self, buffers: StepBuffers, num_classes: int | None) -> None:
        self.buf = buffers
        self.k = int(num_classes) if num_classes and 2 <= num_classes <= MAX_CLASSES else 0
        self._counts: dict[torch.device, torch.Tensor] = {}

    def record(self, batch: Any) -> None:
        if not self.k:
            return
        y = batch_targets(batch)
        if y is None:
            return
        y = y.detach()
        counts = self._counts.get(y.device)
        if counts is None:
            counts = self._counts[y.device] = torch.zeros(self.k, device=y.device)
        counts.zero_()
        counts.scatter_add_(0, y.long().clamp(0, self.k - 1), torch.ones(y.shape, device=y.device))
        p = counts / counts.sum()
        entropy = -torch.special.xlogy(p, p).sum()
        host = self.buf.dev_np
        if y.is_cpu:
            value = float(entropy)  # a CPU tensor: no sync
            if host is not None:
                host[_SLOT] = value
            else:
                self.buf.slot("label_entropy").fill_(value)  # a fill: no copy, no sync
        elif y.device == self.buf.dev.device:
            self.buf.slot("label_entropy").copy_(entropy)

