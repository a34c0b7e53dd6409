"""Gradient-norm math that agrees bit for bit with ``torch.nn.utils.clip_grad_norm_``.

Why our own copy: the probe needs the per-parameter norms that torch computes internally and then
throws away, and it must not add a host sync to get them. So the work is split into two building
blocks, :func:`param_grad_norms` (norms, no sync) and :func:`clip_grads_with_norm_` (in-place scale by
the clamped coefficient, no sync), and :func:`global_norm` / :func:`clip_grad_norm_` are thin layers
on top. Bitwise agreement with torch depends on three details we reproduce on purpose:

* tensors are grouped by (device, dtype) with torch's own grouping routine, and the per-tensor norms
  are stacked in *that* group order before the final ``vector_norm`` (the reduction order of the
  final sum decides the last bits);
* each group uses ``torch._foreach_norm`` when torch would, and ``torch.linalg.vector_norm`` per tensor
  otherwise, so low-precision norms are rounded exactly as torch rounds them;
* the clip coefficient is ``clamp(max_norm / (total + 1e-6), max=1)`` and is always multiplied in,
  even when it is 1, which avoids a data-dependent branch (and therefore a sync).
"""

from __future__ import annotations

import types
import warnings
from collections.abc import Iterable

import torch
from torch import Tensor

try:  # torch >= 2.0 exposes these; they decide grouping order and the foreach fast path.
    from torch.utils._foreach_utils import (
        _device_has_foreach_support,
        _group_tensors_by_device_and_dtype,
        _has_foreach_support,
    )
except ImportError:  # pragma: no cover - very old torch: same semantics, order may differ
    _group_tensors_by_device_and_dtype = None  # type: ignore[assignment]

    def _device_has_foreach_support(device: torch.device) -> bool:
        return device.type in ("cpu", "cuda")

    def _has_foreach_support(tensors: list[Tensor], device: torch.device) -> bool:
        return _device_has_foreach_support(device) and all(
            t is None or type(t) in (Tensor, torch.nn.Parameter) for t in tensors
        )


__all__ = [
    "clip_grad_norm_",
    "clip_grads_with_norm_",
    "global_norm",
    "grad_cosine",
    "param_grad_norms",
]

ParamsLike = Tensor | Iterable[Tensor]

_CLIP_EPS = 1e-6  # the same epsilon torch adds to the total norm before dividing


def _as_list(params: ParamsLike) -> list[Tensor]:
    if isinstance(params, Tensor):
        return [params]
    return list(params)


def _groups(tensors: list[Tensor]) -> list[tuple[torch.device, list[Tensor], list[int]]]:
    """Group by (device, dtype) in torch's order; each entry carries the tensors' positions."""
    if _group_tensors_by_device_and_dtype is not None:
        grouped = _group_tensors_by_device_and_dtype([tensors], True)  # type: ignore[list-item]
        return [
            (device, [t for t in tensor_lists[0] if t is not None], list(indices))
            for (device, _dtype), (tensor_lists, indices) in grouped.items()
        ]
    found: dict[tuple[torch.device, torch.dtype], tuple[list[Tensor], list[int]]] = {}
    for i, t in enumerate(tensors):  # pragma: no cover - fallback for very old torch
        ts, idx = found.setdefault((t.device, t.dtype), ([], []))
        ts.append(t)
        idx.append(i)
    return [(dev, ts, idx) for (dev, _), (ts, idx) in found.items()]  # pragma: no cover


def _use_foreach(foreach: bool | None, tensors: list[Tensor], device: torch.device) -> bool:
    if foreach is None:
        return _has_foreach_support(tensors, device)
    if foreach:
        if not _device_has_foreach_support(device):
            raise RuntimeError(
                f"foreach=True was passed, but can't use the foreach API on {device.type} tensors"
            )
        return True
    return False


