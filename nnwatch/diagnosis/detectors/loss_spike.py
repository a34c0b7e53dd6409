"""Loss spike: one loss far above the run's level that the run recovers from (unlike divergence).

A single bad batch (a corrupt sample, labels off by a unit) or one step the LR made too large
shows as one isolated jump. The run usually recovers, but the user wants to know which batch it
was, and a spike that keeps recurring is the start of worse. A loss counts as a spike when it is
at least two units above the median of the 32 losses before it, a unit being the larger of the
level itself, 8x the stretch's own step-to-step noise, and a quarter of what the run has learned
(``loss_diverging.rise_unit``); it is reported once the median of the next 3 losses is back
within half a unit of the level, so a jump that stays up is left to ``loss_diverging``. Spikes
closer than 50 steps to the last one reported are counted, not reported again.

A run can have a heavy tail of its own: with batches of two samples a converged loss of 0.01
jumps to 0.5-1 whenever a hard pair is drawn. Every loss's excess over the level of the stretch
before it is remembered for 200 steps; a jump whose excess the run has already reached half of
twice or more in that time is its tail, not an anomaly, and is counted without a report.

Jumps that recur at a fixed period, whether they recover within 3 steps or take longer, are data
read in blocks in the same order (``jump_lattice``): reported once, as soon as three show.
"""

from __future__ import annotations

import math

from nnwatch.diagnosis.context import RunContext
from nnwatch.diagnosis.detectors.base import Detector, lr_now
from nnwatch.diagnosis.detectors.jump_lattice import JumpLattice
from nnwatch.diagnosis.detectors.loss_diverging import noise_sigma, rise_unit
from nnwatch.diagnosis.history import Ring, RunHistory, SortedWindow, median
from nnwatch.diagnosis.row import Row
from nnwatch.store.finding import Finding, fmt
from nnwatch.store.schema import FieldName

REF = 32
MIN_REF = 16
NOISE_UNITS = 8.0
SPIKE_UNITS = 2.0
RECOVER = 3  # losses after the spike whose median must be back near the level
MIN_GAP = 50
TAIL_WINDOW = 200  # excesses over the level this recent are the run's own tail
TAIL_JUMPS = 2  # this many earlier excesses of half the jump's size: the jump is ordinary


class LossSpikeDetector(Detector):
    kind = "loss_spike"

    def __init__(self, ctx: RunContext) -> None:
        super().__init__(ctx)
        self.ref = SortedWindow(REF)
        self.first: list[float] = []
        self.start = math.nan
        self.pending: tuple[int, float, float, float] | None = None  # step, loss, base, unit
        self.after: list[float] = []
        self.last_report = -(10**9)
        self.count = 0
        self.excess = Ring(TAIL_WINDOW)  # each loss minus the level before it (the run's tail)
        self.lattice = JumpLattice()  # jumps at a fixed period: data in blocks

    def update(self, row: Row, hist: RunHistory) -> Finding | None:
        loss = row.loss
        if not math.isfinite(loss):
            self.pending = None
            return None
        if len(self.first) < 5:
            self.first.append(loss)
            self.start = median(self.first)
        periodic = self.lattice.push(row)
        if periodic is not None:
            return self._periodic(row, *periodic)
        out = None
        if self.pending is not None:
            self.after.append(loss)
            if len(self.after) >= RECOVER:
                step, peak, base, unit = self.pending
                self.pending = None
                if median(self.after) - base <= 0.5 * unit:
                    out = self._report(row, step, peak, base, unit)
            return out  # the spike and the steps after it stay out of the reference stretch
        if len(self.ref) >= MIN_REF:
            base = self.ref.median()
            start = self.start
            self.excess.push(loss - base)
            # the unit without the noise is a lower bound: most steps end here, with no sort
            if loss - base < SPIKE_UNITS * rise_unit(base, 0.0, start, NOISE_UNITS):
                self.ref.push(loss)
                return None
            unit = rise_unit(base, noise_sigma(self.ref.values()), start, NOISE_UNITS)
            if loss - base >= SPIKE_UNITS * unit:
                self.pending = (row.step, loss, base, unit)
                self.after = []
                return None
        self.ref.push(loss)
        return None

    def _report(self, row: Row, step: int, peak: float, base: float, unit: float) -> Finding | None:
        self.count += 1
        earlier = self.excess.values()[:-1]  # without the jump itself
        ordinary = int((earlier >= 0.5 * (peak - base)).sum()) >= TAIL_JUMPS
        if ordinary or step - self.last_report < MIN_GAP:
            return None
        self.last_report = step
        times = peak / base if base > 0 else math.nan
        how = f" ({fmt(times)}x)" if math.isfinite(times) else ""
        evidence = {
            "spike_loss": peak,
            "loss_before": base,
            "times_before": times,
            "rise_in_units": (peak - base) / unit,
            "recovered_after_steps": RECOVER,
            "spikes_so_far": self.count,
            "lr": row.lr0,
            FieldName.CLIP_THRESHOLD: row.clip_threshold,
        }
        summary = (
            f"the loss jumped from {fmt(base)} to {fmt(peak)}{how} at step {step} and came back "
            f"within {RECOVER} steps"
            + (f" (spike {self.count} in this run)" if self.count > 1 else "")
            + "."
        )
        remedy = (
            f"check first the batch of step {step} (an outlier, a corrupt sample, wrong labels); "
            f"if spikes recur, lower the LR{lr_now(row)} or clip gradients"
            + (
                f" (your clip is at max_norm={fmt(row.clip_threshold)})"
                if math.isfinite(row.clip_threshold)
                else ""
            )
        )
        return Finding(
            kind=self.kind,
            severity="warning",
            step=row.step,
            summary=summary,
            remedy=remedy,
            evidence=evidence,
            onset_step=step,
        )

    def _periodic(self, row: Row, period: int, jumps: list[tuple[int, float]]) -> Finding:
        at = ", ".join(str(s) for s, _ in jumps)
        least = min(r for _, r in jumps)
        summary = (
            f"the loss jumps at a fixed period: at steps {at} (a period of {period} steps), each time "
            f"to {fmt(least)}x or more its level, falling back in between. Data read in blocks "
            "in the same order does this (files, shards or domains concatenated and never "
            "shuffled): the model drifts toward each block and is thrown off at the next one."
        )
        remedy = (
            "shuffle across the blocks: DataLoader(..., shuffle=True) over the concatenated data, "
            "or interleave the shards (a shuffle buffer larger than one shard); if the period is "
            f"an epoch, look at the batch at that position (step {jumps[0][0]})"
        )
        evidence = {"period_steps": float(period), "jumps": float(len(jumps)), "least_jump": least}
        return Finding(
            kind=self.kind, severity="warning", step=row.step, summary=summary, remedy=remedy,
            evidence=evidence, onset_step=jumps[-1][0],
        )  # fmt: skip
