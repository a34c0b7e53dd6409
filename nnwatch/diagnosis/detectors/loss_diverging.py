"""Loss diverging: the loss rises, and stays up, far above the level this run had reached.

A diverging run is the one failure every user can see on the loss curve, and often the first
sign: the loss turns up steps before the gradient norm overflows or a NaN appears. The rule judges
the run against its own past, never against a fixed number:

* the *base* is the median of the losses just before the newest 16 (the 48 before them), or, in
  the first 64 steps, the lower of that and the run's first losses (a run that diverges from
  step 0 has no healthy stretch to compare with);
* the *unit* of rise is the larger of |base| and 6x the base stretch's own step-to-step noise
  (MAD-based), so that a noisy loss has to rise by more than its noise and a loss near zero is
  judged on its noise, not on a ratio;
* a step is a hit when the median of the last 5 losses is at least one unit above the base
  (doubled, for a positive loss), 4 of those 5 are at least half a unit above it (sustained, not a
  spike: that is ``loss_spike``), and the rise is either a trend (Kendall's tau of the last 12
  losses at least 0.4) or far above the base (3 units: a loss that leapt and now sits flat up there,
  like an LSTM at an absurd LR, or a run stuck far above its healthy level);
* a slow climb, which the base stretch follows up, is judged against the best level the run
  reached instead (the lowest median of 16 consecutive losses): the median of the last 16 at
  least one unit above it (with 3 sigma of the noise there), trending up (tau of the last 24 at
  least 0.3) or 3 units above;
* a unit is never less than half of what the run has learned (start minus base), so that a
  converged loss that bumps up (a restart of a cosine schedule, a transient instability) is not a
  divergence;
* in the first 12 losses there is little history, so only a ten-fold runaway counts (the last
  three losses at least 10x the first loss, or 9 units above it).

One finding per episode; it ends after 50 steps back near the base. ``oscillating_loss`` defers to
this: a loss that swings while it climbs is diverging.

A rise is an error only when a mechanism backs it: something in the set-up or the updates that
makes a loss climb (the LR now well above the one the run was stable at, an update ratio several
times its stable level, weights that grow fast, exploding or non-finite gradients, gradients never
cleared, a negative LR), or a ten-fold runaway in the first steps. A loss moves for other reasons
too: a curriculum that adds harder examples, a loss term switched on, the other side of a game
getting better. Without a mechanism the rise is a note, re-judged while it lasts: a mechanism
that appears makes it an error, a loss that stays up for ``PATIENCE`` steps without falling back
a warning, and a loss that falls again stays a note.

A loss that falls without bound below zero is diverging too, downward: a loss with a floor stops
at it. That is named as such, with its usual cause (a term whose sign is flipped).
"""

from __future__ import annotations

import itertools
import math
from collections import deque

from nnwatch.diagnosis.context import RunContext
from nnwatch.diagnosis.detectors.base import Detector, lr_now
from nnwatch.diagnosis.differential import (
    causes_sentence,
    observed_causes,
    remedy_text,
)
from nnwatch.diagnosis.episode import Episode
from nnwatch.diagnosis.history import (
    MAD_TO_SIGMA,
    RunHistory,
    SortedWindow,
    kendall_tau,
    median,
)
from nnwatch.diagnosis.mechanism import Mechanism
from nnwatch.diagnosis.row import Row
from nnwatch.store.finding import Finding, fmt
from nnwatch.store.schema import FieldName

