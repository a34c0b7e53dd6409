"""One side of a game has won: its loss sits near zero while the other side's cannot follow.

Only for a run that is one side of an adversarial pair (a GAN; see ``nnwatch.probe.game``). A
discriminator whose loss goes to zero tells real from fake perfectly, and the generator then gets
almost no gradient (it vanishes through a saturated sigmoid): training stops in all but name. A
generator whose loss goes to zero fools a discriminator that has stopped learning. Either way the
loss level, meaningless for a game otherwise, is evidence here: the median of the last 20 losses
below 2% of where this side began and below 0.05 in absolute terms.
"""

from __future__ import annotations

import math

from nnwatch.diagnosis.context import RunContext
from nnwatch.diagnosis.detectors.base import Detector
from nnwatch.diagnosis.episode import Episode
from nnwatch.diagnosis.history import RunHistory, median
from nnwatch.diagnosis.row import Row
from nnwatch.store.finding import Finding, fmt

WINDOW = 20
SHARE = 0.02
ABSOLUTE = 0.05


class GameBalanceDetector(Detector):
    kind = "adversarial_imbalance"

    def __init__(self, ctx: RunContext) -> None:
        super().__init__(ctx)
        self.episode = Episode(confirm=1, release=50)

    def update(self, row: Row, hist: RunHistory) -> Finding | None:
        if not hist.obs.adversarial or len(hist.loss) < WINDOW or not math.isfinite(row.loss):
            return None
        level = median(hist.loss.values(WINDOW).tolist())
        start = hist.start_loss
        won = math.isfinite(start) and start > 0 and 0 <= level < min(SHARE * start, ABSOLUTE)
        if not self.episode.update(won, row.step):
            return None
        return self.report(
            row,
            "warning",
            (
                f"this side of the game has won: its loss sits at {fmt(level)} (it began at "
                f"{fmt(start)}). If this is the discriminator, it tells real from fake perfectly and "
                "the generator's gradient vanishes; if it is the generator, the discriminator has "
                "stopped learning."
            ),
            (
                "rebalance the two sides: lower the winning side's LR (or train it less often), use "
                "label smoothing or instance noise for the discriminator, or the non-saturating "
                "generator loss; check both sides' gradient norms in the monitor"
            ),
            {"loss_now": level, "loss_at_start": start},
        )
