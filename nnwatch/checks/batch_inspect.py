"""Check E: do the inputs look normalized, and do the labels line up with them?

Data bugs are the quietest: raw 0..255 pixels, one feature in dollars next to one in metres, a
dataset sorted by class and never shuffled, labels shifted by one. None of these raise an error.
This check reads one batch (no model involved) and reports per-channel statistics, a label
histogram and, with a ``decode`` function, a few samples next to their labels for a human to eyeball.

Normalization rule (documented contract): the batch passes when the overall mean is within
``[-1, 1]`` and the overall std is at most 5, every channel's mean is within ``[-5, 5]`` and its
std at most 10, the spread of non-constant channel stds is under 1000x, and nothing is NaN/Inf.
Inputs scaled to ``[0, 1]`` therefore pass; raw pixel values and unscaled features fail.
Channels are dim 1 for inputs with 3 or more dims (N, C, ...), the features for (N, F).

Labels fail when they are out of range, when their count differs from the inputs', when a batch of
more than one sample has a single label, or when identical inputs carry different labels.
Class imbalance is reported, not failed: it is a property of the data, not a bug.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, ClassVar

import torch
from torch import Tensor

from nnwatch.checks.common import CheckError, CheckResult, conflicting_labels, split_batch

MAX_ABS_MEAN = 1.0
MAX_STD = 5.0
MAX_CHANNEL_ABS_MEAN = 5.0
MAX_CHANNEL_STD = 10.0
MAX_SCALE_SPREAD = 1000.0
IMBALANCE_FACTOR = 3.0  # a class with over 3x its fair share of a large batch is "imbalanced"

Decoder = Callable[[Any], Any]


@dataclass(frozen=True)
class BatchResult(CheckResult):
    """Outcome of :func:`inspect_batch`."""

    check_name: ClassVar[str] = "Batch"
    passed: bool
    verdict: str
    batch_size: int
    input_shape: list[int]
    input_dtype: str
    mean: float | None = None
    std: float | None = None
    min: float | None = None
    max: float | None = None
    channel_mean: list[float] = field(default_factory=list)
    channel_std: list[float] = field(default_factory=list)
    channel_min: list[float] = field(default_factory=list)
    channel_max: list[float] = field(default_factory=list)
    normalized: bool | None = None
    task: str = "none"
    num_classes: int | None = None
    label_counts: dict[int, int] = field(default_factory=dict)
    balanced: bool | None = None
    target_mean: float | None = None
    target_std: float | None = None
    samples: list[dict[str, Any]] = field(default_factory=list)
    causes: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    skipped: bool = False

    def summary(self) -> str:
        parts = []
        if self.mean is not None and self.std is not None:
            parts.append(f"inputs mean {self.mean:.2f} std {self.std:.2f}")
        else:
            parts.append(f"inputs {self.input_dtype} {tuple(self.input_shape)}")
        if self.task == "classification":
            present = sum(1 for c in self.label_counts.values() if c > 0)
            k = self.num_classes or present
            if present < k:
                parts.append(f"{present} of {k} classes present")
            else:
                parts.append(f"{k} classes " + ("balanced" if self.balanced else "imbalanced"))
        elif self.task == "regression" and self.target_mean is not None:
            parts.append(f"targets mean {self.target_mean:.2f} std {self.target_std:.2f}")
        return "; ".join(parts)

    def samples_text(self) -> str:
        """The decoded samples, each block headed by its label."""
        blocks = []
        for s in self.samples:
            body = str(s["text"]).splitlines() or [""]
            blocks.append("\n".join([f"label {s['label']}:"] + [f"    {line}" for line in body]))
        return "\n".join(blocks)


def _channel_view(x: Tensor) -> Tensor:
    """(channels, values) for per-channel statistics."""
    if x.dim() == 1:
        return x.reshape(1, -1)
    if x.dim() == 2:
        return x.t()
    return x.transpose(0, 1).reshape(x.shape[1], -1)


def _fmt_label(v: Any) -> str:
    if isinstance(v, Tensor):
        v = v.tolist()
    return str(v)


def inspect_batch(
    batch: Any,
    decode: Decoder | None = None,
    *,
    num_classes: int | None = None,
    max_samples: int = 4,
) -> BatchResult:
    """Statistics of one batch's inputs and labels, with a verdict on each (see module docs).

    ``decode(sample)`` turns one input sample into something printable (text, ASCII art, tokens);
    the first ``max_samples`` are shown beside their labels.
    """
    inputs, targets = split_batch(batch)
    if not isinstance(inputs, Tensor):
        raise CheckError(f"inspect_batch needs a tensor of inputs, got {type(inputs).__name__}")
    x = inputs.detach()
    n = int(x.shape[0]) if x.dim() else 1
    causes: list[str] = []
    warnings: list[str] = []
    stats: dict[str, Any] = {}
    normalized: bool | None = None
    if x.is_floating_point() and x.numel():
        stats, normalized = _input_stats(x, causes, warnings)
    elif not x.is_floating_point():
        warnings.append(f"integer inputs ({x.dtype}): treated as ids, normalization not checked")
    labels = _Labels(k=num_classes)
    if targets is not None and isinstance(targets, Tensor):
        _judge_labels(x, targets.detach(), n, labels, causes, warnings)
    samples = _decoded_samples(inputs, targets, decode, min(max_samples, n), warnings)
    passed = not causes
    if passed:
        verdict = "OK"
    elif normalized is False:
        verdict = "NOT NORMALIZED"
    else:
        verdict = "LABELS" if any("label" in c for c in causes) else "FAILED"
    return BatchResult(
        passed=passed,
        verdict=verdict,
        batch_size=n,
        input_shape=list(x.shape),
        input_dtype=str(x.dtype).replace("torch.", ""),
        normalized=normalized,
        task=labels.task,
        num_classes=labels.k if labels.task == "classification" else None,
        label_counts=labels.counts,
        balanced=labels.balanced,
        target_mean=labels.t_mean,
        target_std=labels.t_std,
        samples=samples,
        causes=causes,
        warnings=warnings,
        **stats,
    )


def _input_stats(x: Tensor, causes: list[str], warnings: list[str]) -> tuple[dict[str, Any], bool]:
    """The float inputs' statistics, overall and per channel, and whether they look normalized."""
    xf = x.double()
    if not bool(torch.isfinite(xf).all()):
        causes.append(f"the inputs contain {int((~torch.isfinite(xf)).sum())} NaN/Inf values")
        xf = torch.nan_to_num(xf, nan=0.0, posinf=0.0, neginf=0.0)
    ch = _channel_view(xf)
    c_mean, c_std = ch.mean(dim=1), ch.std(dim=1, correction=0)
    mean, std = float(xf.mean()), float(xf.std(correction=0))
    stats = {
        "mean": mean,
        "std": std,
        "min": float(xf.min()),
        "max": float(xf.max()),
        "channel_mean": c_mean.tolist(),
        "channel_std": c_std.tolist(),
        "channel_min": ch.min(dim=1).values.tolist(),
        "channel_max": ch.max(dim=1).values.tolist(),
    }
    problems = _normalization_problems(ch, c_mean, c_std, mean, std)
    if problems:
        causes.append(
            "inputs are not normalized: "
            + "; ".join(problems)
            + " (standardize each channel to mean 0, std 1 with training-set statistics)"
        )
    constant = int((c_std == 0).sum())
    if constant:
        warnings.append(f"{constant} of {ch.shape[0]} channels are constant in this batch")
    if 0 < std < 0.05:
        warnings.append(f"the inputs barely vary (std {std:.3g})")
    return stats, not problems