WINDOW = 16  # the newest losses, judged against the stretch before them
REF = 48  # losses in the base stretch
EARLY = 64  # within this many losses the run's first losses also bound the base
LAST = 5
TREND_N = 12
TREND_TAU = 0.4
NOISE_UNITS = 6.0
FAR = 3.0
EARLY_N = 12
EARLY_FAR = 9.0
RELEASE = 50
SLOW_NOISE_UNITS = 3.0  # the median of 16 is steadier than one loss
SLOW_TREND_N = 24
SLOW_TREND_TAU = 0.3
#: a run that has learned diverges when it gives back at least half of what it learned (a bump
#: of a converged loss, or a transient instability it recovers from, gives back less)
LEARNED_SHARE = 0.5
PATIENCE = 100  # steps a rise with no mechanism may last before it is a warning
#: Kinds whose open episode is a mechanism for a rising loss, and how it is said
RISE_KINDS = {
    "exploding_gradients": "the gradients exploded with it",
    "nan_or_inf": "the numbers overflowed or went non-finite with it",
    "amp_scale_collapse": "the AMP scaler skips the updates as its scale collapses",
}
UNBOUNDED = 10.0  # a negative loss this many times the scale it started at, and still falling
UNBOUNDED_TAU = -0.4
DOUBLING = 24  # steps within which a loss with no floor at least doubles its size


def noise_sigma(ref: list[float]) -> float:
    """Step-to-step noise of a stretch of losses (MAD of the differences, as one loss's sigma)."""
    diffs = [b - a for a, b in zip(ref[:-1], ref[1:], strict=True)]
    if len(diffs) < 3:
        return 0.0
    med = median(diffs)
    return MAD_TO_SIGMA * median([abs(d - med) for d in diffs]) / math.sqrt(2.0)


def rise_unit(base: float, noise: float, start: float, noise_units: float = NOISE_UNITS) -> float:
    """One unit of rise above ``base``: |base|, the stretch's noise, or a quarter of the progress
    the run made from its start (a bump of a converged loss is small next to what it learned)."""
    progress = LEARNED_SHARE * (start - base) if math.isfinite(start) and start > base else 0.0
    return max(abs(base), noise_units * noise, progress, 1e-12)


