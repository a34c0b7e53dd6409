"""When to snapshot on a gradient-norm spike: 10x the run's recent median, at most once per 200 steps.

A spike is the moment a user wants to look at later (which batch did that?), but spikes come in
bursts during an unstable phase and every snapshot copies the whole model, so requests are spaced
and capped. The probe snapshots the step after the request (it must capture the RNG state before
that step's forward), which still holds the batch stream and the weights as they were then.
"""

from __future__ import annotations

import math

from nnwatch.diagnosis.history import RunHistory, finite_median
from nnwatch.diagnosis.row import Row

SPIKE_DECADES = 1.0  # 10x
MIN_HISTORY = 20
MIN_GAP = 200
MAX_PER_RUN = 5


class SpikeTrigger:
    def __init__(self) -> None:
        self.last = -(10**9)
        self.count = 0
        self._med = math.nan
        self._med_at = -(10**9)

    def check(self, row: Row, hist: RunHistory) -> bool:
        """True when this row's gradient norm is a spike worth a (rate-limited) snapshot."""
        g = row.grad_norm
        if not (math.isfinite(g) and g > 0) or len(hist.log_grad) < MIN_HISTORY:
            return False
        if self.count >= MAX_PER_RUN or row.step - self.last < MIN_GAP:
            return False
        if hist.log_grad.total - self._med_at >= 10:
            self._med = finite_median(hist.log_grad.values(100))
            self._med_at = hist.log_grad.total
        med = self._med
        if not math.isfinite(med) or math.log10(g) - med < SPIKE_DECADES:
            return False
        self.last = row.step
        self.count += 1
        return True