@torch.no_grad()
def param_grad_norms(
    params: ParamsLike, norm_type: float = 2.0, foreach: bool | None = None
) -> tuple[Tensor, list[int], list[Tensor]]:
    """Total gradient norm plus each parameter's own gradient norm, without a host sync.

    Returns ``(total, indices, norms)``: ``total`` is bitwise what ``clip_grad_norm_`` would return,
    ``indices`` are the positions (in ``params``) of the parameters that have a ``.grad``, and
    ``norms[i]`` is the 0-dim norm of ``params[indices[i]].grad`` (in the gradient's dtype).
    With no gradients at all the total is ``tensor(0.)`` and both lists are empty.
    """
    plist = _as_list(params)
    norm_type = float(norm_type)
    indices = [i for i, p in enumerate(plist) if p.grad is not None]
    grads: list[Tensor] = [plist[i].grad for i in indices]  # type: ignore[misc]
    if not grads:
        return torch.tensor(0.0), [], []
    first_device = grads[0].device

    stacked_order: list[Tensor] = []  # torch's order: decides the bits of the final reduction
    per_grad: list[Tensor | None] = [None] * len(grads)
    for device, group, positions in _groups(grads):
        if _use_foreach(foreach, group, device):
            norms = list(torch._foreach_norm(group, norm_type))
        else:
            norms = [torch.linalg.vector_norm(g, norm_type) for g in group]
        stacked_order.extend(norms)
        for pos, n in zip(positions, norms, strict=True):
            per_grad[pos] = n

    total = torch.linalg.vector_norm(
        torch.stack([n.to(first_device) for n in stacked_order]), norm_type
    )
    return total, indices, [n for n in per_grad if n is not None]


@torch.no_grad()
def clip_grads_with_norm_(
    params: ParamsLike, max_norm: float, total_norm: Tensor, foreach: bool | None = None
) -> None:
    """Scale every gradient in place by ``min(max_norm / (total_norm + 1e-6), 1)``, as torch does.

    The coefficient stays a tensor and is always applied, so no value crosses to the host.
    """
    grads = [p.grad for p in _as_list(params) if p.grad is not None]
    if not grads:
        return
    coef = torch.clamp(float(max_norm) / (total_norm + _CLIP_EPS), max=1.0)
    for device, group, _ in _groups(grads):  # type: ignore[arg-type]
        coef_here = coef.to(device)
        if _use_foreach(foreach, group, device):
            torch._foreach_mul_(group, coef_here)
        else:
            for g in group:
                g.mul_(coef_here)


def _raise_if_nonfinite(total: Tensor, norm_type: float) -> None:
    if bool(torch.logical_or(total.isnan(), total.isinf())):  # the one deliberate sync
        raise RuntimeError(
            f"The total norm of order {float(norm_type)} for gradients from `parameters` is "
            "non-finite, so it cannot be clipped. A NaN or Inf reached the gradients (look at the "
            "loss and the last layers first); to scale the gradients by the non-finite norm "
            "anyway, pass error_if_nonfinite=False."
        )


def global_norm(params: ParamsLike, norm_type: float = 2.0) -> Tensor:
    """The norm of all gradients viewed as one vector (what ``clip_grad_norm_`` returns)."""
    total, _, _ = param_grad_norms(params, norm_type)
    return total


def clip_grad_norm_(
    params: ParamsLike,
    max_norm: float,
    norm_type: float = 2.0,
    error_if_nonfinite: bool = False,
    foreach: bool | None = None,
) -> Tensor:
    """Drop-in for ``torch.nn.utils.clip_grad_norm_``: same total norm, same clipped gradients."""
    is_generator = isinstance(params, types.GeneratorType)
    plist = _as_list(params)
    if is_generator and not plist:
        warnings.warn(
            "`parameters` is an empty generator, no gradient clipping will occur.", stacklevel=2
        )
    total, _, _ = param_grad_norms(plist, norm_type, foreach)
    if error_if_nonfinite:
        _raise_if_nonfinite(total, norm_type)
    clip_grads_with_norm_(plist, max_norm, total, foreach)
    return total


@torch.no_grad()
def grad_cosine(a: Iterable[Tensor], b: Iterable[Tensor]) -> float:
    """Cosine similarity of two gradient sets, each flattened into one float64 vector.

    Used to show that norm clipping keeps the direction (cosine 1) while value clamping bends it.
    Returns 1.0 when both are zero vectors and 0.0 when only one is.
    """
    va = torch.cat([t.detach().reshape(-1).to(torch.float64) for t in a] or [torch.zeros(0)])
    vb = torch.cat([t.detach().reshape(-1).to(torch.float64) for t in b] or [torch.zeros(0)])
    if va.shape != vb.shape:
        raise ValueError(f"gradient sets differ in size: {va.numel()} vs {vb.numel()} elements")
    na, nb = float(va.norm()), float(vb.norm())
    if na == 0.0 and nb == 0.0:
        return 1.0
    if na == 0.0 or nb == 0.0:
        return 0.0
    return float(torch.dot(va, vb) / (na * nb))
