"""What the :class:`~nnwatch.probe.grad_recorder.GradientRecorder` reads of torch's clips: which
of the model's gradients a clip covers, torch's clips of parts of one model within a step (an
actor and a critic, each with its own ``clip_grad_norm_`` call), and whether the gradients still
carry the AMP loss scale.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import torch

CLIP_EPS = 1e-6  # torch's epsilon in the clip coefficient


def present_grads(params: Sequence[torch.Tensor]) -> tuple[list[int], list[torch.Tensor]]:
    """The indices of ``params`` that have a gradient, and those gradients."""
    present, grads = [], []
    for i, p in enumerate(params):
        if p.grad is not None:
            present.append(i)
            grads.append(p.grad)
    return present, grads


def coverage(
    params: Sequence[torch.Tensor], grads: list[torch.Tensor], attr: str = ""
) -> tuple[str, set[int]]:
    """How ``grads`` (or params, with ``attr="grad"``) cover the gradients of ``params`` (the
    watched model's): ``"all"`` (all of them, perhaps with others), ``"part"`` (some, and nothing
    else) or ``"none"``; with the ids of the gradients given when the answer is ``"part"``.

    The usual call (``clip_grad_norm_(model.parameters(), ...)`` with every parameter
    trained) passes them in the model's order: its ends and its length say so without
    building two sets of the whole model's gradients on every step.
    """
    if params and len(grads) == len(params):
        first, last = grads[0], grads[-1]
        if attr:
            first, last = getattr(first, attr), getattr(last, attr)
        if first is not None and first is params[0].grad and last is params[-1].grad:
            return "all", set()
    ours = {id(p.grad) for p in params if p.grad is not None}
    if not ours:
        return "none", set()
    seen = {id(getattr(g, attr) if attr else g) for g in grads}
    seen.discard(id(None))
    if ours <= seen:
        return "all", set()
    if seen and seen <= ours:
        return "part", seen
    return "none", set()


def loss_scale(scaler: Any) -> torch.Tensor | None:
    """The AMP loss scale tensor of an enabled ``GradScaler``, else None (never ``get_scale()``,
    which syncs)."""
    if scaler is None or not getattr(scaler, "is_enabled", lambda: False)():
        return None
    scale = getattr(scaler, "_scale", None)
    return scale if isinstance(scale, torch.Tensor) else None


def finite(total: torch.Tensor | float) -> bool:
    """Whether a recorded norm is finite: a CPU scalar is read (no ``isfinite`` kernel, tens of
    microseconds on a cold cache), a device one is checked there (the guard's sync)."""
    if isinstance(total, float):
        return math.isfinite(total)
    if total.is_cpu and total.numel() == 1:
        return math.isfinite(total.item())
    return bool(torch.isfinite(total).all())


def still_scaled(scaler: Any) -> bool:
    """The gradients still hold the AMP loss scale: the scaler is on and no optimizer has been
    unscaled (or stepped) since its last ``update()`` (torch keeps that stage per optimizer)."""
    try:
        if not scaler.is_enabled():
            return False
        states = getattr(scaler, "_per_optimizer_states", None)
        if states is None:
            return False
        return all(getattr(s.get("stage"), "name", "") == "READY" for s in states.values())
    except Exception:  # noqa: BLE001 - a scaler of another make: say nothing
        return False


class ClipParts:
    """torch's clips of parts of the model within one step: their norms, thresholds and results.

    Totals stay what torch returned (CPU floats or device tensors): nothing here reads a device.
    """

    __slots__ = ("clips", "ids", "layers", "limits", "norms")

    def __init__(self) -> None:
        self.ids: set[int] = set()  # the gradients covered so far
        self.norms: list[torch.Tensor | float] = []  # each part's norm, in call order
        self.clips: dict[int, float] = {}  # part index -> the max_norm it was clipped with
        self.limits: set[float] = set()
        self.layers: list[tuple[list[int], torch.Tensor]] = []  # each part's per-param sq norms

    def add_norm(self, ids: set[int], total: torch.Tensor | float) -> bool:
        """A new part's norm; False when it overlaps a part already seen."""
        if ids & self.ids:
            return False
        self.ids |= ids
        self.norms.append(total)
        return True

    def add_clip(self, total: torch.Tensor | float, max_norm: float) -> bool:
        """The clip of one of the parts (found by the norm torch passed on); False if none."""
        for k, t in enumerate(self.norms):
            if t is total and k not in self.clips:
                self.clips[k] = float(max_norm)
                self.limits.add(float(max_norm))
                return True
        return False

    def complete(self) -> bool:
        return len(self.clips) == len(self.norms)

    @property
    def limit(self) -> float:
        """The parts' common ``max_norm``; NaN when they differ."""
        return next(iter(self.limits)) if len(self.limits) == 1 else math.nan

    def whole(self) -> torch.Tensor | float:
        """The L2 norm of the whole model's gradients, from its parts' norms."""
        if all(isinstance(t, float) or t.is_cpu for t in self.norms):
            return math.sqrt(sum(float(t) ** 2 for t in self.norms))
        sq = sum(torch.as_tensor(t).float().square() for t in self.norms)
        return torch.as_tensor(sq).sqrt()

    def clipped(self) -> tuple[torch.Tensor | float, torch.Tensor | float]:
        """(the whole model's norm after the clips, 1.0 if any part was clipped else 0.0)."""
        if all(isinstance(t, float) or t.is_cpu for t in self.norms):
            post_sq, hit = 0.0, 0.0
            for k, t in enumerate(self.norms):
                v, lim = float(t), self.clips[k]
                post_sq += (v * min(lim / (v + CLIP_EPS), 1.0)) ** 2
                hit = 1.0 if v > lim else hit
            return math.sqrt(post_sq), hit
        post = []
        flags = []
        for k, t in enumerate(self.norms):
            tt = torch.as_tensor(t).float()
            lim = self.clips[k]
            post.append((tt * (lim / (tt + CLIP_EPS)).clamp(max=1.0)).square())
            flags.append(tt > lim)
        return torch.stack(post).sum().sqrt(), torch.stack(flags).any().float()
