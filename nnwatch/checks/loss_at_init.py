"""Check A: is the loss before any training step close to ln(K)?

A freshly initialised K-class classifier should be unsure of everything, so its cross-entropy is
about -ln(1/K) = ln(K). A value far from that, before a single step, points at a bug that the
optimizer would otherwise spend thousands of steps fighting (or hide). This check measures the loss
on a copy of the model and, when it is off, says which of the usual suspects the evidence favours.

Tolerance (documented contract): the check passes when ``|measured - ln K| <= 0.1 * ln K + 0.05``
(for K=10: +-0.28), and the outputs are not already probabilities.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, ClassVar

import torch
from torch import Tensor, nn

from nnwatch.checks.common import (
    CheckResult,
    LossFn,
    call_model,
    compute_loss,
    is_classification,
    looks_like_probabilities,
    model_device,
    prepared_copy,
    seeded,
    split_batch,
    to_device,
    with_generic_causes,
)

REL_TOLERANCE = 0.1
ABS_TOLERANCE = 0.05

# (keyword, cause): listed in full when no evidence points anywhere, else as one reminder line.
GENERIC_CAUSES = (
    (
        "reduction",
        "wrong loss scaling (reduction='sum', or the loss multiplied or divided by a constant)",
    ),
    (
        "softmax",
        "softmax applied twice (the model ends in softmax and CrossEntropyLoss applies "
        "log_softmax)",
    ),
    ("init", "bad initialization of the last layer (weights or bias too large)"),
    ("normalized", "un-normalized inputs (raw pixel values or features with a large scale)"),
)


@dataclass(frozen=True)
class InitialLossResult(CheckResult):
    """Outcome of :func:`initial_loss`."""

    check_name: ClassVar[str] = "Initial loss"
    passed: bool
    verdict: str
    measured: float
    expected: float | None
    num_classes: int | None
    tolerance: float | None
    logit_std: float | None = None
    label_entropy: float | None = None
    causes: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    skipped: bool = False

    def summary(self) -> str:
        if self.expected is None:
            return f"{self.measured:.4f}  (not classification: ln(K) does not apply)"
        return f"{self.measured:.4f}  expected ln({self.num_classes}) = {self.expected:.4f}"


def _last_weighted_layer(model: nn.Module) -> tuple[str, nn.Module] | None:
    last = None
    for name, m in model.named_modules():
        if isinstance(m, (nn.Linear, nn.Conv1d, nn.Conv2d, nn.Conv3d)):
            last = (name, m)
    return last


def _label_entropy(targets: Tensor, num_classes: int) -> float:
    counts = torch.bincount(
        targets.reshape(-1).long().clamp(0, num_classes - 1), minlength=num_classes
    )
    p = counts.double() / counts.sum()
    p = p[p > 0]
    return float(-(p * p.log()).sum())


def _evidence(
    *,
    measured: float,
    expected: float,
    tolerance: float,
    output: Tensor,
    inputs: Any,
    model: nn.Module,
    n: int,
    probabilities: bool,
) -> list[str]:
    found: list[str] = []
    if probabilities:
        found.append(
            "the model's outputs already sum to 1 over the classes: softmax is applied in the "
            "model and again inside the loss (CrossEntropyLoss expects raw logits; drop the "
            "final softmax)"
        )
    if n > 1 and abs(measured / expected - n) <= 0.15 * n:
        found.append(
            f"the loss is about {n} x ln(K) for a batch of {n}: it is summed over the batch "
            "(reduction='sum') rather than averaged"
        )
    if measured > expected + tolerance:
        x = inputs if isinstance(inputs, Tensor) else None
        if x is not None and x.is_floating_point():
            mean, std = float(x.float().mean()), float(x.float().std())
            if abs(mean) > 1.0 or std > 5.0:
                found.append(
                    f"un-normalized inputs: mean {mean:.3g}, std {std:.3g} (normalize to mean 0, "
                    "std 1 per channel)"
                )
        last = _last_weighted_layer(model)
        if last is not None:
            name, layer = last
            w = layer.weight.detach().float()  # type: ignore[operator]
            fan_in = w[0].numel()
            default_std = 1.0 / math.sqrt(
                3.0 * fan_in
            )  # PyTorch's default (kaiming_uniform a=sqrt5)
            w_std = float(w.std()) if w.numel() > 1 else 0.0
            if w_std > 3.0 * default_std:
                found.append(
                    f"bad init of the last layer '{name}': weight std {w_std:.3g}, "
                    f"{w_std / default_std:.0f}x PyTorch's default {default_std:.3g}"
                )
            b = getattr(layer, "bias", None)
            if isinstance(b, Tensor) and b.numel() > 1 and float(b.detach().float().std()) > 1.0:
                found.append(
                    f"bad init of the last layer '{name}': bias std {float(b.float().std()):.3g} "
                    "(start it at zero, or at log class priors)"
                )
    elif measured < expected - tolerance and not probabilities:
        found.append(
            "lower than chance before training: the loss may be scaled down, the labels may leak "
            "into the inputs, or the last-layer bias encodes class priors (fine for imbalanced data)"
        )
    return found


def initial_loss(
    model: nn.Module,
    batch: Any,
    loss_fn: LossFn,
    num_classes: int | None = None,
    *,
    seed: int = 0,
) -> InitialLossResult:
    """Measure the loss of an untrained copy of ``model`` on ``batch`` and compare it with ln(K).

    ``num_classes`` defaults to the size of the output's class dimension (dim 1). For targets that
    are not class indices the check is skipped (it passes, with ``skipped=True``).
    """
    with seeded(seed):
        net = prepared_copy(model)
        inputs, targets = to_device(split_batch(batch), model_device(net))
        with torch.no_grad():
            output = call_model(net, inputs)
            loss = compute_loss(loss_fn, output, targets)
    measured = float(loss)

    if not is_classification(output, targets):
        return InitialLossResult(
            passed=True, verdict="SKIPPED", measured=measured, expected=None, num_classes=None,
            tolerance=None, skipped=True,
        )  # fmt: skip
    assert targets is not None
    k = int(num_classes) if num_classes is not None else int(output.shape[1])
    if k < 2:
        raise ValueError(f"num_classes must be at least 2, got {k}")
    expected = math.log(k)
    tolerance = REL_TOLERANCE * expected + ABS_TOLERANCE
    logit_std = float(output.detach().float().std()) if output.numel() > 1 else 0.0
    entropy = _label_entropy(targets, k)
    probabilities = looks_like_probabilities(output)
    n = int(targets.shape[0])

    if not math.isfinite(measured):
        return _non_finite(measured, expected, k, tolerance, logit_std, entropy)
    evidence = _evidence(
        measured=measured,
        expected=expected,
        tolerance=tolerance,
        output=output,
        inputs=inputs,
        model=net,
        n=n,
        probabilities=probabilities,
    )
    return _judged(measured, expected, k, tolerance, logit_std, entropy, probabilities, evidence)


def _non_finite(
    measured: float, expected: float, k: int, tolerance: float, logit_std: float, entropy: float
) -> InitialLossResult:
    return InitialLossResult(
        passed=False,
        verdict="NON-FINITE",
        measured=measured,
        expected=expected,
        num_classes=k,
        tolerance=tolerance,
        logit_std=logit_std,
        label_entropy=entropy,
        causes=[
            "the loss is NaN/Inf before any step: a log of zero or of a probability "
            "(use logits with CrossEntropyLoss), a division by zero, or inputs with NaN"
        ],
    )


def _judged(
    measured: float,
    expected: float,
    k: int,
    tolerance: float,
    logit_std: float,
    entropy: float,
    probabilities: bool,
    evidence: list[str],
) -> InitialLossResult:
    """OK within the tolerance of ln(K); else softmax twice, too high or too low, with causes."""
    within = abs(measured - expected) <= tolerance
    passed = within and not probabilities
    if passed:
        verdict = "OK"
    elif probabilities:
        verdict = "SOFTMAX TWICE"
    else:
        verdict = "TOO HIGH" if measured > expected else "TOO LOW"
    causes: list[str] = []
    if not passed:
        causes = with_generic_causes(evidence, GENERIC_CAUSES)
    warnings: list[str] = []
    if passed and entropy < expected - tolerance:
        warnings.append(
            f"the labels in this batch are imbalanced (entropy {entropy:.3f} < ln(K)); "
            "a last-layer bias set to the log class priors would start at that loss"
        )
    return InitialLossResult(
        passed=passed,
        verdict=verdict,
        measured=measured,
        expected=expected,
        num_classes=k,
        tolerance=tolerance,
        logit_std=logit_std,
        label_entropy=entropy,
        causes=causes,
        warnings=warnings,
    )