class LossDivergingDetector(Detector):
    kind = "loss_diverging"

    def __init__(self, ctx: RunContext) -> None:
        super().__init__(ctx)
        self.losses: deque[float] = deque(maxlen=REF + WINDOW)
        self.steps: deque[int] = deque(maxlen=REF + WINDOW)
        self.ref = SortedWindow(REF)  # the losses before the newest WINDOW
        self.newest = SortedWindow(WINDOW)
        self.first: list[float] = []
        self.start = math.nan  # median of the first LAST losses
        self.seen = 0
        self.episode = Episode(confirm=1, release=RELEASE)
        self.frozen: tuple[float, float] | None = None
        self.best = math.inf
        self._best_window: list[float] = []
        self._best_noise: float | None = 0.0
        self.severity = "error"  # of the open episode: "info" while no mechanism backs the rise
        self.peak = -math.inf  # the highest median of 5 in the open episode
        self.unbounded = Episode(confirm=3, release=RELEASE)
        self.mechanism: Mechanism | None = None  # what backs the open episode's rise

    @property
    def active(self) -> bool:
        return self.episode.active

    @property
    def falling_below_zero(self) -> bool:
        """The loss is negative, ten times the scale it started at and falling: a loss with no
        floor in the making (its gradient grows with it; that finding is this one's)."""
        if self.unbounded.active:
            return True
        losses = list(self.losses)
        if len(losses) < TREND_N or not math.isfinite(self.start):
            return False
        level = median(losses[-LAST:])
        return (
            level < 0
            and -level >= UNBOUNDED * max(abs(self.start), 1e-3)
            and kendall_tau(losses[-TREND_N:]) <= UNBOUNDED_TAU
        )

    @property
    def best_noise(self) -> float:
        """Noise around the best level, computed when first needed (the best moves on every step
        of a falling loss; its noise is needed only when the loss climbs far above it)."""
        if self._best_noise is None:
            self._best_noise = noise_sigma(self._best_window)
        return self._best_noise

    def _base(self) -> tuple[float, list[float] | None]:
        """The level before the newest losses, and the stretch it came from (None: the first ones)."""
        if len(self.losses) > WINDOW + 8:
            base, ref = self.ref.median(), None
        else:
            ref = self.first[:LAST]
            base = median(ref)
        if self.seen <= EARLY:
            base = min(base, self.start)
        return base, ref

    def base_and_unit(self) -> tuple[float, float]:
        """The level the run was at before the newest losses, and one unit of rise above it."""
        if self.frozen is not None:
            return self.frozen
        base, ref = self._base()
        return base, rise_unit(base, noise_sigma(ref or self.ref.values()), self.start)

    def update(self, row: Row, hist: RunHistory) -> Finding | None:
        loss = row.loss
        if not math.isfinite(loss):
            return None  # a NaN is nan_or_inf's; an unlogged loss says nothing
        found = self._rise(row, hist, loss)
        below = self._below(row, hist)
        return found or below

    def _below(self, row: Row, hist: RunHistory) -> Finding | None:
        """A loss that falls without bound below zero (see the module docstring)."""
        hit = falls_without_bound(list(self.losses), self.start)
        if not self.unbounded.update(hit, row.step):
            return None
        level = median(list(itertools.islice(reversed(self.losses), LAST)))
        return self.report(
            row,
            "error",
            (
                f"the loss falls without bound below zero: from {fmt(self.start)} at the start to "
                f"{fmt(level)}, and still falling. A loss with a floor (cross-entropy, a squared "
                "error, a KL divergence) stops at it; one that can fall forever has a term that "
                "rewards growing outputs, and its gradients grow with it."
            ),
            (
                "check the sign of each term of the loss: a KL divergence or a log-likelihood "
                "added where it should be subtracted (KL >= 0 is added to a loss), a reward "
                "maximised by gradient descent without a minus; a learned variance that can "
                "shrink to zero needs a floor"
            ),
            {"loss_now": level, "loss_at_start": self.start, "lr": row.lr0},
            onset_step=self.unbounded.first_hit,
        )

    def _rise(self, row: Row, hist: RunHistory, loss: float) -> Finding | None:
        self._keep(row.step, loss)
        if self.seen < 4:
            return None
        level = median(list(itertools.islice(reversed(self.losses), LAST)))
        tau = math.nan
        hit = False
        if self.frozen is not None:
            base, unit = self.frozen
        else:
            base, ref = self._base()
            unit = rise_unit(base, 0.0, self.start)  # a lower bound: the noise only raises it
            if self.seen >= EARLY_N and level - base >= unit:  # rise >= 1 is possible: look closer
                unit = rise_unit(base, noise_sigma(ref or self.ref.values()), self.start)
        if self.seen < EARLY_N:
            # little history: only a runaway from the very first loss counts
            base = self.first[0]
            unit = max(abs(base), 1e-12)
            last3 = list(itertools.islice(reversed(self.losses), 3))
            hit = sum((x - base) / unit >= EARLY_FAR for x in last3) >= 2  # 2 of the last 3
            level = median(last3)
        elif (level - base) / unit >= 1.0:
            v = list(self.losses)
            last = v[-LAST:]
            sustained = sum(1 for x in last if x - base >= 0.5 * unit) >= LAST - 1
            tau = kendall_tau(v[-TREND_N:])
            hit = sustained and ((level - base) / unit >= FAR or tau >= TREND_TAU)
        if not hit and self.seen >= EARLY_N and math.isfinite(self.best):
            climb = self._slow_climb(level)
            if climb is not None:
                hit, (base, unit, tau) = True, climb
        was = self.episode.active
        opened = self.episode.update(hit, row.step)
        if self.episode.active and not was:
            self.frozen = (base, unit)
        elif not self.episode.active:
            self.frozen = None
        if not self.episode.active:
            return None
        self.peak = max(self.peak, level) if not opened else level
        if opened:
            early = self.seen < EARLY_N
            self.mechanism = None if early else self._mechanism(row, hist, base, unit)
            self.severity = "error" if early or self.mechanism is not None else "info"
        elif self.severity != "error":
            return self._rejudge(row, hist, base, unit, level)
        else:
            return None
        if math.isnan(tau):
            tau = kendall_tau(list(self.losses)[-TREND_N:])
        return self._finding(row, hist, base, unit, level, tau)

    def _keep(self, step: int, loss: float) -> None:
        """This loss into the windows: the first losses, the reference, the newest, the best."""
        self.seen += 1
        if len(self.first) < LAST:
            self.first.append(loss)
            self.start = median(self.first)
        if len(self.losses) >= WINDOW:
            self.ref.push(self.losses[-WINDOW])
        self.losses.append(loss)
        self.steps.append(step)
        self.newest.push(loss)
        if len(self.losses) >= WINDOW:
            m = self.newest.median()
            if m < self.best:  # the lowest median of WINDOW consecutive losses so far
                self.best = m
                self._best_window = self.newest.values()
                self._best_noise = None

    def _slow_climb(self, level: float) -> tuple[float, float, float] | None:
        """A slow climb, which the stretch just before follows up: against the best level.
        (base, unit, trend tau) when the loss has climbed far enough above it, else None."""
        slow = self.newest.median()
        lower = rise_unit(self.best, 0.0, self.start, SLOW_NOISE_UNITS)
        if slow - self.best >= lower and level - self.best >= lower:
            b_unit = rise_unit(self.best, self.best_noise, self.start, SLOW_NOISE_UNITS)
            if slow - self.best >= b_unit and level - self.best >= b_unit:
                t = kendall_tau(list(self.losses)[-SLOW_TREND_N:])
                if t >= SLOW_TREND_TAU or slow - self.best >= FAR * b_unit:
                    return self.best, b_unit, t
        return None

    def _mechanism(self, row: Row, hist: RunHistory, base: float, unit: float) -> Mechanism | None:
        """What backs the rise: the set-up, another detector's open episode, the updates."""
        obs = hist.obs
        if observed_causes(obs):
            return Mechanism("observed", "", "")  # worded by causes_sentence
        for kind, text in RISE_KINDS.items():
            if kind in obs.active:
                return Mechanism(kind, text, "")
        return obs.update.rise(self._onset(base, unit), row.lr0)

    def _rejudge(
        self, row: Row, hist: RunHistory, base: float, unit: float, level: float
    ) -> Finding | None:
        """A rise with no mechanism, while it lasts: an error once one appears, a warning once it
        has stayed up for PATIENCE steps without falling back."""
        mech = self._mechanism(row, hist, base, unit)
        if mech is not None:
            self.mechanism, self.severity = mech, "error"
        elif self.severity == "info" and row.step - self._onset(base, unit) >= PATIENCE:
            back = self.peak - level >= 0.5 * (self.peak - base)
            tau = kendall_tau(list(self.losses)[-SLOW_TREND_N:])
            if back or tau <= -SLOW_TREND_TAU:
                return None  # it is falling again: a jump the run recovers from
            self.severity = "warning"
        else:
            return None
        return self._finding(row, hist, base, unit, level, kendall_tau(list(self.losses)[-TREND_N:]))

    def _onset(self, base: float, unit: float) -> int:
        """The first step of the current climb: where the loss last sat within half a unit of base."""
        onset = int(self.steps[-1])
        for x, st in zip(reversed(self.losses), reversed(self.steps), strict=True):
            if x - base < 0.5 * unit:
                break
            onset = int(st)
        return onset

    def _finding(
        self, row: Row, hist: RunHistory, base: float, unit: float, level: float, tau: float
    ) -> Finding:
        onset = self._onset(base, unit)
        times = level / base if base > 0 else math.nan
        evidence: dict[str, float] = {
            "loss_now": level,
            "loss_before": base,
            "times_before": times,
            "rise_in_units": (level - base) / unit,
            "trend_tau": tau,
            "best_loss": hist.best_loss,
            "loss_at_start": hist.start_loss,
            "lr": row.lr0,
            FieldName.GRAD_NORM: row.grad_norm,
            FieldName.CLIP_THRESHOLD: row.clip_threshold,
        }
        how = f"{fmt(times)}x" if math.isfinite(times) and times > 0 else f"+{fmt(level - base)}"
        shape = "and keeps climbing" if tau >= SLOW_TREND_TAU else "and stays up there"
        summary = f"the loss rose from {self._reference(base)} to {fmt(level)} ({how}), climbing since step {onset}, {shape}"
        k = self.ctx.num_classes
        if k and k > 1 and level > math.log(k) * 1.2:
            summary += f"; it is worse than chance (ln({k}) = {fmt(math.log(k))})"
        summary += "."
        summary += causes_sentence(hist.obs)
        mech = self.mechanism
        if mech is not None and mech.text:
            summary += f" Behind it: {mech.text}."
            evidence.update(mech.evidence)
        summary += _unexplained(self.severity, row.step, onset)
        remedy = remedy_text(hist.obs, self._remedies(row, onset))
        return self.report(
            row,
            self.severity,
            summary,
            remedy,
            evidence,
            onset_step=onset,
            obs=hist.obs,
        )

    def _reference(self, base: float) -> str:
        """The level the loss rose from, named as the run reached it."""
        if base == self.best and base < self.start:
            return f"its best level {fmt(base)}"
        if self.seen <= EARLY_N:
            return f"its first loss ({fmt(base)})"
        if base == self.start:
            return f"the level of its first steps (median {fmt(base)})"
        return f"the level it held before ({fmt(base)})"

    def _remedies(self, row: Row, onset: int) -> list[tuple[str, str]]:
        """(remedy id, text): the mechanism's fix, the LR, the clip, the data (first when no
        update explains the rise)."""
        mech = self.mechanism
        candidates: list[tuple[str, str]] = []
        if mech is not None and mech.remedy:
            candidates.append(("", mech.remedy))
        candidates.append(("lower_lr", f"lower the LR{lr_now(row)} by 10x (the usual cause)"))
        if math.isfinite(row.clip_threshold):
            candidates.append((
                "lower_lr",
                f"your clip at max_norm={fmt(row.clip_threshold)} did not stop it: the LR is what is too large",
            ))  # fmt: skip
        else:
            candidates.append(("add_clip", "clip gradients (torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0))"))
        candidates.append((
            "",
            f"look at the batches around step {onset} for outliers or bad labels (press s for a snapshot)",
        ))  # fmt: skip
        if self.severity != "error":
            candidates = candidates[-1:] + candidates[:-1]  # the data first: no update explains it
        return candidates