def _normalization_problems(
    ch: Tensor, c_mean: Tensor, c_std: Tensor, mean: float, std: float
) -> list[str]:
    """What says the inputs are not standardized: the whole, channels, or their spread of scales."""
    problems = []
    if abs(mean) > MAX_ABS_MEAN or std > MAX_STD:
        problems.append(f"overall mean {mean:.3g}, std {std:.3g}")
    bad_mean = (c_mean.abs() > MAX_CHANNEL_ABS_MEAN).nonzero().flatten().tolist()
    bad_std = (c_std > MAX_CHANNEL_STD).nonzero().flatten().tolist()
    if bad_mean or bad_std:
        worst = sorted(set(bad_mean) | set(bad_std))
        problems.append(
            f"{len(worst)} of {ch.shape[0]} channels out of range (e.g. channel {worst[0]}: "
            f"mean {float(c_mean[worst[0]]):.3g}, std {float(c_std[worst[0]]):.3g})"
        )
    live = c_std[c_std > 0]
    if live.numel() > 1 and float(live.max() / live.min()) > MAX_SCALE_SPREAD:
        problems.append(
            f"channels on very different scales (std from {float(live.min()):.3g} to "
            f"{float(live.max()):.3g})"
        )
    return problems


@dataclass
class _Labels:
    """What the labels tell: the task, and its classes or its targets' spread."""

    k: int | None
    task: str = "none"
    counts: dict[int, int] = field(default_factory=dict)
    balanced: bool | None = None
    t_mean: float | None = None
    t_std: float | None = None


