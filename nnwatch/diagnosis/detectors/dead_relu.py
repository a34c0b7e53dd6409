"""Dead ReLUs: rectifier units that output zero for every input, so no gradient reaches them.

The quantity is the *unit*, not the output value: a healthy sparse ReLU layer is 75-85% exact
zeros while only a few of its units are dead, and an output-zero share flags it for nothing. On
sampled steps the probe records, per rectifier layer, the fraction of units (features, or conv
channels) whose output is zero for every input of the batch. A layer is dead when at least 70% of
its units are, on two sampled steps in a row, and 20 points more than it had at the start, or
90% outright (one sampled step). Two cheaper signals cover the steps in between:

* a rectifier's output sum is exactly 0.0 only when every output is zero (every unit dead);
* a parameter-owning layer whose gradient is exactly 0.0 while others still get gradients, and
  whose output goes straight into a ReLU-family module, feeds units that are all dead; the finding
  names that ReLU. A finding of this kind only ever names a ReLU-family layer: a zero gradient
  with no rectifier after it (an LSTM, a Linear, a functional relu nnwatch cannot see) is
  ``zero_gradient_layer``'s, which names it for what it is.

Runs recorded before the per-unit field (schema 2) are judged on the last two signals only.
"""

from __future__ import annotations

import math

import numpy as np

from nnwatch.diagnosis.context import RECTIFIER_KINDS, RunContext
from nnwatch.diagnosis.detectors.base import Detector
from nnwatch.diagnosis.differential import causes_sentence, remedy_text
from nnwatch.diagnosis.episode import EpisodeArray
from nnwatch.diagnosis.history import RunHistory
from nnwatch.diagnosis.observed import Observations
from nnwatch.diagnosis.row import Row
from nnwatch.store.finding import Finding, fmt
from nnwatch.store.schema import FieldName

DEAD_FRACTION = 0.70  # DeepDiagnosis
SURELY_DEAD = 0.90
AT_ONCE = 0.90
RISE_OVER_START = 0.20
FULLY_DEAD_STEPS = 3
ZERO_GRAD_STEPS = 3
RELEASE_SAMPLES = 2
RELEASE_STEPS = 20
#: rows a layer's output must have had for "every output is zero" to mean dead units (a rarely
#: chosen expert of a mixture that saw two tokens says nothing of its units)
MIN_DEAD_INPUTS = 16


