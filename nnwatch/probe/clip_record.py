"""Writing a norm clip into the step record, and nnwatch's own ``w.clip_grad_norm_``.

Kept apart from :class:`~nnwatch.probe.grad_recorder.GradientRecorder`, which decides *when* a
clip is recorded (on the training hot path): here is only *how* its numbers reach the record (as
Python floats into a CPU record, as device tensors elsewhere), and the user's explicit clip call,
which is cold.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol

import torch

from nnwatch.probe.buffers import DEV_INDEX, StepBuffers
from nnwatch.probe.clip_parts import CLIP_EPS, ClipParts
from nnwatch.store.schema import FieldName
from nnwatch.tensors import torch_clip as gradmath
from nnwatch.tensors.grad_norms import LayerReducer

_NORM_CLIPPED = DEV_INDEX[FieldName.GRAD_NORM_CLIPPED]
_CLIPPED = DEV_INDEX[FieldName.CLIPPED]


class ClipOwner(Protocol):
    """What :func:`clip_and_record` needs of the gradient recorder."""

    buf: StepBuffers
    reducer: LayerReducer
    done: bool
    total: torch.Tensor | float | None

    def record_clip(
        self, total: torch.Tensor | float, max_norm: float, l2: torch.Tensor | float | None = None
    ) -> None: ...


def write_clip(
    b: StepBuffers, total: torch.Tensor | float, max_norm: float, l2: torch.Tensor | float | None
) -> None:
    """The clipped norm and the clipped flag of a clip at ``max_norm`` of gradients whose norm
    was ``total`` (``l2``: their L2 norm, when ``total`` is another norm)."""
    host = b.dev_np
    if host is not None:  # CPU: Python floats straight into the record, no torch call
        t = total if isinstance(total, float) else float(total.detach())
        coef = min(max_norm / (t + CLIP_EPS), 1.0)
        base = t if l2 is None else (l2 if isinstance(l2, float) else float(l2))
        host[_NORM_CLIPPED] = base * coef
        host[_CLIPPED] = 1.0 if t > max_norm else 0.0
        return
    tt = torch.as_tensor(total).detach().to(device=b.dev.device, dtype=torch.float64)
    coef_t = (max_norm / (tt + CLIP_EPS)).clamp(max=1.0)
    base_t = tt if l2 is None else torch.as_tensor(l2).detach().to(b.dev.device, torch.float64)
    b.slot(FieldName.GRAD_NORM_CLIPPED).copy_(base_t * coef_t)
    b.slot(FieldName.CLIPPED).copy_(tt > max_norm)


def write_parts_clip(b: StepBuffers, parts: ClipParts) -> None:
    """The clipped norm and flag of the whole model, clipped by torch in parts."""
    post, hit = parts.clipped()
    if b.dev_np is not None:
        b.dev_np[_NORM_CLIPPED] = float(post)
        b.dev_np[_CLIPPED] = float(hit)
        return
    b.slot(FieldName.GRAD_NORM_CLIPPED).copy_(torch.as_tensor(post).to(b.dev.device, torch.float64))
    b.slot(FieldName.CLIPPED).copy_(torch.as_tensor(hit).to(b.dev.device, torch.float64))


def clip_and_record(
    rec: ClipOwner,
    params: list[torch.Tensor],
    limit: float | None,
    norm_type: float,
    error_if_nonfinite: bool,
    foreach: bool | None,
    *,
    per_layer: bool,
    record: bool,
    warn: Callable[[str, str], None],
) -> torch.Tensor:
    """``w.clip_grad_norm_`` at ``limit`` (the user's ``max_norm`` or the monitor's threshold),
    clipping like torch (bitwise) and recording both norms into ``rec`` (see
    :meth:`~nnwatch.probe.grad_recorder.GradientRecorder.clip`). Returns torch's total norm."""
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
        b = rec.buf
        tot = total.to(device=b.dev.device)
        b.slot(FieldName.GRAD_NORM).copy_(tot)
        b.slot(FieldName.NONFINITE_GRADS).copy_(~torch.isfinite(tot))
        if per_layer and norms:
            rec.reducer.write(torch.stack([n.double() for n in norms]), present, b.grad_layer, norm_type)
        if limit is not None:
            rec.record_clip(tot, float(limit))
        rec.done, rec.total = True, tot
    except Exception as exc:  # noqa: BLE001 - clipping happened; recording must not raise
        warn("clip-record", f"could not record the clip: {exc!r}")
    return total
