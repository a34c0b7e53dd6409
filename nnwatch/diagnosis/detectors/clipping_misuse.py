"""Clipping misuse: a clip threshold that stops learning instead of guarding it.

With torch's ``clip_grad_norm_`` nnwatch records the true (pre-clip) norm on every step and the
user's ``max_norm``, so two mistakes are plain to see:

* ``max_norm=0``: every gradient is scaled to zero and no weight ever moves (3 steps suffice);
* a threshold orders of magnitude below the run's norm: the clip fires on at least 95% of the last
  50 clipped steps and divides the gradient by 100x or more (median). Every update then has the
  length LR x max_norm whatever the gradient says; the LR the user set is not the LR they get.
  The same is plain after 5 steps when the clip divided *every* one of them by 100x or more and
  the loss has not moved (2%) meanwhile: the clip is what stops learning. A run whose gradients
  are large for a few steps at its start but that learns through the clip (Adam barely notices
  a clip) is left to the 50-step rule.

The run's usual norm is what the remedy suggests as a threshold (about 2x its median). A clip
taken before ``scaler.unscale_()`` looks like a threshold 65536x too small; the probe sees that
one as it happens (torch's clip read gradients still scaled) and reports it with
:func:`clip_before_unscale`, and this rule stays quiet.
"""

from __future__ import annotations

import math

from nnwatch.diagnosis.context import RunContext
from nnwatch.diagnosis.detectors.base import Detector, lr_now
from nnwatch.diagnosis.differential import ruled_out
from nnwatch.diagnosis.episode import Episode
from nnwatch.diagnosis.history import RunHistory, SortedWindow, median
from nnwatch.diagnosis.row import Row
from nnwatch.store.finding import Finding, fmt
from nnwatch.store.schema import FieldName

ZERO_STEPS = 3
EARLY_STEPS = 5
EARLY_PROGRESS = 0.02
WINDOW = 50
FIRES = 0.95
FACTOR = 100.0


def clip_before_unscale(step: int, scale: float) -> Finding:
    """torch's clip (or norm) ran on gradients still multiplied by the AMP loss scale ``scale``
    (NaN when it cannot be read without a sync)."""
    return Finding(
        kind="clipping_misuse",
        severity="warning",
        step=step,
        summary=(
            "torch's clip_grad_norm_ ran before scaler.unscale_(optimizer): it measured and "
            "clipped gradients still multiplied by the AMP loss scale"
            + (f" ({scale:g})" if math.isfinite(scale) else "")
            + ", so the threshold applies to the scaled norm and the real gradient is cut "
            "down by about the scale on every step."
        ),
        remedy=(
            "call scaler.unscale_(optimizer) right before clipping (then scaler.step and "
            "scaler.update as before); the grad norms nnwatch shows are torch's, scaled, until then"
        ),
        evidence={"loss_scale": scale},
        onset_step=step,
    )


class ClippingMisuseDetector(Detector):
    kind = "clipping_misuse"

    def __init__(self, ctx: RunContext) -> None:
        super().__init__(ctx)
        self.zero = Episode(confirm=ZERO_STEPS, release=20)
        self.over = Episode(confirm=1, release=WINDOW)
        self.ratio = SortedWindow(WINDOW)
        self.streak: list[tuple[float, float]] = []  # (ratio, loss) of the last steps clipped 100x

    def update(self, row: Row, hist: RunHistory) -> Finding | None:
        t, g = row.clip_threshold, row.grad_norm
        if not math.isfinite(t) or self.ctx.clip_before_unscale:
            return None  # no clip seen this step, or one on AMP-scaled gradients (the probe's)
        if self.zero.update(t == 0.0, row.step):
            return self._zero(row)
        if t <= 0.0 or not (math.isfinite(g) and g > 0):
            return None
        ratio = g / t
        self.ratio.push(ratio)
        if ratio >= FACTOR:
            self.streak = (self.streak + [(ratio, row.loss)])[-EARLY_STEPS:]
        else:
            self.streak = []
        r: list[float] | None
        if len(self.streak) >= EARLY_STEPS and self._unmoved():
            r = [x for x, _ in self.streak]
            window = len(r)
        elif len(self.ratio) >= WINDOW:  # sorted as it slides: O(log n) per step
            r = None
            window = WINDOW
        else:
            return None
        if r is None:
            fired, factor = self.ratio.count_above(1.0) / WINDOW, self.ratio.median()
        else:
            fired, factor = sum(1 for x in r if x > 1.0) / len(r), median(r)
        if not self.over.update(fired >= FIRES and factor >= FACTOR, row.step):
            return None
        why = ruled_out("raise_max_norm", hist.obs)
        if why is not None:
            return None  # the clip is what holds a diverging run together: not the fault
        usual = factor * t
        return self.report(
            row,
            "warning",
            (
                f"your clip at max_norm={fmt(t)} fired on {fmt(100 * fired)}% of the last {window} "
                f"steps and divided the gradient by {fmt(factor)}x (median; the norm is usually "
                f"{fmt(usual)}): every update has the same length whatever the gradient says, so the "
                "LR you set is not the step you get."
            ),
            (
                f"raise max_norm to about {fmt(2 * usual)} (2x the usual norm) so that it only "
                f"catches spikes; if you wanted smaller steps, lower the LR{lr_now(row)} instead"
            ),
            {
                FieldName.CLIP_THRESHOLD: t,
                "fired_fraction": fired,
                "median_norm_over_threshold": factor,
                "usual_grad_norm": usual,
                "lr": row.lr0,
            },
            onset_step=self.over.first_hit,
        )

    def _unmoved(self) -> bool:
        """The loss over the streak has not dropped by 2%: the clipped updates change nothing."""
        losses = [x for _, x in self.streak if math.isfinite(x)]
        if len(losses) < EARLY_STEPS:
            return False
        before, now = median(losses[:3]), median(losses[-3:])
        return before - now < EARLY_PROGRESS * abs(before)

    def _zero(self, row: Row) -> Finding:
        g = row.grad_norm
        return self.report(
            row,
            "error",
            (
                f"you clip gradients at max_norm=0 for {ZERO_STEPS} steps: clip_grad_norm_ scales "
                f"every gradient to zero (the true norm is {fmt(g)}), so no weight moves."
            ),
            (
                "set max_norm to a positive value, about 1.0 or 2x the usual gradient norm"
                + (f" ({fmt(2 * g)})" if math.isfinite(g) and g > 0 else "")
                + "; check where the threshold comes from (a config value read as 0, an int "
                "division)"
            ),
            {FieldName.CLIP_THRESHOLD: 0.0, FieldName.GRAD_NORM: g, "lr": row.lr0},
            onset_step=self.zero.first_hit,
        )
