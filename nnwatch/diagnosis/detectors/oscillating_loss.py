"""Oscillating loss: the loss swings up and down with no net progress (usually: the LR is too high).

Minibatch losses are always noisy, so swings alone prove nothing. Over the last 24 steps this rule
needs all three of:

* no progress: the newer half of the window is not 5% below the older half;
* back and forth, and bounded: the net change over the window is under half of the total
  up-and-down movement, and the peak stays within 50x the window's median; a loss that climbs
  steadily or leaps by orders of magnitude is diverging (exploding gradients), not oscillating;
* worse than before: the newer half of the window sits at or above the level of the 96 steps before
  the window (an LR that bounces off the valley's walls loses ground; a model that grows confident
  on noisy labels swings more while still improving);
* swings large for *this* run: the median of the last 12 step-to-step changes is at least 3x what
  it was in the 96 steps before the window and at least 3% of the loss (or of 10% of the starting loss, if that is
  larger: a converged loss wobbling near zero is not oscillating), and 7 of those 12 changes exceed
  the 90th percentile of the run's earlier changes (a rank test, immune to heavy-tailed noise:
  stationary noise passes it about once in 10^4 windows). In the first steps of a run, before there is any
  history, the bar is a clear zig-zag instead: autocorrelation below -0.5 and swings of 15%.

The run's own "usual change" only means something once the run has learned: on a plateau at its
starting level (a saddle of small initial weights, a classifier at ln K with near-zero logits)
every batch gives almost the same loss, and the swings that grow as the model starts to
discriminate are the start of learning, not an oscillation. So this rule also needs the run to
have once been 10% below where it started; a run that swings from its first steps is judged by
the zig-zag rule instead.

A loss that swings while it climbs (Kendall's tau of its last 48 values at least 0.3) is not
oscillating but diverging, and is left to ``loss_diverging``.

Two windows in a row must agree (confirmation), and the episode ends after 24 calm steps.

The records can show the cause outright: a data set in label order hands the model one class at a
time, and the loss jumps at every class boundary (:meth:`UpdateEvidence.label_mix`); a schedule
that moves the LR by a quarter on most steps swings the loss with it (:meth:`UpdateEvidence.lr_swings`).
With either mechanism in the records, a loss that has not converged is reported with it.
"""

from __future__ import annotations

import math
from collections import deque

import numpy as np

from nnwatch.diagnosis.context import RunContext
from nnwatch.diagnosis.detectors.base import Detector, lr_now
from nnwatch.diagnosis.episode import Episode
from nnwatch.diagnosis.history import (
    RunHistory,
    SortedWindow,
    kendall_tau,
    lag1_autocorr,
    median,
)
from nnwatch.diagnosis.mechanism import Mechanism
from nnwatch.diagnosis.row import Row
from nnwatch.store.finding import Finding, fmt

WINDOW = 24
BASELINE = 96  # the changes just before the window: noise drifts as a model grows confident
MIN_BASELINE = 24  # step-to-step changes needed before "earlier in the run" means anything
SWING_FACTOR = 3.0
MIN_SWING = 0.03
NEW_RUN_SWING = 0.15
NEW_RUN_AUTOCORR = -0.5
PROGRESS = 0.05
CONFIRM = 2
BOUNDED = 50.0  # the window's peak may not exceed its median by more than this
BIG_CHANGES = 7  # of the last SWING_WINDOW changes, above the run's 90th percentile
LEVEL_FLOOR = 0.1  # the loss level counts as at least 10% of where the run started
LEARNED_SHARE = 0.25  # below this share of its start, a run's wobble is noise around a minimum
SWING_WINDOW = 12  # the swing is measured on the newest changes, to react within ~8 steps
MONOTONE = 0.5  # net change above this share of the total up-and-down movement is a trend
RISING_N = 48  # a loss whose last 48 values trend up (Kendall's tau) is diverging, not oscillating
RISING_TAU = 0.3
LEARNED = 0.10  # the baseline rule needs a run that was once 10% below its start


