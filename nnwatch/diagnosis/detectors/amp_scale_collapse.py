"""AMP scale collapse: the GradScaler keeps halving its scale because gradients keep overflowing.

A GradScaler starts high (2^16), skips the first steps whose scaled gradients overflow fp16 and
halves its scale each time: a few skips at the start are calibration, not a problem. After the
first successful step, a healthy run skips rarely and alone (each time the scale has just grown).
Collapse means persistent Inf/NaN in the fp16 graph: the scale falls below 1 (textbook: "down to
1.0 or 1e-4"), or after calibration 4 skips in a row or 8 of the last 16 steps skipped, or 12 skips
in a row from the start.
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
CONSECUTIVE_AT_START = 12
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
                self.recent.clear()  # calibration skips are not held against the run
        self.peak = max(self.peak, s)
        window_skips = int(sum(self.recent))
        hit = (
            s < MIN_SCALE
            or (self.calibrated and (self.run >= CONSECUTIVE or window_skips >= WINDOW_SKIPS))
            or (not self.calibrated and self.run >= CONSECUTIVE_AT_START)
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
        return Finding(
            kind=self.kind,
            severity="error",
            step=row.step,
            summary=summary,
            remedy=remedy,
            evidence=evidence,
            onset_step=self.first_skip_step if self.first_skip_step >= 0 else row.step,
        )
