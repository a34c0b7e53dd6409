"""Check C: are the gradients a sane size, and does clipping keep their direction?

One forward/backward on a copy gives the raw global gradient norm. The check then clips a copy of
those gradients by norm (with :mod:`nnwatch.tensors.torch_clip`, bitwise what ``clip_grad_norm_`` does) and by
value, and compares each with the raw gradient: norm clipping multiplies every gradient by one
positive number, so its cosine with the raw gradient is 1; value clamping cuts the large
components and bends the descent direction, so its cosine drops. Seeing both numbers side by side
is the argument for clipping by norm.

Verdict (documented thresholds):

* ``NON-FINITE`` when the norm is NaN/Inf;
* ``EXPLODING: clipping recommended`` when the raw norm exceeds ``10 x max_norm``
  (clipping would shrink every update at least tenfold);
* ``VANISHING`` when the raw norm is below ``1e-6``, when a trainable layer's gradient is exactly
  zero, or when some layer's norm is below ``1e-4`` of the largest layer's;
* ``HEALTHY`` otherwise.

A layer that holds at least 80% of the squared norm is named (it "dominates").
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, ClassVar

import torch
from torch import nn

from nnwatch.checks.common import (
    CheckResult,
    LossFn,
    call_model,
    compute_loss,
    layer_of,
    model_device,
    prepared_copy,
    seeded,
    split_batch,
    to_device,
    trainable_named_params,
)
from nnwatch.tensors import torch_clip as ngrad

EXPLODING_FACTOR = 10.0
VANISHING_NORM = 1e-6
VANISHING_RATIO = 1e-4
DOMINANCE = 0.8


@dataclass(frozen=True)
class GradientResult(CheckResult):
    """Outcome of :func:`gradient_check`."""

    check_name: ClassVar[str] = "Gradient norm"
    passed: bool
    verdict: str
    norm_type: float
    max_norm: float
    raw_norm: float
    clipped_norm: float
    cosine: float
    clip_value: float
    clamped_norm: float
    clamped_cosine: float
    layer_norms: dict[str, float] = field(default_factory=dict)
    dominant_layers: list[str] = field(default_factory=list)
    zero_grad_layers: list[str] = field(default_factory=list)
    without_grad: list[str] = field(default_factory=list)
    causes: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    skipped: bool = False

    def summary(self) -> str:
        return (
            f"{self.raw_norm:.2f} -> {self.clipped_norm:.4f} (max_norm {self.max_norm}), "
            f"cosine {self.cosine:.4f}"
        )


def _layer_norms(
    names: list[str], idx: list[int], norms: list[torch.Tensor], norm_type: float
) -> dict[str, float]:
    by_layer: dict[str, list[torch.Tensor]] = {}
    for i, n in zip(idx, norms, strict=True):
        by_layer.setdefault(layer_of(names[i]), []).append(n.double())
    return {
        layer: float(torch.linalg.vector_norm(torch.stack(ns), norm_type))
        for layer, ns in by_layer.items()
    }


def _share(layer: float, total: float, norm_type: float) -> float:
    if total == 0.0 or not math.isfinite(total):
        return 0.0
    if math.isinf(norm_type):
        return 1.0 if layer == total else 0.0
    return float((layer / total) ** norm_type)


def gradient_check(
    model: nn.Module,
    batch: Any,
    loss_fn: LossFn,
    max_norm: float = 1.0,
    *,
    norm_type: float = 2.0,
    clip_value: float | None = None,
    seed: int = 0,
) -> GradientResult:
    """Raw vs norm-clipped vs value-clamped gradients of one backward pass on a copy of ``model``.

    ``clip_value`` defaults to ``max_norm / sqrt(number of gradient elements)``: the same budget
    spread evenly over the elements, which is the fair value-clamping counterpart of ``max_norm``.
    """
    named = _backward(model, batch, loss_fn, seed)
    names = [n for n, _ in named]
    params = [p for _, p in named]
    total, idx, per_param = ngrad.param_grad_norms(params, norm_type)
    raw = [params[i].grad.detach().clone() for i in idx]  # type: ignore[union-attr]
    layer_norms = _layer_norms(names, idx, per_param, norm_type)
    raw_norm = float(total)
    ngrad.clip_grads_with_norm_(params, max_norm, total)
    clipped = [params[i].grad for i in idx]
    clipped_norm = float(ngrad.global_norm(params, norm_type))
    cosine = ngrad.grad_cosine(clipped, raw)  # type: ignore[arg-type]
    numel = sum(g.numel() for g in raw)
    value = clip_value if clip_value is not None else max_norm / math.sqrt(max(numel, 1))
    clamped_norm, clamped_cosine = _clamped(raw, value, norm_type)
    without_grad = [n for n, p in named if p.grad is None]
    layers = _LayerGroups.of(layer_norms, raw_norm, norm_type)
    causes: list[str] = []
    warnings: list[str] = []
    verdict = _verdict(raw_norm, max_norm, norm_type, bool(idx), layers, causes, warnings)
    if without_grad:
        warnings.append(f"parameters that got no gradient: {', '.join(without_grad[:6])}")
    if math.isfinite(raw_norm) and raw_norm > 0 and abs(cosine - 1.0) > 1e-3:
        warnings.append(
            f"norm clipping changed the direction (cosine {cosine:.6f}): precision loss"
        )
    return GradientResult(
        passed=verdict == "HEALTHY",
        verdict=verdict,
        norm_type=float(norm_type),
        max_norm=float(max_norm),
        raw_norm=raw_norm,
        clipped_norm=clipped_norm,
        cosine=cosine,
        clip_value=float(value),
        clamped_norm=clamped_norm,
        clamped_cosine=clamped_cosine,
        layer_norms=layer_norms,
        dominant_layers=layers.dominant,
        zero_grad_layers=layers.zero,
        without_grad=without_grad,
        causes=causes,
        warnings=warnings,
    )


def _backward(model: nn.Module, batch: Any, loss_fn: LossFn, seed: int) -> list[tuple[str, nn.Parameter]]:
    """One forward and backward of a copy of ``model``: its trainable parameters, with gradients."""
    with seeded(seed):
        net = prepared_copy(model)
        inputs, targets = to_device(split_batch(batch), model_device(net))
        loss = compute_loss(loss_fn, call_model(net, inputs), targets)
        named = trainable_named_params(net)
        if loss.requires_grad:
            loss.backward()
    return named


def _clamped(raw: list[torch.Tensor], value: float, norm_type: float) -> tuple[float, float]:
    """The norm of the gradients clamped to ``[-value, value]``, and their cosine to the raw ones."""
    clamped = [g.clamp(-value, value) for g in raw]
    clamped_norm = (
        float(
            torch.linalg.vector_norm(
                torch.stack([torch.linalg.vector_norm(g.double(), norm_type) for g in clamped]),
                norm_type,
            )
        )
        if clamped
        else 0.0
    )
    return clamped_norm, ngrad.grad_cosine(clamped, raw)


@dataclass(frozen=True)
class _LayerGroups:
    """The layers whose gradient is exactly zero, tiny beside the largest, or most of the norm."""

    norms: dict[str, float]
    zero: list[str]
    tiny: list[str]
    dominant: list[str]
    dominant_text: str

    @classmethod
    def of(cls, layer_norms: dict[str, float], raw_norm: float, norm_type: float) -> _LayerGroups:
        largest = max(layer_norms.values(), default=0.0)
        tiny = [  # in model order: the first ones listed are the earliest layers
            layer
            for layer, v in layer_norms.items()
            if 0.0 < v < VANISHING_RATIO * largest and math.isfinite(largest)
        ]
        dominant = [
            layer
            for layer, v in layer_norms.items()
            if len(layer_norms) > 1 and _share(v, raw_norm, norm_type) >= DOMINANCE
        ]
        text = ", ".join(
            f"{layer} ({100 * _share(layer_norms[layer], raw_norm, norm_type):.0f}% of the norm)"
            for layer in dominant
        )
        zero = [layer for layer, v in layer_norms.items() if v == 0.0]
        return cls(layer_norms, zero, tiny, dominant, text)


def _verdict(
    raw_norm: float,
    max_norm: float,
    norm_type: float,
    any_grad: bool,
    layers: _LayerGroups,
    causes: list[str],
    warnings: list[str],
) -> str:
    """NON-FINITE, EXPLODING, VANISHING or HEALTHY, with the causes (or warnings) behind it."""
    if not math.isfinite(raw_norm):
        bad = [layer for layer, v in layers.norms.items() if not math.isfinite(v)]
        causes.append(
            f"non-finite gradients in {', '.join(bad) or 'some layers'}: look for log(0), division "
            "by zero or overflow in the loss and the last layers; torch.autograd.set_detect_anomaly "
            "finds the operation"
        )
        return "NON-FINITE"
    if raw_norm > EXPLODING_FACTOR * max_norm:
        causes.append(
            f"the gradient norm {raw_norm:.3g} is {raw_norm / max_norm:.0f}x max_norm: clip with "
            f"clip_grad_norm_(params, {max_norm:g}), lower the learning rate, or check the "
            "input scale and the initialization"
        )
        if layers.dominant:
            causes.append(f"one layer dominates: {layers.dominant_text}")
        return "EXPLODING: clipping recommended"
    if raw_norm < VANISHING_NORM or layers.zero or layers.tiny:
        causes += _vanishing_causes(raw_norm, any_grad, layers)
        return "VANISHING"
    if layers.dominant:
        warnings.append(f"one layer dominates the gradient: {layers.dominant_text}")
    return "HEALTHY"


def _vanishing_causes(raw_norm: float, any_grad: bool, layers: _LayerGroups) -> list[str]:
    causes: list[str] = []
    if not any_grad:
        causes.append(
            "no parameter received a gradient: the loss is disconnected from the parameters "
            "(.detach(), .item() or torch.no_grad() inside forward)"
        )
    elif raw_norm < VANISHING_NORM:
        causes.append(f"the whole gradient is tiny ({raw_norm:.2e})")
    if layers.zero:
        causes.append(
            f"layers with an exactly zero gradient: {', '.join(layers.zero[:6])} "
            "(dead ReLUs upstream, saturated activations, or a detached path)"
        )
    if layers.tiny:
        causes.append(
            f"layers whose gradient is below {VANISHING_RATIO:g} of the largest layer's: "
            f"{', '.join(layers.tiny[:6])} (saturating activations such as sigmoid/tanh in a "
            "deep stack, or a poor init; try ReLU/GELU, normalization layers or residuals)"
        )
    return causes
