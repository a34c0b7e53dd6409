"""Vanishing gradients: too little gradient reaches the parameters (or the layers near the input).

Two published rules, each made robust against runs whose natural scale is unusual:

* Textbook: a global gradient norm below 1e-6 means the gradients have vanished. A run whose loss is
  scaled down can train fine at that norm, so the rule also needs the loss to have stopped
  improving, and a run that converged to a near-zero loss is left alone.
* AutoTrainer (ICSE 2021): the gradient of the first layer is a tiny fraction of the last layer's.
  Here the ratio compares per-element (RMS) gradients, so that big and small layers compare fairly,
  skips embeddings (whose gradients are sparse by design) and layers with exactly zero gradient
  (the dead-ReLU detector names those), and needs the ratio below 1e-4 for three steps in a row.

Activation standard deviations below 1e-4 (the textbook "collapsed signal" bound) are reported as
evidence, not used as a trigger: a zero-initialised output layer legitimately starts there.
"""

from __future__ import annotations

import math

import numpy as np

from nnwatch.diagnosis.context import RECTIFIER_KINDS, RunContext
from nnwatch.diagnosis.detectors.base import Detector
from nnwatch.diagnosis.detectors.exploding_gradients import first_to_last
from nnwatch.diagnosis.episode import Episode
from nnwatch.diagnosis.history import RunHistory
from nnwatch.diagnosis.row import Row
from nnwatch.store.finding import Finding, fmt
from nnwatch.store.schema import FieldName

TEXTBOOK_NORM = 1e-6
RATIO_LIMIT = 1e-4
CONFIRM = 3
RELEASE = 20
STD_COLLAPSED = 1e-4
CONVERGED = 1e-3  # loss below this fraction of where it started: converged, not vanished


class VanishingGradientsDetector(Detector):
    kind = "vanishing_gradients"

    def __init__(self, ctx: RunContext) -> None:
        super().__init__(ctx)
        self.episode = Episode(confirm=CONFIRM, release=RELEASE)
        self.last_std: np.ndarray | None = None

    def update(self, row: Row, hist: RunHistory) -> Finding | None:
        if row.act_std is not None:
            self.last_std = row.act_std
        g = row.grad_norm
        if not math.isfinite(g):
            return None  # not measured, or non-finite (another detector's business)
        if row.clip_threshold == 0.0:
            return None  # the user's clip at max_norm=0 zeroes the gradients: clipping_misuse
        if g == 0.0 or hist.obs.loss_independent:
            return None  # no gradient at all is not a small one: the loss ignores the weights
        tiny = g < TEXTBOOK_NORM and self._not_converged(row, hist) and self._stuck(hist, g)
        fl = first_to_last(self.ctx, row.grad_layer)
        ratio = fl[2] / fl[3] if fl is not None and fl[3] > 0 else math.nan
        skewed = math.isfinite(ratio) and ratio < RATIO_LIMIT
        if not self.episode.update(tiny or skewed, row.step):
            return None
        return self._finding(row, g, tiny, fl, ratio)

    @staticmethod
    def _not_converged(row: Row, hist: RunHistory) -> bool:
        start = hist.start_loss
        if not (math.isfinite(row.loss) and math.isfinite(start)) or start <= 0:
            return True
        return row.loss > CONVERGED * start

    @staticmethod
    def _stuck(hist: RunHistory, g: float) -> bool:
        """The loss stopped improving, or the norm fell 100x below its own earlier level."""
        earlier = hist.log_grad.values()
        if earlier.size and g > 0 and float(np.max(earlier)) - math.log10(g) >= 2.0:
            return True
        prog = hist.recent_progress(10)
        return not (math.isfinite(prog) and prog > 0.01)

    def _collapsed_layers(self) -> list[int]:
        if self.last_std is None:
            return []
        std = self.last_std
        return [
            i
            for i in range(min(std.size, self.ctx.num_layers))
            if math.isfinite(float(std[i]))
            and std[i] < STD_COLLAPSED
            and self.ctx.layer_kinds[i] not in RECTIFIER_KINDS
        ]

    def _finding(self, row: Row, g: float, tiny: bool, fl: tuple[int, int, float, float] | None, ratio: float) -> Finding:
        ctx = self.ctx
        collapsed = self._collapsed_layers()
        evidence: dict[str, float] = {
            FieldName.GRAD_NORM: g,
            "textbook_limit": TEXTBOOK_NORM,
            "first_to_last_layer_ratio": ratio,
            "ratio_limit": RATIO_LIMIT,
            "loss": row.loss,
            "collapsed_activation_layers": len(collapsed),
        }
        layer = None
        if fl is not None and math.isfinite(ratio) and ratio < RATIO_LIMIT:
            first, last, a, b = fl
            layer = ctx.param_layer_names[first]
            depth = max(
                1,
                int(
                    np.flatnonzero(ctx.param_order == last)[0]
                    - np.flatnonzero(ctx.param_order == first)[0]
                ),
            )
            per_layer = ratio ** (1.0 / depth)
            evidence.update(
                {"first_layer_rms_grad": a, "last_layer_rms_grad": b, "shrink_per_layer": per_layer}
            )
            summary = (
                f"per-element gradients reaching {ctx.param_label(first)} are {fmt(ratio)} of those at "
                f"{ctx.param_label(last)} (about x{fmt(per_layer)} per layer on the way back), so the "
                "layers near the input barely learn."
            )
        else:
            summary = f"the global gradient norm is {fmt(g)} (below {fmt(TEXTBOOK_NORM)}) and the loss has stopped improving."
            if g == 0:
                summary = "every gradient is exactly zero and the loss has stopped improving."
        if collapsed:
            names = ", ".join(ctx.layer_names[i] for i in collapsed[:3])
            summary += f" Activations have collapsed (std < {fmt(STD_COLLAPSED)}) in {names}."
            if layer is None:
                layer = ctx.layer_names[collapsed[0]]
        remedy = (
            "fix the init (He/Kaiming for ReLU-like, Xavier for tanh; avoid tiny init scales), "
            "replace sigmoid/tanh with ReLU/GELU, and add normalization layers (BatchNorm/LayerNorm) "
            "or residual connections"
        )
        if tiny and not collapsed and fl is None:
            remedy += "; if the loss itself is scaled down, scale it back up or raise the LR"
        return self.report(
            row,
            "error",
            summary,
            remedy,
            evidence,
            layer=layer,
            onset_step=self.episode.first_hit,
        )