class DeadReluDetector(Detector):
    kind = "dead_relu"

    def __init__(self, ctx: RunContext) -> None:
        super().__init__(ctx)
        L, P = ctx.num_layers, ctx.num_param_layers
        kinds = ctx.layer_kinds
        self.rectifier = np.array([k in RECTIFIER_KINDS for k in kinds], dtype=bool)
        self.any_rectifier = bool(self.rectifier.any())
        self.reported = np.zeros(L, dtype=bool)
        self._reported = False  # reported.any(), kept as a bool: read on every row
        self.reported_grad = np.zeros(P, dtype=bool)
        self.start_zero = np.full(L, np.nan)
        self.prev_moderate = np.zeros(L, dtype=bool)
        self.last_zero = np.full(L, np.nan)
        self.sampled_ep = EpisodeArray(L, confirm=1, release=RELEASE_SAMPLES)
        self.sum_ep = EpisodeArray(L, confirm=FULLY_DEAD_STEPS, release=RELEASE_STEPS)
        self.grad_ep = EpisodeArray(P, confirm=ZERO_GRAD_STEPS, release=RELEASE_STEPS)
        self.feeds = feeds_rectifier(ctx)
        self.grad_rule = bool((self.feeds >= 0).any())
        self.sparse_param = np.array(
            [k in ("Embedding", "EmbeddingBag") for k in ctx.param_layer_kinds], dtype=bool
        )

    def update(self, row: Row, hist: RunHistory) -> Finding | None:
        new_sampled = new_sum = new_grad = None
        if row.act_dead is not None and self.any_rectifier:
            z = row.act_dead.astype(np.float64)
            seen = np.isfinite(z) & self.rectifier
            if row.act_nonfinite is not None:
                seen &= row.act_nonfinite == 0  # a NaN batch says nothing of the units
            first = seen & np.isnan(self.start_zero)
            self.start_zero[first] = z[first]
            self.last_zero[seen] = z[seen]
            moderate = (z >= DEAD_FRACTION) & (
                (z >= SURELY_DEAD) | (z >= self.start_zero + RISE_OVER_START)
            )
            hit = (z >= AT_ONCE) | (moderate & self.prev_moderate)
            self.prev_moderate = np.where(seen, moderate, self.prev_moderate)
            hit &= seen
            if hit.any() or self.sampled_ep._busy:
                new_sampled = self.sampled_ep.update(hit, row.step, observed=seen)
        if row.act_sum is not None and self.any_rectifier:
            s = row.act_sum
            ran = self.rectifier & np.isfinite(s)
            if row.act_rows is not None:  # a layer that did not run is not dead (schema 4)
                ran &= ~(row.act_rows < MIN_DEAD_INPUTS)  # NaN: unknown, judged as before
            zero = (s == 0.0) & ran
            if zero.any() or self.sum_ep._busy:
                new_sum = self.sum_ep.update(zero, row.step, observed=ran)
        gl = row.grad_layer
        if self.grad_rule and gl.size and math.isfinite(row.grad_norm) and row.grad_norm > 0:
            zero = gl == 0.0
            if zero.any() or self.grad_ep._busy:
                seen = np.isfinite(gl) & ~self.sparse_param & (self.feeds >= 0)
                # a ReLU its sampled statistics show alive is not dead: the zero comes from after
                # it (a loss term weighted by 0, a masked output): zero_gradient_layer's to say
                fed = self.last_zero[np.maximum(self.feeds, 0)]
                seen &= ~(np.isfinite(fed) & (fed < DEAD_FRACTION))
                new_grad = self.grad_ep.update(zero & seen, row.step, observed=seen)
        if new_sampled is None and new_sum is None and new_grad is None and not self._reported:
            return None  # the usual step: nothing seen, nothing open
        dead = self.sampled_ep.active | self.sum_ep.active
        self.reported &= dead
        self.reported_grad &= self.grad_ep.active
        opened = _union(new_sampled, new_sum)
        layers = np.flatnonzero(opened & ~self.reported) if opened.size else opened.nonzero()[0]
        self.reported |= dead
        self._reported = bool(self.reported.any())
        grads = None
        if new_grad is not None:
            grads = new_grad & ~self.reported_grad
            self.reported_grad |= self.grad_ep.active
            if self.reported.any() and not layers.size:
                grads = None  # the same incident, already named at the activation
        if not layers.size and (grads is None or not grads.any()):
            return None
        return self._finding(row, layers, grads, hist.obs)

    def _finding(
        self, row: Row, layers: np.ndarray, new_grad: np.ndarray | None, obs: Observations
    ) -> Finding:
        dead_now = self.sampled_ep.active | self.sum_ep.active
        evidence: dict[str, float] = {"dead_layers": int(dead_now.sum())}
        if layers.size:
            fully, layer, summary = self._dead_units(layers, evidence)
        else:
            assert new_grad is not None
            fully, layer, summary = self._no_gradient(row, new_grad, evidence)
        summary += " Dead units pass no gradient, so they never recover on their own."
        summary += causes_sentence(obs)
        remedy = remedy_text(obs, [
            ("", "use LeakyReLU (or GELU) instead of ReLU"),
            ("", "put a norm layer (BatchNorm/LayerNorm) before the activation"),
            ("lower_lr", "lower the LR (one large update can push every pre-activation negative)"),
            ("", "check the bias init (negative biases start units dead)"),
        ], numbered=False)  # fmt: skip
        return self.report(
            row,
            "error" if fully else "warning",
            summary,
            remedy,
            evidence,
            layer=layer,
            obs=obs,
        )

    def _dead_units(self, layers: np.ndarray, evidence: dict[str, float]) -> tuple[bool, str, str]:
        """Units seen dead in the sampled outputs (or all outputs zero): (fully, layer, summary)."""
        ctx = self.ctx
        i = int(layers[0])
        zero = float(self.last_zero[i])
        fully = bool(self.sum_ep.active[i]) or (math.isfinite(zero) and zero >= 0.99)
        evidence.update(
            {
                "layer_index": i,
                "dead_unit_fraction": 1.0 if fully and not math.isfinite(zero) else zero,
                "dead_unit_fraction_at_start": float(self.start_zero[i]),
                "threshold": DEAD_FRACTION,
                "all_outputs_zero": 1.0 if fully else 0.0,
            }
        )
        layer = ctx.layer_names[i]
        if fully:
            what = f"every output of {ctx.layer_label(i)} is exactly zero"
        else:
            what = (
                f"{fmt(100 * zero)}% of the units of {ctx.layer_label(i)} are dead (zero for "
                f"every input of the batch; {fmt(100 * float(self.start_zero[i]))}% at the start)"
            )
        others = [ctx.layer_names[int(k)] for k in layers[1:4]]
        summary = what + (f"; also dead: {', '.join(others)}" if others else "") + "."
        return fully, layer, summary

    def _no_gradient(
        self, row: Row, new_grad: np.ndarray, evidence: dict[str, float]
    ) -> tuple[bool, str, str]:
        """A ReLU whose feeding layer gets exactly zero gradient: every unit inactive."""
        ctx = self.ctx
        j = int(next(k for k in ctx.param_order if new_grad[k]))
        fully = True
        i = int(self.feeds[j])
        layer = ctx.layer_names[i]
        evidence.update(
            {
                "param_layer_index": j,
                "layer_index": i,
                "grad_norm_of_layer": 0.0,
                FieldName.GRAD_NORM: row.grad_norm,
            }
        )
        summary = (
            f"{ctx.layer_label(i)} passes no gradient: {ctx.param_label(j)}, which feeds it, has "
            f"received exactly zero gradient for {ZERO_GRAD_STEPS} steps while other layers "
            "still learn, so every unit of the ReLU is inactive."
        )
        return fully, layer, summary


def _union(a: np.ndarray | None, b: np.ndarray | None) -> np.ndarray:
    if a is None:
        return b if b is not None else np.zeros(0, dtype=bool)
    return a if b is None else (a | b)


def feeds_rectifier(ctx: RunContext) -> np.ndarray:
    """For each parameter-owning layer: the watched ReLU-family layer its output goes into next
    (only parameter-free layers such as Dropout in between), or -1."""
    out = np.full(ctx.num_param_layers, -1, dtype=np.int64)
    pos = {n: i for i, n in enumerate(ctx.layer_names)}
    owners = set(ctx.param_layer_names)
    for j, name in enumerate(ctx.param_layer_names):
        i = pos.get(name)
        if i is None:
            continue
        for k in range(i + 1, ctx.num_layers):
            if ctx.layer_kinds[k] in RECTIFIER_KINDS:
                out[j] = k
                break
            if ctx.layer_names[k] in owners or ctx.layer_names[k].startswith(name + "."):
                break
    return out
