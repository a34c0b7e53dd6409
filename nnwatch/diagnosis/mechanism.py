"""The mechanisms the measured updates can show, each worded once: its code, the sentence that
says it with its number, and what to do. :mod:`~nnwatch.diagnosis.update_evidence` keeps the
memory of the updates and decides when a mechanism is shown; the words for the ones judged on
that memory alone (updates that round away, weights pinned by decay, batches in label order, a
loss graph that cannot learn) live here, beside the record they make.
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass, field

from nnwatch.diagnosis.context import RunContext
from nnwatch.store.finding import fmt

MIN_UPDATES = 3  # measured updates before any mechanism is named
FROZEN_SHARE = 0.25  # a quarter of the elements an update should move, left unchanged
PINNED = 0.5  # the weights' norm at half of where the run began
ORDERED_SHARE = 0.5  # half of the labels' variance between batches: the data comes in order
#: ... judged on batches of 8 samples or more: shuffled batches of B put about 1/B of the
#: variance between them, a half for batches of two
MIN_BATCH = 8


@dataclass(frozen=True)
class Mechanism:
    """A mechanism the records show: a code, the sentence that says it, what to do."""

    code: str
    text: str
    remedy: str
    evidence: dict[str, float] = field(default_factory=dict)


def labels_in_order(
    labels: deque[tuple[float, float, float]], batch: float, k: int | None
) -> Mechanism | None:
    """The labels' variance between batches against that within them (for
    ``UpdateEvidence.label_mix``)."""
    if not k or k < 2 or len(labels) < 8 or not batch >= MIN_BATCH:
        return None
    means = [m for _, m, _ in labels]
    mu = sum(means) / len(means)
    between = sum((m - mu) ** 2 for m in means) / (len(means) - 1)
    within = sum(v for _, _, v in labels) / len(labels)
    share = between / (between + within) if between + within > 0 else 0.0
    if share < ORDERED_SHARE:
        return None
    classes = math.exp(median([e for e, _, _ in labels]))
    return Mechanism(
        "batches_not_shuffled",
        f"the batches come in order of their labels: each holds about {fmt(classes)} of the "
        f"{k} classes, and {fmt(100 * share)}% of the labels' variance lies between batches "
        "(shuffled batches put all but about 1/batch-size of it within each one)",
        "shuffle the data (DataLoader(..., shuffle=True), or a new random permutation each "
        "epoch)",
        {"label_variance_between_batches": share, "classes_per_batch": classes},
    )


def updates_frozen(frozen: deque[float], ctx: RunContext) -> Mechanism | None:
    """Updates that leave a share of the weights they should move unchanged (``frozen``: that
    share per recent measured update)."""
    share = median(frozen)
    if not (len(frozen) >= MIN_UPDATES and share >= FROZEN_SHARE):
        return None
    ev = {"unchanged_share": share, "half_precision_share": ctx.half_precision_share}
    if ctx.half_precision_share > 0:
        return Mechanism(
            "updates_rounded_away",
            f"each update leaves {fmt(100 * share)}% of the weights it should move (those "
            "with a non-zero gradient) bit for bit unchanged: in half precision an update "
            "smaller than half the weight's last digit rounds away",
            "keep the weights in float32 and compute in low precision with torch.autocast (or "
            "keep float32 master weights); a larger LR only hides it",
            ev,
        )
    return Mechanism(
        "updates_rounded_away",
        f"each update leaves {fmt(100 * share)}% of the weights it should move (those with a "
        "non-zero gradient) bit for bit unchanged: their gradients are so small that LR x "
        "gradient is below the weights' float32 precision",
        "find why the gradient is so small (vanishing through saturated or deep layers, a "
        "loss scaled down) before raising the LR",
        ev,
    )


def weights_pinned(start: float, now: float, ctx: RunContext) -> Mechanism | None:
    """Weights whose norm fell from ``start`` to ``now`` (half or less) under a weight decay."""
    if not (ctx.weight_decay > 0 and start > 0 and now <= PINNED * start):
        return None
    return Mechanism(
        "weights_pinned_by_decay",
        f"the weights shrank from norm {fmt(start)} to {fmt(now)} ({fmt(now / start)}x) under "
        f"weight_decay={fmt(ctx.weight_decay)}: the decay outweighs what the gradient adds",
        f"lower weight_decay (={fmt(ctx.weight_decay)}; 1e-4 to 0.1 is usual, and far less "
        "for SGD's coupled L2 than for AdamW), or check that it was not meant as the LR",
        {"weight_norm_start": start, "weight_norm_now": now, "weight_decay": ctx.weight_decay},
    )


def loss_graph_faults(ctx: RunContext) -> list[Mechanism]:
    """What the first loss's graph shows about a loss that cannot fall."""
    out = []
    if ctx.loss_detached:
        out.append(Mechanism(
            "loss_detached",
            "the loss's graph never reaches the model's output: it was computed from a detached "
            "copy (.data, .detach(), .item(), numpy) or made to require a gradient by hand, so "
            "only its other terms (a weight penalty) reach the weights",
            "compute the loss from the model's output tensor itself; if backward() complained "
            "that the loss does not require grad, the detach is the bug (setting "
            "loss.requires_grad = True only hides it)",
        ))  # fmt: skip
    if ctx.loss_squashed:
        out.append(Mechanism(
            "loss_squashed_twice",
            f"{ctx.loss_squashed}: squashed twice, every prediction stays in a narrow band "
            "near chance and its gradient shrinks",
            "remove the model's last Sigmoid/Softmax (BCEWithLogitsLoss and CrossEntropyLoss "
            "apply it themselves), or keep it and use BCELoss / NLLLoss on its log",
        ))  # fmt: skip
    return out


def median(values: deque[float] | list[float]) -> float:
    v = sorted(x for x in values if math.isfinite(x))
    if not v:
        return math.nan
    h = len(v) // 2
    return v[h] if len(v) % 2 else 0.5 * (v[h - 1] + v[h])
