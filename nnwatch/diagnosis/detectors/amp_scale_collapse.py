"""AMP scale collapse: the GradScaler's scale keeps falling because gradients keep overflowing.

A GradScaler starts high (2^16 by default, 2^24 or 2^32 in some trainers) and halves its scale on
every step whose scaled gradients overflow fp16, skipping that step: a run of halvings at the
start is calibration, however long, and says nothing while the scale is still large. After the
first successful step, a healthy run skips rarely and alone (each time the scale has just grown).
Collapse is a scale that keeps falling once calibration is over, or that falls below a floor:

* the scale below 1 at any time (the loss is then scaled *down*: the seed's "down to 1.0 or
  1e-4" rule);
* after calibration, 4 skips in a row that take the scale more than 16x below where calibration
  left it, or 8 of the last 16 steps skipped.
"""

from __future__ import annotations

import math
from collections import deque

from nnwatch.diagnosis.context import RunContext
from nnwatch.diagnosis.detectors.base import Detector, lr_now
from nnwatch.diagnosis.episode import Episode
from nnwatch.diagnosis.history import RunHistory
from nnwatch.diagnosis.row import Row
from nnwatch.store.finding import Finding, fmt

MIN_SCALE = 1.0
CONSECUTIVE = 4
BELOW_SETTLED = 16.0  # after calibration, a fall this far below the settled scale
WINDOW, WINDOW_SKIPS = 16, 8
RELEASE = 50


class AmpScaleCollapseDetector(Detector):
    kind = "amp_scale_collapse"

    def __init__(self, ctx: RunContext) -> None:
        super().__init__(ctx)
        self.episode = Episode(confirm=1, release=RELEASE)
        self.calibrated = False
        self.run = 0
        self.recent: deque[int] = deque(maxlen=WINDOW)
        self.peak = 0.0
        self.first_skip_step = -1
        self.settled = math.nan  # the scale at the first successful step

    def update(self, row: Row, hist: RunHistory) -> Finding | None:
        s = row.amp_scale
        if not math.isfinite(s):
            return None
        skipped = row.amp_skipped == 1.0
        self.recent.append(1 if skipped else 0)
        if skipped:
            if self.run == 0:
                self.first_skip_step = row.step
            self.run += 1
        else:
            self.run = 0
            if not self.calibrated:
                self.calibrated = True
                self.settled = s
                self.recent.clear()  # calibration skips are not held against the run
        self.peak = max(self.peak, s)
        window_skips = int(sum(self.recent))
        hit = s < MIN_SCALE or (
            self.calibrated
            and (
                (self.run >= CONSECUTIVE and s * BELOW_SETTLED <= self.settled)
                or window_skips >= WINDOW_SKIPS
            )
        )
        if not self.episode.update(hit, row.step):
            return None
        evidence = {
            "scale": s,
            "peak_scale": self.peak,
            "skipped_in_a_row": self.run,
            "skipped_of_last_16": window_skips,
            "min_scale": MIN_SCALE,
            "loss": row.loss,
        }
        forward = (
            ""
            if math.isfinite(row.loss)
            else " The loss itself is non-finite: the overflow happens in the forward pass."
        )
        summary = (
            f"the GradScaler has skipped {self.run} steps in a row ({window_skips} of the last "
            f"{len(self.recent)}) and its scale fell to {fmt(s)} (peak {fmt(self.peak)}): gradients "
            f"overflow fp16 on almost every step.{forward}"
        )
        remedy = (
            "find the op that overflows (`nnwatch replay SNAPSHOT --anomaly`) and run it in float32 "
            "(torch.autocast(..., enabled=False) around softmax/exp/norms/the loss), lower the LR"
            f"{lr_now(row)}, clip gradients after scaler.unscale_(optimizer), or train in bf16"
        )
        return self.report(
            row,
            "error",
            summary,
            remedy,
            evidence,
            onset_step=self.first_skip_step if self.first_skip_step >= 0 else row.step,
        )
