"""A layer that learns nothing while the rest of the model learns: zero or no gradient, named for what it is.

Two signals the probe records on every measured step, per parameter-owning layer:

* exactly 0.0: backward reaches the layer but everything it feeds passes no gradient back (a
  functional relu or clamp with every unit inactive, an output multiplied by zero or masked out,
  saturated gates). When the layer feeds a ReLU-family module, ``dead_relu`` reports the ReLU;
* NaN ("absent") on a step whose other layers have a gradient: backward never reaches the layer
  (it is not used in forward, or its output is detached before the loss).

Only measured steps count (a NaN on a step the cost budget skipped means "not measured"), never
embeddings (whose gradient is sparse by design), and only while the global norm is positive (an
all-zero step is ``vanishing_gradients``' or ``clipping_misuse``'s). Zero needs 3 measured steps
in a row; absent needs 5 (measured steps can be far apart), since a model may skip a branch now and then.
A layer that did not run in the step's forward (a mixture's expert that no token was routed to,
a branch not taken) is not expected to have a gradient: absent counts only on steps where its
output was seen (where nnwatch watches the layer's output), and a layer feeding a ReLU is judged
on absence too (a dead ReLU gives zeros, never no gradient at all).

Where the layer sits says how sure this is. Gradient blocked on the way to layers that still
learn after it (in forward order: an encoder behind a ``round``, a branch detached) is a fault; a
layer after every layer that learns is an output branch whose loss term passes nothing back
(a loss weight not yet switched on, an auxiliary head, a head the loss does not use), which a
recipe may mean: a note, made a warning when it lasts ``OUTPUT_PATIENCE`` steps.
"""

from __future__ import annotations

import math

import numpy as np

from nnwatch.diagnosis.context import SPARSE_GRAD_KINDS, RunContext
from nnwatch.diagnosis.detectors.base import Detector
from nnwatch.diagnosis.detectors.dead_relu import feeds_rectifier
from nnwatch.diagnosis.episode import EpisodeArray
from nnwatch.diagnosis.history import RunHistory
from nnwatch.diagnosis.row import Row
from nnwatch.store.finding import Finding
from nnwatch.store.schema import FieldName

ZERO_STEPS = 3
ABSENT_STEPS = 5
RELEASE = 20
OUTPUT_PATIENCE = 200  # steps an output branch may get no gradient before it is a warning
RECURRENT_KINDS = frozenset({"LSTM", "GRU", "RNN", "LSTMCell", "GRUCell", "RNNCell"})


