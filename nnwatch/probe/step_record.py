"""The step record's own fields: loss, AMP scale, timing, throughput, memory gauges and LRs.

Everything else in the record is written by the part that measures it (gradient norms by the
gradient recorder, layer sums and statistics by the layer hooks). The host block is packed in
one call in schema order (asserted at import): on a CPU whose caches the step just flushed,
every Python-level call costs tens of microseconds.
"""

from __future__ import annotations

import math
import struct
from collections.abc import Callable
from typing import Any

import torch

from nnwatch.probe.buffers import DEV_INDEX, StepBuffers
from nnwatch.probe.sysmon import SystemSampler
from nnwatch.store.schema import HOST_FIELDS, FieldName

N_HOST = len(HOST_FIELDS)
_NO_CUDA = (math.nan, math.nan, math.nan)
_LOSS = DEV_INDEX["loss"]
_AMP_SCALE, _AMP_SKIPPED = DEV_INDEX[FieldName.AMP_SCALE], DEV_INDEX[FieldName.AMP_SKIPPED]
assert HOST_FIELDS[5:15] == (
    FieldName.LAYER_STATS, FieldName.CUDA_ALLOCATED, FieldName.CUDA_RESERVED, FieldName.CUDA_PEAK,
    FieldName.CPU_PERCENT, FieldName.RSS,
    FieldName.LAYER_SUMS, FieldName.GRADS_KEPT, FieldName.PARAMS_NO_GRAD, FieldName.PARAMS_UNOPTIMIZED,
), "StepRecord.write_host writes the host block in this order"
NO_SHARES = (math.nan, math.nan)
_NO_LRS: list[float] = []
_Tensor = torch.Tensor
MEMORY_EVERY = 0.2  # seconds between two reads of the CUDA allocator's statistics


def batch_size_of(batch: Any, seq_first: bool = False) -> int | None:
    """Samples in the batch: (x, y) tuples, dicts of token ids, a tensor.

    The batch dimension is the first tensor's leading one, or its second for a model whose
    recurrent layers take sequence-first input (``(T, B, ...)``, PyTorch's RNN default).
    """
    dim = 1 if seq_first else 0
    if type(batch) is tuple and batch and type(batch[0]) is torch.Tensor and batch[0].dim() > dim:
        return int(batch[0].shape[dim])  # the usual (x, y), without building a list
    if type(batch) is dict:  # dicts of token ids: the first tensor, without building a list
        for v in batch.values():
            if type(v) is torch.Tensor and v.dim() > dim:
                return int(v.shape[dim])
    if isinstance(batch, dict):
        items: Any = list(batch.values())
    elif isinstance(batch, (tuple, list)):
        items = list(batch)
    else:
        items = [batch]
    t = next((b for b in items if isinstance(b, torch.Tensor) and b.dim() > dim), None)
    return int(t.shape[dim]) if t is not None else None


def _plain_lr(lr: Any) -> float:
    """An LR as a float: a tensor on the CPU is read, one elsewhere is NaN (reading it would
    sync), and anything that is not a number is NaN."""
    if isinstance(lr, torch.Tensor):
        return float(lr) if lr.device.type == "cpu" and lr.numel() == 1 else math.nan
    try:
        return float(lr)
    except (TypeError, ValueError):
        return math.nan


