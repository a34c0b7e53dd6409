"""Is the loss going wrong right now? Decides when the probe stops thinning its measurements.

The cost budget measures gradients on every k-th step only. That is fine while a run is healthy
and a blind spot when it blows up: the explosion happens between two measurements. So the probe
watches the one number it reads on every step anyway, the loss, from the published record (on a
GPU one step late, which costs no sync), and measures every step while the loss is

- far above its running level (a spike: more than ``SPIKE`` robust deviations above it, or more
  than twice the level) and above every loss of the last ``PEAK_WINDOW`` steps, or
- rising: its fast average has climbed ``RISE`` deviations above the slow one,

and for ``HOLD`` steps after it looks normal again. The level is a slow exponential average with
an average absolute deviation beside it; it follows a falling loss quickly enough that a healthy
run (falling, or flat and noisy) never triggers. Near convergence a classifier's minibatch losses
are very heavy-tailed (most batches near zero, one with a misclassified sample 30x the median):
a deviation from the mean says little there, so a loss only counts as a spike when the run has
not seen its like in the recent past.
"""

from __future__ import annotations

import math
from collections import deque
from itertools import islice

SLOW = 0.05  # weight of a new loss in the running level
FAST = 0.3  # weight of a new loss in the fast average
SPIKE = 8.0  # deviations above the level that make a single loss a spike
RISE = 4.0  # deviations the fast average must climb above the level to count as rising
HOLD = 50  # steps still measured in full after the loss looks normal again
SHORT_HOLD = 5  # after a lone doubled loss, which noise near convergence also makes
DOUBLED = 4.0  # deviations above the level a doubled loss must also be
CLIMB = 1.5  # the fast average this many times the level: the loss is climbing
WARMUP = 20  # losses seen before anything is judged
PEAK_WINDOW = 64  # a loss within the range of this many recent ones is not a spike
SHIFT_N = 8  # a rise counts once the median of this many recent losses stands above the level


class LossTrend:
    """Fed one loss per step; says whether the next steps must all be measured."""

    def __init__(self) -> None:
        self.level = math.nan
        self.fast = math.nan
        self.dev = 0.0
        self.seen = 0
        self.bad_since: int | None = None  # first step of the current bad stretch
        #: the last loss was a spike of SPIKE deviations, part of a climb, or the second bad
        #: loss in a row: worth the long hold; a lone doubled loss gets the short one
        self.severe = False
        self.recent: deque[float] = deque(maxlen=PEAK_WINDOW)  # finite losses before this one

    def add(self, step: int, loss: float) -> bool:
        """Take the loss of ``step``; True while the loss is spiking or rising."""
        if not math.isfinite(loss):
            # no loss given to w.step() (NaN), or a real NaN/Inf, which the guard and the
            # detectors deal with: neither says anything about the trend
            return False
        if self.seen == 0:
            self.level = self.fast = loss
            self.seen = 1
            return False
        self.seen += 1
        level, dev = self.level, self.dev
        scale = max(dev, 1e-3 * abs(level), 1e-12)
        fast = self.fast
        recent = self.recent
        severe = bad = False
        if self.seen > WARMUP:
            # the four lines first: on a healthy step (this runs on the training thread every
            # step) none is crossed, and the recent losses are not looked at
            spike = loss > level + SPIKE * scale
            rise = fast > level + RISE * scale
            # a steady climb widens the deviation it is measured in; against the level it shows
            climb = level > 0 and fast > CLIMB * level and fast - level > 2.0 * scale
            # a loss that doubled is worth a closer look, but near convergence minibatch losses
            # are heavy-tailed (2-4x the level is ordinary there): only a short one unless it
            # persists, and only above every recent loss or with the bulk of them above the level
            doubled = level > 0 and loss > 2.0 * level and loss - level > DOUBLED * scale
            if spike or rise or climb or doubled:
                # above the highest loss of the recent past; and whether the recent losses as a
                # whole stand above the level (a climb, not one heavy-tailed batch, whose mean
                # sits far above its median: most batches lie below the level)
                above = (spike or doubled) and loss > (max(recent) if recent else -math.inf)
                bulk = (rise or climb or (doubled and not above)) and _bulk_above(recent, loss, level)
                severe = (spike and above) or ((rise or climb) and bulk)
                bad = severe or (doubled and (above or bulk))
        recent.append(loss)
        # a lone spike must not hold the fast average up for the steps after it: it is fed at
        # most the spike line, so only a run of high losses makes it climb
        self.fast += FAST * (min(loss, level + SPIKE * scale) - self.fast)
        if not bad or loss < level:  # a spike does not drag the level (or its noise) with it
            self.dev += SLOW * (abs(loss - level) - dev)
            self.level += SLOW * (loss - level)
        else:
            # a sustained rise moves the level slowly, so that a new, higher plateau ends the alarm
            self.level += 0.2 * SLOW * (loss - level)
        persists = bad and self.bad_since is not None  # the step before was bad too
        if bad and self.bad_since is None:
            self.bad_since = step
        elif not bad:
            self.bad_since = None
        self.severe = severe or persists
        return bad


def _bulk_above(recent: deque[float], loss: float, level: float) -> bool:
    """The median of ``loss`` and the ``SHIFT_N - 1`` losses before it stands above ``level``."""
    return len(recent) >= SHIFT_N - 1 and (
        sorted([loss, *islice(reversed(recent), SHIFT_N - 1)])[SHIFT_N // 2] > level
    )