class ZeroGradientLayerDetector(Detector):
    kind = "zero_gradient_layer"

    def __init__(self, ctx: RunContext) -> None:
        super().__init__(ctx)
        P = ctx.num_param_layers
        sparse = np.array([k in SPARSE_GRAD_KINDS for k in ctx.param_layer_kinds], dtype=bool)
        self.eligible = ~sparse & (feeds_rectifier(ctx) < 0)
        self.absent_eligible = ~sparse
        pos = {n: i for i, n in enumerate(ctx.layer_names)}
        #: for each parameter layer, its own watched output (to see whether it ran), or -1
        self.output_of = np.array([pos.get(n, -1) for n in ctx.param_layer_names], dtype=np.int64)
        self.zero_ep = EpisodeArray(P, confirm=ZERO_STEPS, release=RELEASE)
        self.absent_ep = EpisodeArray(P, confirm=ABSENT_STEPS, release=RELEASE)
        self.on = P >= 2 and bool(self.absent_eligible.any())
        self.noted: dict[int, tuple[int, bool]] = {}  # output branches noted: (first step, absent)

    def update(self, row: Row, hist: RunHistory) -> Finding | None:
        gl = row.grad_layer
        g = row.grad_norm
        if not self.on or not row.measured or not (math.isfinite(g) and g > 0) or not gl.size:
            return None
        finite = np.isfinite(gl)
        if not (finite & (gl > 0)).any():
            return None
        zero = (gl == 0.0) & self.eligible
        ran = self._ran(row)
        absent = np.isnan(gl) & self.absent_eligible & ran
        new_zero = self.zero_ep.update(zero, row.step, observed=self.eligible)
        new_absent = self.absent_ep.update(absent, row.step, observed=self.absent_eligible & ran)
        if not (new_zero.any() or new_absent.any()):
            return self._still_noted(row) if self.noted else None  # the usual step
        for j in self.ctx.param_order:
            if new_zero[j] or new_absent[j]:
                absent = bool(new_absent[j] and not new_zero[j])
                if self._output_branch(row, int(j)):
                    self.noted[int(j)] = (row.step, absent)
                    return self._finding(row, int(j), absent=absent, note=True)
                return self._finding(row, int(j), absent=absent)
        return None

    def _output_branch(self, row: Row, j: int) -> bool:
        """No layer after ``j`` in forward order gets a gradient: ``j`` ends the model's forward."""
        order = [int(k) for k in self.ctx.param_order]
        after = order[order.index(j) + 1 :] if j in order else []
        gl = row.grad_layer
        return not any(math.isfinite(float(gl[k])) and gl[k] > 0 for k in after)

    def _still_noted(self, row: Row) -> Finding | None:
        """An output branch noted earlier that still gets nothing after ``OUTPUT_PATIENCE``
        steps: a warning now; one whose episode closed is forgotten."""
        gl = row.grad_layer
        for j, (first, absent) in list(self.noted.items()):
            open_now = self.absent_ep.active[j] if absent else self.zero_ep.active[j]
            learns = row.measured and gl.size > j and math.isfinite(float(gl[j])) and gl[j] > 0
            if not open_now or learns:  # its loss term came on (or the episode ended)
                del self.noted[j]
            elif row.step - first >= OUTPUT_PATIENCE:
                del self.noted[j]
                return self._finding(row, j, absent=absent, lasted=True)
        return None

    def _ran(self, row: Row) -> np.ndarray:
        """Per parameter layer: did it run in this step's forward? From the rows its output had
        (schema 4), else its output sum (a layer not called sums to exactly 0 on a measured
        step); unknown counts as yes."""
        seen = row.act_rows if row.act_rows is not None else row.act_sum
        out = np.ones(self.output_of.shape, dtype=bool)
        if seen is None or not seen.size:
            return out
        own = self.output_of >= 0
        idx = np.where(own, self.output_of, 0)
        out[own] = seen[idx[own]] != 0.0
        return out

    def _finding(
        self, row: Row, j: int, absent: bool, note: bool = False, lasted: bool = False
    ) -> Finding:
        ctx = self.ctx
        label = ctx.param_label(j)
        kind = ctx.param_layer_kinds[j]
        learning = int(np.sum(np.isfinite(row.grad_layer) & (row.grad_layer > 0)))
        evidence = {
            "param_layer_index": j,
            "grad_norm_of_layer": math.nan if absent else 0.0,
            "layers_with_gradient": learning,
            FieldName.GRAD_NORM: row.grad_norm,
            "steps": ABSENT_STEPS if absent else ZERO_STEPS,
        }
        if absent:
            summary = (
                f"{label} has had no gradient at all for {ABSENT_STEPS} measured steps while "
                f"{learning} other layer(s) learn: backward never reaches it."
            )
            remedy = (
                "check, in this order: 1) is it used in forward() at all (a layer defined but never "
                "called, or a branch that is skipped)? 2) is its output detached before the loss "
                "(.detach(), .data, .item(), torch.no_grad())? 3) if it is meant to stay frozen, call "
                "requires_grad_(False) on it so that it is not trained by mistake later"
            )
        else:
            summary = (
                f"{label} has received exactly zero gradient for {ZERO_STEPS} measured steps while "
                f"{learning} other layer(s) learn: everything its output goes through passes no "
                "gradient back."
            )
            first = (
                "its gates are saturated (its weights grew too large: lower the LR and clip gradients)"
                if kind in RECURRENT_KINDS
                else "a functional relu/clamp/threshold right after it has every unit inactive "
                "(its bias or inputs push them all negative: use leaky_relu, check the bias init)"
            )
            remedy = (
                f"check, in this order: 1) {first}; 2) its output is multiplied by zero or masked "
                "out (a mask of zeros, torch.where picking the other branch); 3) a saturated "
                "tanh/sigmoid after it"
            )
        if note:
            summary += (
                " It comes after every layer that learns: an output branch whose loss term passes "
                "nothing back (a loss weight of 0 not yet switched on, an auxiliary head, a head "
                "the loss does not use). A note for now: a warning if it lasts "
                f"{OUTPUT_PATIENCE} steps."
            )
        elif lasted:
            summary += f" It has lasted {OUTPUT_PATIENCE} steps or more."
        return self.report(
            row,
            "info" if note else "warning",
            summary,
            remedy,
            evidence,
            layer=ctx.param_layer_names[j],
            onset_step=int(self.absent_ep.first_hit[j] if absent else self.zero_ep.first_hit[j]),
        )