def _unexplained(severity: str, step: int, onset: int) -> str:
    """A note or a warning says that nothing in the updates explains the rise."""
    if severity == "info":
        return (
            " Nothing in the updates explains it (the LR, the size of the updates and the "
            "weights' norm are as they were while the run was stable): a change in the data "
            "or the objective (a curriculum stage, a loss term switched on, the other side "
            "of a game) raises a loss this way too. A note for now: it becomes a warning if "
            "the loss stays up, an error if a cause appears in the updates."
        )
    if severity == "warning":
        return (
            f" It has stayed up for {step - onset} steps without falling back, though "
            "nothing in the updates explains it: look at what changed in the data or the loss "
            f"around step {onset}."
        )
    return ""


def falls_without_bound(losses: list[float], start: float) -> bool:
    """The loss is negative, at least ``UNBOUNDED`` times the scale it started at, falling
    (Kendall's tau of the last 12 at most -0.4), and its size doubled in each of the last two
    stretches of ``DOUBLING`` steps: a loss with no floor runs away geometrically, where one with a
    floor below zero (a Wasserstein critic finding its margin, a log-likelihood of continuous data)
    falls once and settles."""
    if len(losses) < 2 * DOUBLING + LAST or not math.isfinite(start):
        return False
    level = median(losses[-LAST:])
    before = median(losses[-DOUBLING - LAST : -DOUBLING])
    earlier = median(losses[-2 * DOUBLING - LAST : -2 * DOUBLING])
    scale = max(abs(start), 1e-3)
    return (
        level < 0
        and -level >= UNBOUNDED * scale
        and -level >= 2.0 * abs(before)
        and -before >= 2.0 * abs(earlier)
        and kendall_tau(losses[-TREND_N:]) <= UNBOUNDED_TAU
    )
