"""How mixed a classifier's batch is: its labels' entropy, mean and variance, on measured steps.

A data set sorted by label and never shuffled hands the model one class at a time; the loss then
jumps at every class boundary and looks like an unstable LR. The batches themselves show the
cause: under shuffling, almost all of the labels' variance is within each batch (the batch means
vary by about 1/B of it); in label order, almost all of it is between batches. Only the batch's
targets are read (``w.step(loss, batch=(x, y))``, or a dict's ``labels``), on the device, into the
step record: one scatter-add and a few sums over K classes, no host sync.
"""

from __future__ import annotations

from typing import Any

import torch

from nnwatch.probe.buffers import DEV_INDEX, StepBuffers
from nnwatch.store.schema import FieldName

MAX_CLASSES = 1024  # beyond this the labels are tokens of a language model: not a data order
_TARGET_KEYS = ("labels", "label", "targets", "target", "y")
_INTEGER = (torch.int64, torch.int32, torch.int16, torch.uint8, torch.int8)
_NAMES = (FieldName.LABEL_ENTROPY, FieldName.LABEL_MEAN, FieldName.LABEL_VAR)
_SLOTS = tuple(DEV_INDEX[name] for name in _NAMES)


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
        self._counts: dict[torch.device, tuple[torch.Tensor, torch.Tensor]] = {}

    def record(self, batch: Any) -> None:
        if not self.k:
            return
        y = batch_targets(batch)
        if y is None:
            return
        y = y.detach()
        made = self._counts.get(y.device)
        if made is None:
            index = torch.arange(self.k, dtype=torch.float64, device=y.device)
            made = self._counts[y.device] = (torch.zeros(self.k, device=y.device), index)
        counts, index = made
        counts.zero_()
        counts.scatter_add_(0, y.long().clamp(0, self.k - 1), torch.ones(y.shape, device=y.device))
        p = (counts / counts.sum()).double()
        mean = (p * index).sum()
        values = (-torch.special.xlogy(p, p).sum(), mean, (p * index.square()).sum() - mean.square())
        host = self.buf.dev_np
        if y.is_cpu:
            floats = [float(v) for v in values]  # CPU tensors: no sync
            for slot, name, v in zip(_SLOTS, _NAMES, floats, strict=True):
                if host is not None:
                    host[slot] = v
                else:
                    self.buf.slot(name).fill_(v)  # a fill: no copy, no sync
        elif y.device == self.buf.dev.device:
            for name, v in zip(_NAMES, values, strict=True):
                self.buf.slot(name).copy_(v)

