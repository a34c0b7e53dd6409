"""The gradient recorder of a sharded model (FSDP2, tensor parallel): the same moments, whole norms.

Each rank sees only its pieces of the gradients (DTensors), and the norm it could compute alone
is not the model's. So wherever the plain recorder takes a norm (torch's clip, the end of
backward, the update), this one hands the local squares of the same gradients to the
:class:`~nnwatch.probe.sharded_reduce.ShardedReduce`, which makes them whole across the ranks
and writes the record's gradient fields a step later. What is kept here for the step is the
local sum of squares: a NaN or Inf in this rank's pieces shows in it at once, which is what the
non-finite guard needs before the update, with no collective.

Every step takes the per-parameter local squares (one fused norm over the local pieces): the
reduce needs them to count each replica once, and with them every step's per-layer norms come at
no extra cost. Not supported here, and said once: a clip of a part of the model, a clip by
another norm, and a threshold set from a monitor (``set_clip``).
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable
from typing import Any

import torch

from nnwatch.probe.buffers import DEV_INDEX
from nnwatch.probe.clip_parts import coverage, loss_scale
from nnwatch.probe.grad_recorder import FORGET_CLIP, GradientRecorder
from nnwatch.probe.sharded_reduce import ShardedReduce
from nnwatch.store.schema import FieldName
from nnwatch.tensors import torch_clip as gradmath
from nnwatch.tensors.sharded import is_dtensor

log = logging.getLogger("nnwatch")


class ShardedGradientRecorder(GradientRecorder):
    """A :class:`GradientRecorder` whose norms are made whole by a :class:`ShardedReduce`."""

    def __init__(self, *args: Any, shards: ShardedReduce, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.shards = shards
        self._said: set[str] = set()

    def _say(self, key: str, message: str) -> None:
        if key not in self._said:
            self._said.add(key)
            log.warning("nnwatch: sharded parameters: %s", message)

    def measure_now(self, unscale: bool = False, layers: bool = True) -> torch.Tensor | float | None:
        """This rank's pieces of the gradients as they are now, handed to the reduce; the local
        sum of squares is kept (for the guard) and written into the record until the whole one
        replaces it."""
        present, grads = self.grads()
        self.done = True
        if not grads:
            return None
        sq = self.shards.take_grads(present, grads, layers)
        scale = loss_scale(self.scaler) if unscale else None
        if scale is not None:
            self._say("amp", "gradient norms with a GradScaler are recorded still scaled")
        self.layers_done = layers
        if layers:  # this rank's pieces, per layer: a NaN's place for the guard, until the record
            self._local_layers(present)  # is completed with the whole norms a step later
        if isinstance(sq, float):
            self.total = math.sqrt(sq) if sq == sq else sq
        else:
            self.total = sq.sqrt()  # a GPU's: read only by the guard, where it syncs anyway
        host = self.buf.dev_np
        if host is not None and isinstance(self.total, float):
            host[DEV_INDEX[FieldName.GRAD_NORM]] = self.total
            host[DEV_INDEX[FieldName.NONFINITE_GRADS]] = 0.0 if math.isfinite(self.total) else 1.0
        return self.total

    def _local_layers(self, present: list[int]) -> None:
        b, local = self.buf, self.shards.local
        if b.grad_layer_np is not None and local.is_cpu:
            self.reducer.write_host(local.numpy(), present, b.grad_layer_np)
        else:
            self.reducer.write(local, present, b.grad_layer, squared=True)

    def light_norm(self) -> torch.Tensor | float | None:
        return self.measure_now(layers=False)

    def _norm_of_now(self) -> torch.Tensor | float | None:
        return None  # a manual rescale after backward is not followed on sharded gradients

    def on_total_norm(self, grads: list[torch.Tensor], norm_type: float, total: torch.Tensor) -> None:
        """torch's clip computed the norm of this model's gradients (not yet clipped): the same
        gradients are measured here, locally, and made whole by the reduce."""
        if not is_dtensor(total):
            super().on_total_norm(grads, norm_type, total)
            return
        if self.from_torch:
            return
        cover, _ = coverage(self.plan.params, grads)
        if cover == "none":
            return
        if cover == "part" or norm_type != 2.0:
            self._say("parts", "a clip of part of the model, or by another norm than L2, is not "
                      "recorded; the norms are those taken when backward ended")  # fmt: skip
            return
        self.measure_now(layers=self.measure)
        self._took_torch_total(self.total if self.total is not None else math.nan)

    def on_clip(self, params: list[torch.Tensor], max_norm: float, total: torch.Tensor) -> None:
        if not is_dtensor(total):
            super().on_clip(params, max_norm, total)
            return
        if self.from_torch or self._matches(params, "grad"):
            self.record_clip(total, max_norm)
            if self.from_torch:
                self.torch_clips = FORGET_CLIP

    def record_clip(
        self, total: torch.Tensor | float, max_norm: float, l2: torch.Tensor | float | None = None
    ) -> None:
        """The threshold now; the clipped norm once the whole norm is known (a step later)."""
        self.threshold = float(max_norm)
        self.clip_seen = True
        self.shards.clip_at(max_norm)

    def apply_override(self) -> None:
        self._say("set_clip", "a threshold set from a monitor is not applied to sharded gradients")

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
        """``w.clip_grad_norm_``: torch's own clip on the DTensors (its total, as torch returns
        it); the norms recorded are measured before it, like torch's clip's."""
        if record and per_layer and norm_type == 2.0:
            try:
                self.measure_now(layers=self.measure)
                self.from_torch = True
            except Exception as exc:  # noqa: BLE001 - the clip still happens
                warn("clip-record", f"could not record the clip: {exc!r}")
        limit = self.override if self.override is not None else max_norm
        if limit is None:
            return gradmath.global_norm(params, norm_type)
        total = torch.nn.utils.clip_grad_norm_(params, limit, norm_type, error_if_nonfinite, foreach)
        return total
