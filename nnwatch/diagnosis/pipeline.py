"""Rows in, findings out: the detectors and the history they share, with no I/O of their own.

The live :class:`~nnwatch.diagnosis.live.Diagnosis` and offline :func:`~nnwatch.diagnosis.offline.diagnose_run`
both drive a pipeline, so a recorded run is diagnosed exactly as it was live.
"""

from __future__ import annotations

import logging
import math
from typing import Any

import numpy as np

from nnwatch.diagnosis.context import RunContext
from nnwatch.diagnosis.detectors import (
    ALL_DETECTORS,
    Detector,
    LossDivergingDetector,
    NanOrInfDetector,
)
from nnwatch.diagnosis.episode import Episode, EpisodeArray
from nnwatch.diagnosis.history import RunHistory
from nnwatch.diagnosis.row import Row
from nnwatch.store.finding import Finding

log = logging.getLogger("nnwatch")

#: Findings about the level of the loss, which mean nothing for one side of an adversarial game.
GAME_LOSS_KINDS = frozenset(
    {"loss_diverging", "loss_stalled", "oscillating_loss", "loss_spike", "bad_initial_loss", "clipping_misuse"}
)


def _open(det: Detector) -> bool:
    """Whether a detector's episode is open now (its finding still stands)."""
    active = getattr(det, "confirmed", getattr(det, "active", None))  # a note is not a cause
    if isinstance(active, bool):
        return active
    return any(
        bool(np.any(v.active)) for v in vars(det).values() if isinstance(v, (Episode, EpisodeArray))
    )


class Pipeline:
    def __init__(
        self, ctx: RunContext, detectors: tuple[type[Detector], ...] = ALL_DETECTORS
    ) -> None:
        self.ctx = ctx
        self.history = RunHistory()
        self.detectors: list[Detector] = [cls(ctx) for cls in detectors]
        self.history.obs.active_source = self._open_kinds
        self.history.obs.update.configure(ctx)
        # the loss goes through another network trained elsewhere (a GAN watched on one side):
        # its level moves when that network learns, as one side of a game's does
        self.history.obs.adversarial = ctx.loss_outside > 0
        self.last_step = -1

    def feed(self, rows: np.ndarray, act_known: np.ndarray | None = None) -> list[Finding]:
        """Run every detector over ``rows`` (step order). ``act_known[i]`` False: no act_sum for row i."""
        out: list[Finding] = []
        for row in Row.batch(rows, act_known):
            out.extend(self.feed_row(row))
        return out

    def feed_row(self, row: Row) -> list[Finding]:
        out: list[Finding] = []
        for det in list(self.detectors):
            try:
                f = det.update(row, self.history)
            except Exception as exc:  # noqa: BLE001 - one broken detector must not take the rest
                self.detectors.remove(det)
                log.error("nnwatch: the %s detector failed and was switched off: %r", det.kind, exc)
                continue
            if f is not None and not self._outranked(f):
                out.append(f)
        self.history.push(row)
        self.last_step = row.step
        return out

    def _open_kinds(self) -> set[str]:
        return {d.kind for d in self.detectors if _open(d)}

    def _outranked(self, f: Finding) -> bool:
        """A loss that swings while it diverges is diverging: no oscillation finding on top. One
        side of a game (a GAN's generator or discriminator) has a loss that rises, stalls and
        swings by design: its loss-level findings are left to the game's own checks."""
        if self.history.obs.adversarial and f.kind in GAME_LOSS_KINDS:
            return True
        if f.kind == "exploding_gradients":
            # a loss with no floor drags its gradient up with it: that finding names the cause
            return any(
                isinstance(d, LossDivergingDetector) and d.falling_below_zero for d in self.detectors
            )
        if f.kind != "oscillating_loss":
            return False
        return any(isinstance(d, LossDivergingDetector) and d.active for d in self.detectors)

    def nan_detector(self) -> NanOrInfDetector | None:
        return next((d for d in self.detectors if isinstance(d, NanOrInfDetector)), None)

    def on_guard(
        self, step: int, act_sum: Any, grad_layer: Any, grad_max: float = math.nan
    ) -> Finding | None:
        det = self.nan_detector()
        if det is None:
            return None
        return det.on_guard(step, act_sum, grad_layer, self.history, grad_max)
