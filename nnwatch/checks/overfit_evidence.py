"""What a single-batch overfit run shows about the loop it trained with: the optimizer's setup,
what the training loop saw (:class:`OverfitRun`), what a failed run's model shows afterwards (dead
units, an output blind to the input, conflicting labels), and that evidence in words.

Apart from the check itself (``overfit.py``, which trains the copy and gives the verdict) because
reading the evidence is a concept of its own: each finding is a cause the user can act on.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor, nn

from nnwatch.checks.common import call_model, conflicting_labels, group_lr, looks_like_probabilities

DIVERGENCE_FACTOR = 10.0  # a loss 10x its start means the updates are too large


def describe_optimizer(opt: torch.optim.Optimizer) -> str:
    lrs = sorted({group_lr(g) for g in opt.param_groups})
    lr = ", ".join(f"{v:g}" for v in lrs)
    return f"{type(opt).__name__}(lr={lr})"


def _dead_relu_fractions(model: nn.Module, inputs: Any) -> dict[str, float]:
    """Fraction of units (channels) of each ReLU module that are zero for every sample."""
    found: dict[str, float] = {}
    handles = []

    def hook(name: str) -> Callable[..., None]:
        def record(_m: nn.Module, _i: Any, out: Any) -> None:
            if isinstance(out, Tensor) and out.dim() >= 2:
                alive = (out.detach() != 0).transpose(0, 1).reshape(out.shape[1], -1).any(dim=1)
                found[name] = 1.0 - float(alive.float().mean())

        return record

    for name, m in model.named_modules():
        if isinstance(m, (nn.ReLU, nn.ReLU6)):
            handles.append(m.register_forward_hook(hook(name)))
    try:
        with torch.no_grad():
            call_model(model, inputs)
    finally:
        for h in handles:
            h.remove()
    return found


def _output_ignores_input(output: Tensor) -> bool:
    if output.dim() == 0 or output.shape[0] < 2:
        return False
    o = output.detach().float()
    spread = float((o - o[:1]).abs().max())
    return spread <= 1e-6 * (float(o.abs().max()) + 1e-12)


@dataclass
class OverfitSetup:
    """What the optimizer says before any step: parameters it misses, a zero LR."""

    not_in_opt: list[str]
    zero_lr: bool
    opt: torch.optim.Optimizer


@dataclass
class OverfitRun:
    """What the training loop saw, and what a failed run's model shows afterwards."""

    threshold: float
    losses: list[float] = field(default_factory=list)
    accs: list[float] = field(default_factory=list)
    without_grad: list[str] = field(default_factory=list)
    zero_grad_layers: list[str] = field(default_factory=list)
    accumulate: bool = False
    passed_at: int | None = None
    classification: bool | None = None
    failure: str | None = None
    output: Tensor | None = None  # the model's latest output
    dead: dict[str, float] = field(default_factory=dict)
    ignores_input: bool = False
    conflicts: int = 0


def post_mortem(net: nn.Module, inputs: Any, targets: Any, run: OverfitRun) -> None:
    """A run that did not pass: its dead units, an output blind to the input, conflicting labels."""
    run.dead = {k: v for k, v in _dead_relu_fractions(net, inputs).items() if v >= 0.5}
    if run.output is not None:
        run.ignores_input = _output_ignores_input(run.output)
    if run.classification and targets is not None:
        run.conflicts = conflicting_labels(inputs, targets)


def setup_evidence(setup: OverfitSetup, run: OverfitRun, warnings: list[str]) -> list[str]:
    """What is wrong with the loop itself: a failed step, the optimizer, zero_grad, the graph."""
    evidence: list[str] = []
    not_in_opt, without_grad = setup.not_in_opt, run.without_grad
    if run.failure:
        evidence.append(run.failure)
    if not_in_opt:
        evidence.append(
            f"parameters missing from the optimizer: {', '.join(not_in_opt[:6])}"
            + (f" (+{len(not_in_opt) - 6} more)" if len(not_in_opt) > 6 else "")
            + " (set requires_grad=False if they are meant to be frozen)"
        )
    if setup.zero_lr:
        evidence.append("a zero learning rate in at least one parameter group")
    if run.accumulate:
        evidence.append(
            "gradients accumulate across steps: after the step each .grad equals the previous "
            "gradient plus the new one, so optimizer.zero_grad() is missing"
        )
    if without_grad and run.passed_at is None:
        evidence.append(
            f"disconnected graph: {len(without_grad)} parameter(s) got no gradient "
            f"({', '.join(without_grad[:6])})"
        )
    elif without_grad:
        warnings.append(f"parameters never used in the loss: {', '.join(without_grad[:6])}")
    return evidence


def training_evidence(setup: OverfitSetup, run: OverfitRun, targets: Any) -> list[str]:
    """What the losses and the model show: divergence, dead units, the output, the labels."""
    evidence: list[str] = []
    losses, opt, output = run.losses, setup.opt, run.output
    final_loss = losses[-1] if losses else float("nan")
    finite = [v for v in losses if math.isfinite(v)]
    if losses and not math.isfinite(final_loss):
        evidence.append(
            f"the loss became {final_loss} at step {len(losses) - 1}: the learning rate is too "
            f"high for {describe_optimizer(opt)}, or the numerics overflow"
        )
    elif finite and len(finite) > 5 and max(finite[5:]) > DIVERGENCE_FACTOR * finite[0]:
        evidence.append(
            f"the loss rose to {max(finite[5:]) / finite[0]:.0f}x its start: the learning rate "
            f"is too high for {describe_optimizer(opt)}"
        )
    for name, frac in run.dead.items():
        evidence.append(f"dead units: {100 * frac:.0f}% of the units after '{name}' never fire")
    if run.zero_grad_layers and run.passed_at is None:
        evidence.append(f"layers with an all-zero gradient: {', '.join(run.zero_grad_layers[:6])}")
    if run.ignores_input:
        evidence.append(
            "the output is the same for every sample: the input does not reach the output "
            "(dead units, a detached or overwritten activation)"
        )
    evidence += _output_evidence(run, output, targets)
    return evidence


def _output_evidence(run: OverfitRun, output: Tensor | None, targets: Any) -> list[str]:
    """The output against the labels: shapes that broadcast, softmax twice, conflicting labels."""
    evidence: list[str] = []
    if output is not None and targets is not None and run.classification is False:
        if isinstance(output, Tensor) and tuple(output.shape) != tuple(targets.shape):
            evidence.append(
                f"label mismatch: output shape {tuple(output.shape)} vs target shape "
                f"{tuple(targets.shape)}; the loss broadcasts them against each other"
            )
    if run.classification and output is not None and looks_like_probabilities(output):
        evidence.append(
            "the model's outputs sum to 1 over the classes: softmax is applied twice "
            "(CrossEntropyLoss expects raw logits; drop the final softmax)"
        )
    if run.conflicts:
        evidence.append(
            f"label mismatch: {run.conflicts} samples have identical inputs but different labels"
        )
    return evidence
