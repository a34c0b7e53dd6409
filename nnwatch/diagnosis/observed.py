"""Causes read off the records instead of guessed: what the run itself shows about its set-up.

A remedy is only as good as the cause behind it. "Lower the LR" is wrong advice for a loop that
never clears its gradients, for an LR that is already negative, or for one a scheduler has taken
down a million-fold; "fix the init" is wrong for a loss that does not depend on the weights at
all. Each of these leaves a trace in the step records (the LR of every group, whether the last
update's gradients were still there when the next backward began, an exactly-zero norm, a loss
that never changes by a single bit, whether the clip fired), so it is observed here, once per row,
and every detector words its finding from the same facts. :mod:`nnwatch.diagnosis.differential`
turns them into the ordered list of causes a finding cites.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Callable

from nnwatch.diagnosis.row import Row
from nnwatch.diagnosis.update_evidence import UpdateEvidence

KEPT_STEPS = 3  # updates in a row whose gradients were not cleared before the next backward
ZERO_STEPS = 5  # steps in a row with an exactly-zero gradient norm, or a bit-identical loss
LR_COLLAPSE = 1e-3  # an LR this far below the run's own peak has been scheduled away
CLIP_WINDOW = 64  # steps over which the clip's firing rate is counted


class Observations:
    """Facts about the run's set-up, updated from every row (bounded memory)."""

    def __init__(self) -> None:
        self.lr = math.nan
        """The first group's LR on the latest row."""
        self.lr_peak = math.nan
        """The highest LR the run has had (first group)."""
        self.lr_peak_step = -1
        self.nonpositive_lr = 0
        """Steps in a row with every group's LR at or below 0."""
        self.negative_lr = 0
        """Steps in a row with some group's LR below 0 (the updates climb the gradient)."""
        self.kept = 0
        """Updates in a row whose gradients were still there, untouched, at the next backward."""
        self.kept_total = 0
        self.zero_grad = 0
        """Steps in a row whose global gradient norm was exactly 0."""
        self.constant_loss = 0
        """Steps in a row whose loss was bit-identical to the previous one."""
        self._last_loss = math.nan
        self.clip_steps: deque[int] = deque(maxlen=CLIP_WINDOW)
        """1/0 per recent step clipped by norm: whether the clip scaled the gradients down."""
        self.clip_threshold = math.nan
        self.adversarial = False
        """This run is one side of a game (two watched nets stepping in turn: a GAN)."""
        self.update = UpdateEvidence()
        """What the measured updates did to the weights (the mechanisms)."""
        self._active: set[str] = set()
        #: where the open kinds come from (the pipeline's detectors), asked only when a finding
        #: is worded: scanning every detector on every row would cost more than the detectors
        self.active_source: Callable[[], set[str]] | None = None

    @property
    def active(self) -> set[str]:
        """Kinds whose episode is open now: causes for other findings."""
        return self.active_source() if self.active_source is not None else self._active

    def push(self, row: Row) -> None:
        self.update.push(row)
        lr = row.lr
        if lr.size:
            lr0 = float(lr[0])
            self.lr = lr0
            if math.isfinite(lr0) and (not math.isfinite(self.lr_peak) or lr0 > self.lr_peak):
                self.lr_peak, self.lr_peak_step = lr0, row.step
            finite = lr[~(lr != lr)]  # NaN compares unequal to itself
            self.nonpositive_lr = self.nonpositive_lr + 1 if finite.size and (finite <= 0).all() else 0
            self.negative_lr = self.negative_lr + 1 if finite.size and (finite < 0).any() else 0
        k = row.grads_kept
        if k == 1.0:
            self.kept += 1
            self.kept_total += 1
        elif k == 0.0:
            self.kept = 0
        g = row.grad_norm
        if g == 0.0:
            self.zero_grad += 1
        elif math.isfinite(g):
            self.zero_grad = 0
        loss = row.loss
        if math.isfinite(loss):
            self.constant_loss = self.constant_loss + 1 if loss == self._last_loss else 0
            self._last_loss = loss
        if math.isfinite(row.clip_threshold) and not math.isnan(row.grad_norm):
            self.clip_threshold = row.clip_threshold
            self.clip_steps.append(1 if row.grad_norm > row.clip_threshold else 0)

    # -- the facts, as the causes name them ---------------------------------------------------
    @property
    def grads_not_cleared(self) -> bool:
        return self.kept >= KEPT_STEPS

    @property
    def lr_negative(self) -> bool:
        return self.negative_lr >= 1

    @property
    def lr_zero(self) -> bool:
        return self.nonpositive_lr >= ZERO_STEPS and not self.lr_negative

    @property
    def lr_collapse(self) -> float:
        """The latest LR over the run's peak, when a scheduler took it down 1000x or more."""
        peak, now = self.lr_peak, self.lr
        if not (math.isfinite(peak) and math.isfinite(now)) or peak <= 0 or now < 0:
            return math.nan
        ratio = now / peak
        return ratio if ratio <= LR_COLLAPSE else math.nan

    @property
    def loss_independent(self) -> bool:
        """The loss does not depend on the parameters: every gradient exactly zero, or a loss of
        exactly 0.0, step after step (a flat loss with real gradients is another matter)."""
        return self.zero_grad >= ZERO_STEPS or (
            self.constant_loss >= ZERO_STEPS and self._last_loss == 0.0
        )

    @property
    def clips(self) -> bool:
        return math.isfinite(self.clip_threshold) and bool(self.clip_steps)

    @property
    def clip_rate(self) -> float:
        """Share of recent clipped steps on which the clip scaled the gradients down."""
        return sum(self.clip_steps) / len(self.clip_steps) if self.clip_steps else math.nan