def _judge_labels(
    x: Tensor, y: Tensor, n: int, labels: _Labels, causes: list[str], warnings: list[str]
) -> None:
    if y.dim() and int(y.shape[0]) != n:
        causes.append(
            f"label mismatch: {int(y.shape[0])} labels for {n} inputs (the batch is misaligned)"
        )
    if not y.is_floating_point() and y.dtype != torch.bool:
        _judge_classes(x, y, n, labels, causes, warnings)
        return
    labels.task = "regression"
    yf = y.double()
    labels.t_mean, labels.t_std = float(yf.mean()), float(yf.std(correction=0))
    if not bool(torch.isfinite(yf).all()):
        causes.append("the targets contain NaN/Inf values")


def _judge_classes(
    x: Tensor, y: Tensor, n: int, labels: _Labels, causes: list[str], warnings: list[str]
) -> None:
    """Class indices: in range, not all one class, balanced, all present, consistent."""
    labels.task = "classification"
    flat = y.reshape(-1).long()
    lo, hi = int(flat.min()), int(flat.max())
    if labels.k is None:
        labels.k = hi + 1
    k = labels.k
    if lo < 0 or hi >= k:
        causes.append(
            f"labels out of range: min {lo}, max {hi} for {k} classes (class indices "
            "must be 0..K-1; an off-by-one from 1-based labels?)"
        )
    hist = torch.bincount(flat.clamp(min=0), minlength=k)
    counts = labels.counts = {i: int(c) for i, c in enumerate(hist.tolist())}
    if n > 1 and lo == hi:
        causes.append(
            f"every label in the batch is {lo}: the data looks sorted by class and not "
            "shuffled (or the labels are constant)"
        )
    fair = flat.numel() / max(k, 1)
    top_class, top = max(counts.items(), key=lambda kv: kv[1])
    labels.balanced = top <= IMBALANCE_FACTOR * max(fair, 1.0)
    if not labels.balanced and lo != hi:
        warnings.append(
            f"imbalanced labels: class {top_class} is {100 * top / flat.numel():.0f}% of "
            "the batch"
        )
    present = sum(1 for c in counts.values() if c > 0)
    if present < k and flat.numel() >= 5 * k:
        warnings.append(f"only {present} of {k} classes appear in {flat.numel()} labels")
    dup = conflicting_labels(x, y) if x.dim() and y.dim() == 1 else 0
    if dup:
        causes.append(
            f"label mismatch: {dup} samples have identical inputs but different labels"
        )


def _decoded_samples(
    inputs: Tensor, targets: Any, decode: Decoder | None, count: int, warnings: list[str]
) -> list[dict[str, Any]]:
    """The first samples as ``decode`` shows them, beside their labels."""
    samples: list[dict[str, Any]] = []
    if decode is None:
        return samples
    for i in range(count):
        label = _fmt_label(targets[i]) if isinstance(targets, Tensor) else "-"
        try:
            text = decode(inputs[i])
        except Exception as exc:  # the decoder is user code: report, do not crash
            warnings.append(f"decode() raised {type(exc).__name__}: {exc}")
            break
        samples.append({"index": i, "label": label, "text": str(text)})
    return samples