class StepRecord:
    """Writes the loss, AMP, host-block and LR fields of each step into the step buffers."""

    def __init__(
        self,
        buffers: StepBuffers,
        sysmon: SystemSampler,
        optimizer: Any,
        scaler: Any,
        num_lr: int,
        warn: Callable[[str, str], None],
    ) -> None:
        self.buf = buffers
        self.sysmon = sysmon
        self.optimizer = optimizer
        self.scaler = scaler
        self.num_lr = num_lr
        self.warn = warn
        self._memory_at = -math.inf  # when the CUDA memory gauges were last read
        self._memory = _NO_CUDA
        self._prev_scale: torch.Tensor | None = None  # the AMP scale of the previous step
        self._prev_value: float | None = None  # the same, on the CPU path
        #: packs the host block and the LRs: one call, the record's whole host side
        self._pack = struct.Struct(f"<{N_HOST + (num_lr if optimizer is not None else 0)}d").pack_into

    def loss(self, loss: Any) -> None:
        host = self.buf.dev_np
        if type(loss) is _Tensor and host is not None and loss.is_cpu and loss.dim() == 0:
            host[_LOSS] = loss.item()  # the usual CPU case: a scalar, no sync, no torch copy
            return
        slot = self.buf.loss
        if loss is None:
            slot.fill_(math.nan)  # a light step does not reset the record: no stale loss
            return
        if isinstance(loss, torch.Tensor):
            if loss.dim() == 0:
                if host is not None and loss.is_cpu:
                    host[_LOSS] = loss.item()  # a CPU scalar: no sync, cheaper than copy_
                else:
                    slot.copy_(loss.detach())  # the usual case on a GPU (float64 slot: no range lost)
                return
            value = loss.detach()
            if value.numel() != 1:
                self.warn(
                    "loss-shape",
                    f"the loss passed to w.step() has shape {tuple(value.shape)}, not a scalar; "
                    "nnwatch records its mean (pass loss.mean() to silence this)",
                )
                value = value.double().mean()
            slot.copy_(value.reshape(()))
        else:
            try:
                slot.fill_(float(loss))
            except (TypeError, ValueError):
                self.warn("loss-type", f"w.step() got a loss of type {type(loss).__name__}; pass the loss tensor")

    def amp(self) -> None:
        sc = self.scaler
        if sc is None or not getattr(sc, "is_enabled", lambda: False)():
            return
        scale = getattr(sc, "_scale", None)  # the tensor itself: get_scale() would sync
        if not isinstance(scale, torch.Tensor):
            return
        b = self.buf
        host = b.dev_np
        if host is not None and scale.is_cpu and scale.numel() == 1:
            # the CPU case: the scale is read (no sync there) and written as numbers, where the
            # tensor path below costs five torch calls a step
            value = scale.item()
            prev_value = self._prev_value
            if prev_value is None:
                prev_value = float(getattr(sc, "_init_scale", math.inf) or math.inf)
            host[_AMP_SCALE] = value
            host[_AMP_SKIPPED] = 1.0 if value < prev_value else 0.0
            self._prev_value = value
            return
        s = scale.detach().reshape(()).to(b.dev.device, torch.float64)
        b.slot(FieldName.AMP_SCALE).copy_(s)
        prev = self._prev_scale
        if prev is None:
            init = float(getattr(sc, "_init_scale", math.inf) or math.inf)
            prev = self._prev_scale = torch.full((), init, device=b.dev.device, dtype=torch.float64)
        b.slot(FieldName.AMP_SKIPPED).copy_(s < prev)  # the scale only drops when a step was skipped
        prev.copy_(s)

    def write_host(
        self,
        step: int,
        now: float,
        dt: float,
        bs: int | None,
        threshold: float,
        sampled: bool,
        measured: bool,
        kept: float = math.nan,
        shares: tuple[float, float] = NO_SHARES,
    ) -> None:
        """The host block in schema order and the optimizer's LRs after it, in one call."""
        b = self.buf
        mem = self._cuda_memory(b.device, now) if b.on_cuda else _NO_CUDA
        sysmon = self.sysmon
        opt = self.optimizer
        lrs = _NO_LRS if opt is None else self._lrs(opt.param_groups)
        self._pack(
            b.record_view,
            0,
            step,
            now,
            dt,
            bs / dt if bs and dt > 0 else math.nan,
            threshold,
            1.0 if sampled else 0.0,
            *mem,
            sysmon.cpu_percent,
            sysmon.rss,
            1.0 if measured else 0.0,
            kept,
            *shares,
            *lrs,
        )

    def _lrs(self, groups: list[dict[str, Any]]) -> list[Any]:
        """The LR of each recorded param group, as plain numbers (a list of floats, usually as is)."""
        lrs = [group.get("lr", math.nan) for group in groups]
        n = self.num_lr
        if len(lrs) != n:  # groups added (or taken away) since the watch started
            lrs = (lrs + [math.nan] * n)[:n]
        for lr in lrs:
            if type(lr) is not float:
                return [_plain_lr(lr) for lr in lrs]
        return lrs

    def _cuda_memory(self, device: torch.device, now: float) -> tuple[float, float, float]:
        """Allocated, reserved and peak bytes, read at most every ``MEMORY_EVERY`` seconds.

        Each of ``torch.cuda.memory_allocated()``, ``memory_reserved()`` and
        ``max_memory_allocated()`` flattens the allocator's whole statistics tree in Python:
        measured on an H200, the three took 1.5 ms per step, most of a small model's step. One
        nested read (~30 us) a few times a second keeps the gauges current at no visible cost.
        """
        if now - self._memory_at >= MEMORY_EVERY:
            self._memory_at = now
            try:
                stats = torch.cuda.memory_stats_as_nested_dict(device)
                allocated, reserved = stats["allocated_bytes"]["all"], stats["reserved_bytes"]["all"]
                self._memory = (
                    float(allocated["current"]), float(reserved["current"]), float(allocated["peak"])
                )
            except Exception:  # noqa: BLE001 - a gauge, never a reason to stop
                self._memory = _NO_CUDA
        return self._memory