class OscillatingLossDetector(Detector):
    kind = "oscillating_loss"

    def __init__(self, ctx: RunContext) -> None:
        super().__init__(ctx)
        self.losses: deque[float] = deque(maxlen=RISING_N)
        self.seen = 0
        self.episode = Episode(confirm=CONFIRM, release=WINDOW)
        self.window: deque[float] = deque(maxlen=WINDOW)
        # the window kept sorted as it slides, so that its medians cost O(1) per row
        self.levels = SortedWindow(WINDOW)  # |loss|
        self.older = SortedWindow(WINDOW // 2)
        self.newer = SortedWindow(WINDOW // 2)
        self.changes = SortedWindow(SWING_WINDOW)  # the newest step-to-step |changes|
        # the stretch before the window (its first loss included) and its step-to-step changes
        self.before = SortedWindow(BASELINE + 1)
        self.before_changes = SortedWindow(BASELINE)
        self.frozen_base: tuple[float, float] | None = None
        self.level_before = math.nan

    def _baseline(self, n: int) -> tuple[float | None, float | None]:
        """Median and 90th percentile of the changes in the 96 steps before the window."""
        if n - WINDOW < MIN_BASELINE + 1:
            return None, None
        self.level_before = self.before.median()
        return self.before_changes.median(), self.before_changes.quantile(0.9)

    def _slide(self, loss: float) -> None:
        win = self.window
        if win:
            self.changes.push(abs(loss - win[-1]))
        if len(self.newer) == self.newer.size:
            self.older.push(win[-self.newer.size])
        win.append(loss)
        self.levels.push(abs(loss))
        self.newer.push(loss)
        if len(win) == WINDOW:  # the window's first loss joins the stretch before it
            if len(self.before):
                self.before_changes.push(abs(win[0] - self.before.last()))
            self.before.push(win[0])

    @staticmethod
    def _converged(level: float, hist: RunHistory) -> bool:
        """The run has learned most of what it will (its loss is below a quarter of where it
        began): a loss that wobbles down there is minibatch noise around a minimum, not an LR
        above the stability edge, which keeps the loss from ever getting that far."""
        start = hist.start_loss
        return math.isfinite(start) and start > 0 and 0 <= level < LEARNED_SHARE * start

    def update(self, row: Row, hist: RunHistory) -> Finding | None:
        if not math.isfinite(row.loss):
            return None
        self.losses.append(row.loss)
        self.seen += 1
        self._slide(row.loss)
        n = self.seen
        if n < WINDOW:
            return None
        level = self.levels.median()
        if level == 0:
            return None
        swing = self.changes.median()
        older, newer = self.older.median(), self.newer.median()
        progress = (older - newer) / level
        # Swings are judged against the run's loss scale, so that a converged loss of 1e-6 that
        # wobbles by 1e-6 (100% of its level, nothing in absolute terms) is not an oscillation.
        start = hist.start_loss
        rel = swing / max(level, LEVEL_FLOOR * abs(start) if math.isfinite(start) else 0.0)
        hit, base, q90, r1 = self._swinging(n, hist, level, swing, rel, progress, newer)
        hit, mech = self._mechanism(hist, level, rel, hit)
        if not self._track_episode(hit, row.step, base, q90):
            return None
        return self._finding(row, level, swing, rel, progress, base, r1, mech)

    def _swinging(
        self,
        n: int,
        hist: RunHistory,
        level: float,
        swing: float,
        rel: float,
        progress: float,
        newer: float,
    ) -> tuple[bool, float | None, float | None, float]:
        """(hit, usual change, its 90th percentile, lag-1 autocorrelation): the swings judged
        against the run's own earlier changes, or, before there is any history, as a zig-zag."""
        r1 = math.nan
        base = q90 = None
        hit = False
        if progress < PROGRESS and not self._converged(level, hist):
            base, q90 = self.frozen_base if self.frozen_base is not None else self._baseline(n)
            if base is not None and q90 is not None:
                # Most of the newest changes beat the run's own 90th percentile: under stationary
                # noise each does so with probability 0.1, so 7 of 12 is a ~1e-4 coincidence.
                hit = (
                    rel >= MIN_SWING
                    and swing >= SWING_FACTOR * base
                    and self.changes.count_above(q90) >= BIG_CHANGES
                    and newer >= self.level_before  # an LR past the valley's walls loses ground
                    and hist.learned(LEARNED)
                    and self._back_and_forth(level)
                )
                if hit and kendall_tau(list(self.losses)) >= RISING_TAU:
                    hit = False  # it swings while it climbs: that is loss_diverging's to report
            elif rel >= NEW_RUN_SWING and self._back_and_forth(level):
                r1 = lag1_autocorr(np.asarray(self.window))
                hit = math.isfinite(r1) and r1 <= NEW_RUN_AUTOCORR
        return hit, base, q90, r1

    def _mechanism(
        self, hist: RunHistory, level: float, rel: float, hit: bool
    ) -> tuple[bool, Mechanism | None]:
        """(hit, mechanism): a cause in the records (data in label order, a swinging LR) makes
        the swings a finding by itself, so the rank test need not have passed."""
        upd = hist.obs.update
        mech = upd.label_mix(self.ctx.num_classes)
        if mech is not None and not self._converged(level, hist):
            hit = True
        elif rel >= MIN_SWING and (swings := upd.lr_swings()) is not None:
            mech, hit = swings, True  # the schedule swings the loss, converged or not
        return hit, mech

    def _track_episode(self, hit: bool, step: int, base: float | None, q90: float | None) -> bool:
        """Feed the episode; True when it opens. The baseline is frozen while an episode lasts,
        so that the swings being reported do not become the run's usual change."""
        was_active = self.episode.active
        opened = self.episode.update(hit, step)
        if self.episode.active and not was_active:
            self.frozen_base = (base, q90) if base is not None and q90 is not None else None
        elif not self.episode.active:
            self.frozen_base = None
        return opened

    def _finding(
        self,
        row: Row,
        level: float,
        swing: float,
        rel: float,
        progress: float,
        base: float | None,
        r1: float,
        mech: Mechanism | None,
    ) -> Finding:
        """The finding of an episode just opened: how large the swings are, and against what."""
        win = list(self.window)
        times = swing / base if base else math.nan
        evidence = {
            "median_step_change": swing,
            "relative_swing": rel,
            "usual_step_change": base if base is not None else math.nan,
            "times_usual": times,
            "lag1_autocorr": r1 if math.isfinite(r1) else lag1_autocorr(np.asarray(win)),
            "progress_in_window": progress,
            "window": WINDOW,
            "lr": row.lr0,
        }
        if base:
            how = f"{fmt(times)}x its usual step-to-step change ({fmt(base)})"
        else:
            how = f"a zig-zag (lag-1 autocorrelation {fmt(evidence['lag1_autocorr'])})"
        summary = (
            f"over the last {WINDOW} steps the loss swings by {fmt(swing)} per step "
            f"({fmt(100 * rel)}% of its level {fmt(level)}), {how}, with no net progress."
        )
        remedy = (
            f"lower the LR{lr_now(row)} by 3-10x, or add LR decay/warmup; lower the momentum "
            "if it is high; gradient clipping also damps the swings"
        )
        if mech is not None:
            summary += f" Behind it: {mech.text}."
            remedy = mech.remedy
            evidence.update(mech.evidence)
        return self.report(
            row,
            "warning",
            summary,
            remedy,
            evidence,
            onset_step=max(self.episode.first_hit - WINDOW + 1, 0),
        )

    def _back_and_forth(self, level: float) -> bool:
        """Back and forth, and bounded: the net change over the window is under half of the total
        up-and-down movement, and the peak stays within BOUNDED x the window's median."""
        win = list(self.window)
        q = WINDOW // 6
        net = abs(median(win[-q:]) - median(win[:q]))
        moved = sum(abs(b - a) for a, b in zip(win[:-1], win[1:], strict=True))
        return net <= MONOTONE * moved and max(win) <= BOUNDED * level
