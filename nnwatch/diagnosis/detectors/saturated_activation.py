"""Saturated activations: tanh outputs pinned at +-1, sigmoid outputs pinned at 0 or 1.

A saturated unit passes almost no gradient (tanh'(x) = 1 - tanh(x)^2, sigmoid'(x) = s (1 - s)), so
the layers before it stop learning, like dead ReLUs but with no exact zeros to count. The usual
causes are inputs that were never normalized (raw pixels 0..255), weights initialized too large,
or an LR that grew the pre-activations.

The probe records each layer's output mean and standard deviation, which give the layer's mean
local derivative without another pass over the activations:

* tanh: E[1 - y^2] = 1 - (mean^2 + std^2), at most 1;
* sigmoid: E[y (1 - y)] = mean - (mean^2 + std^2), at most 1/4, so it is scaled by 4.

That *derivative fraction* is 1 for a layer working in its linear range, about 0.2-0.9 for a
healthy layer, and near 0 for a saturated one. A layer counts as saturated when the fraction is at
most 0.08 on 2 sampled steps in a row (per-layer stats are sampled every few steps), or at most
0.02 on one: an average over thousands of outputs is not a noisy reading. For Gaussian
pre-activations of standard deviation s the fraction is about 0.8/s for tanh and 1.6/s for sigmoid
(sigmoid(z) is tanh(z/2) rescaled), so 0.08 means pre-activations spread ten times past the tanh's
linear range (twenty for a sigmoid): no layer gets there by working normally. The healthy runs
here stay at 0.19 or above, even a tanh regression on targets in the hundreds. Only modules nnwatch sees
(``nn.Tanh``, ``nn.Sigmoid``) are judged: the gates inside an LSTM or GRU are saturated by design,
and so is a sigmoid the loss reads with ``BCELoss``: its outputs near 0 and 1 are sure
predictions, and the loss undoes its derivative (the logits get ``s - t``). A tanh or sigmoid
output under any other loss (MSE to targets past its range) is judged like any layer.
"""

from __future__ import annotations

from typing import cast

import numpy as np

from nnwatch.diagnosis.context import RunContext
from nnwatch.diagnosis.detectors.base import Detector
from nnwatch.diagnosis.episode import EpisodeArray
from nnwatch.diagnosis.history import RunHistory
from nnwatch.diagnosis.row import Row
from nnwatch.store.finding import Finding, fmt
from nnwatch.store.schema import FieldName

SATURATING_KINDS = {"Tanh": "tanh", "Sigmoid": "sigmoid"}
SATURATED = 0.08  # mean derivative, as a fraction of the activation's largest derivative
SURELY = 0.02  # this low, one sampled step is enough
CONFIRM = 2  # sampled steps in a row at SATURATED
RELEASE = 3


def derivative_fraction(kind: str, mean: np.ndarray, std: np.ndarray) -> np.ndarray:
    """Mean local derivative of a tanh or sigmoid layer from its output mean and std (0..1)."""
    second = mean * mean + std * std
    if kind == "tanh":
        return cast("np.ndarray", 1.0 - second)
    return cast("np.ndarray", 4.0 * (mean - second))


class SaturatedActivationDetector(Detector):
    kind = "saturated_activation"

    def __init__(self, ctx: RunContext) -> None:
        super().__init__(ctx)
        kinds = [SATURATING_KINDS.get(k) for k in ctx.layer_kinds]
        self.tanh = np.array([k == "tanh" for k in kinds], dtype=bool)
        self.sigmoid = np.array([k == "sigmoid" for k in kinds], dtype=bool)
        output = np.array([n in ctx.output_layers for n in ctx.layer_names], dtype=bool)
        self.watched = (self.tanh | self.sigmoid) & ~output
        self.any = bool(self.watched.any())
        self.start = np.full(ctx.num_layers, np.nan)
        self.episodes = EpisodeArray(ctx.num_layers, confirm=1, release=RELEASE)
        self.prev_hit = np.zeros(ctx.num_layers, dtype=bool)

    def update(self, row: Row, hist: RunHistory) -> Finding | None:
        if not self.any or row.act_mean is None or row.act_std is None:
            return None
        mean = row.act_mean.astype(np.float64)
        std = row.act_std.astype(np.float64)
        frac = np.where(
            self.tanh,
            derivative_fraction("tanh", mean, std),
            derivative_fraction("sigmoid", mean, std),
        )
        seen = self.watched & np.isfinite(frac)
        if row.act_nonfinite is not None:
            seen &= row.act_nonfinite == 0  # a NaN output is nan_or_inf's, not saturation
        first = seen & np.isnan(self.start)
        self.start[first] = frac[first]
        low = seen & (frac <= SATURATED)
        hit = (seen & (frac <= SURELY)) | (low & self.prev_hit)
        self.prev_hit = np.where(seen, low, self.prev_hit)
        opened = self.episodes.update(hit, row.step, observed=seen)
        if not opened.any():
            return None
        new = np.flatnonzero(opened)
        i = int(new[0])
        others = [self.ctx.layer_names[int(k)] for k in new[1:4]]
        return self._finding(row, i, float(frac[i]), float(mean[i]), float(std[i]), others)

    def _finding(
        self, row: Row, i: int, frac: float, mean: float, std: float, others: list[str]
    ) -> Finding:
        ctx = self.ctx
        tanh = bool(self.tanh[i])
        rms = float(np.sqrt(mean * mean + std * std))
        evidence: dict[str, float] = {
            "layer_index": i,
            "derivative_fraction": frac,
            "derivative_fraction_at_start": float(self.start[i]),
            "threshold": SATURATED,
            FieldName.ACT_MEAN: mean,
            FieldName.ACT_STD: std,
            "act_rms": rms,
            "saturated_layers": int(self.episodes.active.sum()),
        }
        if tanh:
            where = f"its outputs sit near +-1 (root mean square {fmt(rms)})"
            grad = "1 - tanh^2"
        else:
            where = f"its outputs sit near 0 and 1 (mean {fmt(mean)}, std {fmt(std)})"
            grad = "s(1 - s)"
        summary = (
            f"{ctx.layer_label(i)} is saturated: {where}, so its mean derivative ({grad}) is "
            f"{fmt(100 * frac)}% of its largest (it started at {fmt(100 * float(self.start[i]))}%). "
            "Gradients through it nearly vanish."
        )
        if others:
            summary += f" Also saturated: {', '.join(others)}."
        remedy = (
            "normalize the inputs (zero mean, unit variance: raw pixel values 0-255 saturate at once), "
            "initialize the layer before it with Xavier/Glorot (nn.init.xavier_uniform_), put a "
            "LayerNorm/BatchNorm before the activation, or lower the LR if the saturation grew "
            "during training"
        )
        return Finding(
            kind=self.kind,
            severity="warning",
            step=row.step,
            summary=summary,
            remedy=remedy,
            layer=ctx.layer_names[i],
            evidence=evidence,
            onset_step=int(self.episodes.first_hit[i]),
        )
