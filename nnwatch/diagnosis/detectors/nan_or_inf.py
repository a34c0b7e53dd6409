"""NaN or Inf in the loss, a layer's output or the gradients, traced to where it first appeared.

Without anomaly mode (1.3-3.4x slower) the origin is found from what the probe already records
every step: the float32 sum of each layer's output (a single NaN or Inf makes it non-finite) in
forward order, and each parameter-owning layer's gradient norm (+Inf when its gradient held NaN or
Inf). Forward origin: the first module, in forward order, whose output holds non-finite values.
Backward origin: the first parameter-owning module the backward pass reached with non-finite
gradients, i.e. the one closest to the output.

Under AMP a non-finite gradient alone is the GradScaler's business (it skips the step and lowers
its scale); ``amp_scale_collapse`` watches whether that keeps happening.

An infinite global norm with every layer's norm finite is not a non-finite element: the norm's
float32 sum of squares overflowed (torch's ``clip_grad_norm_`` returns inf for it too, and scales
the gradients to zero). That is said as such, with the largest finite element when the guard saw
it. The probe's own norms are summed in float64, and the loss is kept as a float64, so a finite
float64 value is never called non-finite.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import NamedTuple

import numpy as np

from nnwatch.diagnosis.context import RunContext
from nnwatch.diagnosis.detectors.base import Detector
from nnwatch.diagnosis.episode import Episode
from nnwatch.diagnosis.history import RunHistory, finite_median
from nnwatch.diagnosis.row import Row
from nnwatch.store.finding import Finding, fmt
from nnwatch.store.schema import FieldName

#: Clean steps after which a new NaN counts as a new episode.
RELEASE_STEPS = 50
#: A gradient norm this many times its usual value just before the NaN means the NaN came from
#: an explosion, not from an invalid operation.
EXPLOSION_FACTOR = 10.0
#: A last finite loss this many times above where the run started: the NaN ends a divergence.
DIVERGED_FACTOR = 10.0


class NanOrInfDetector(Detector):
    kind = "nan_or_inf"

    def __init__(self, ctx: RunContext) -> None:
        super().__init__(ctx)
        self.episode = Episode(confirm=1, release=RELEASE_STEPS)

    def update(self, row: Row, hist: RunHistory) -> Finding | None:
        if self.episode.active and row.step <= self.episode.opened_at:
            return None  # the guard already reported this step, from the training thread
        loss_bad = math.isinf(row.loss) or (math.isnan(row.loss) and hist.loss_seen)
        a = row.act_sum
        # one sum is the cheap test (NaN/Inf propagate); only then look element by element
        act_bad = (
            a is not None and not math.isfinite(float(a.sum())) and not bool(np.isfinite(a).all())
        )
        grad_bad = (
            row.nonfinite_grads == 1.0
        )  # set from the total norm: any bad layer makes it Inf/NaN
        if math.isnan(row.nonfinite_grads) and row.grad_layer.size:
            grad_bad = bool((row.grad_layer == np.inf).any())
        if grad_bad and not (loss_bad or act_bad) and math.isfinite(row.amp_scale):
            grad_bad = False  # the scaler skips such steps by design
        if not self.episode.update(loss_bad or act_bad or grad_bad, row.step):
            return None
        if not (loss_bad or act_bad) and _overflow_only(row.act_sum, row.grad_layer, row.loss):
            return self._overflow(row.step, row.grad_layer, row.grad_norm, math.nan, hist)
        return self.describe(
            row.step, row.act_sum, row.grad_layer, row.loss, row.grad_norm, hist, source="record"
        )

    def on_guard(
        self,
        step: int,
        act_sum: np.ndarray | None,
        grad_layer: np.ndarray | None,
        hist: RunHistory,
        grad_max: float = math.nan,
    ) -> Finding | None:
        """The guard saw non-finite gradients before ``optimizer.step()``: report it right away."""
        if not self.episode.open_now(step):
            return None
        if _overflow_only(act_sum, grad_layer, math.nan):
            return self._overflow(step, grad_layer, math.inf, grad_max, hist)
        return self.describe(step, act_sum, grad_layer, math.nan, math.inf, hist, source="guard")

    def _overflow(
        self, step: int, grad_layer: np.ndarray | None, grad_norm: float, grad_max: float,
        hist: RunHistory,
    ) -> Finding:
        """The global norm overflowed float32 while every gradient element was finite."""
        ctx = self.ctx
        gl = np.zeros(0) if grad_layer is None else grad_layer.astype(np.float64)
        j = int(np.nanargmax(gl)) if gl.size and np.isfinite(gl).any() else -1
        biggest = f"; the largest layer norm is {fmt(float(gl[j]))} in {ctx.param_label(j)}" if j >= 0 else ""
        element = f" (the largest is {fmt(grad_max)})" if math.isfinite(grad_max) else ""
        usual = finite_median(hist.log_grad.values(100))
        return Finding(
            kind=self.kind,
            severity="error",
            step=step,
            summary=(
                "the gradients' global norm overflowed float32: every gradient element is "
                f"finite{element}{biggest}, but their sum of squares passed 3.4e38, so the norm "
                "reads inf (torch's clip_grad_norm_ returns inf for it too, and scales every "
                "gradient to zero). The gradients have exploded"
                + (f" from a usual norm of {fmt(10**usual)}" if math.isfinite(usual) else "")
                + "."
            ),
            remedy=(
                "lower the LR and clip gradients from the start, before they grow this far; "
                "look for what drives them up (a loss multiplied by a huge factor, an LR "
                "schedule, unnormalized inputs or targets)"
            ),
            layer=ctx.param_layer_names[j] if j >= 0 else None,
            evidence={FieldName.GRAD_NORM: grad_norm, "largest_grad_element": grad_max,
                      "largest_layer_norm": float(gl[j]) if j >= 0 else math.nan},
            onset_step=step,
        )

    # ------------------------------------------------------------------------------------------
    def describe(
        self,
        step: int,
        act_sum: np.ndarray | None,
        grad_layer: np.ndarray | None,
        loss: float,
        grad_norm: float,
        hist: RunHistory,
        source: str,
    ) -> Finding:
        ctx = self.ctx
        fwd, bwd, n_bad_grad = self._first_bad(act_sum, grad_layer)
        b = _Before.of(hist)
        evidence: dict[str, float] = {
            FieldName.GRAD_NORM: grad_norm,
            "forward_layer_index": -1 if fwd is None else fwd,
            "backward_layer_index": -1 if bwd is None else bwd,
            "nonfinite_grad_layers": n_bad_grad,
            "grad_norm_growth_before": b.growth,
            "from_guard": 1.0 if source == "guard" else 0.0,
            **({} if source == "guard" else {"loss": loss}),  # the guard runs before w.step() has it
            "loss_at_start": b.start,
            "last_finite_loss": b.before,
        }
        suspects = (ctx.unwatched_before or {}).get(fwd, ()) if fwd is not None else ()
        where = self._where(fwd, bwd, n_bad_grad, suspects, loss)
        layer = (
            ctx.layer_names[fwd]
            if fwd is not None
            else (ctx.param_layer_names[bwd] if bwd is not None else None)
        )
        remedy = self._remedy(fwd, act_sum, suspects, b)
        remedy += "; run `nnwatch replay SNAPSHOT --anomaly` for the exact op and line"
        what = "the loss" if math.isnan(loss) or math.isinf(loss) else "the gradients"
        if source == "guard":
            what = (
                "the gradients (caught by the guard before optimizer.step(), weights still clean)"
            )
        summary = f"NaN/Inf in {what}; " + "; ".join(where) + "."
        return Finding(
            kind=self.kind,
            severity="critical",
            step=step,
            summary=summary,
            remedy=remedy,
            layer=layer,
            evidence=evidence,
            onset_step=step,
        )

    def _first_bad(
        self, act_sum: np.ndarray | None, grad_layer: np.ndarray | None
    ) -> tuple[int | None, int | None, int]:
        """The first layer whose output is non-finite (forward), the first parameter layer from
        the output side whose gradient is (backward), and how many gradients are."""
        fwd = None
        if act_sum is not None and act_sum.size:
            bad = np.flatnonzero(~np.isfinite(act_sum))
            fwd = int(bad[0]) if bad.size else None
        bwd = None
        n_bad_grad = 0
        if grad_layer is not None and grad_layer.size:
            bad_g = grad_layer == np.inf
            n_bad_grad = int(bad_g.sum())
            for j in self.ctx.param_order[::-1]:  # output side first: where backward starts
                if bad_g[j]:
                    bwd = int(j)
                    break
        return fwd, bwd, n_bad_grad

    def _where(
        self, fwd: int | None, bwd: int | None, n_bad_grad: int, suspects: Sequence[str], loss: float
    ) -> list[str]:
        """Where the NaN/Inf appeared, in the forward pass and in the backward."""
        ctx = self.ctx
        where: list[str] = []
        if fwd is not None:
            where.append(
                f"forward: first non-finite output in {ctx.layer_label(fwd)}"
                + (
                    f" (its input comes through {', '.join(suspects)}, which nnwatch does not hook)"
                    if suspects
                    else ""
                )
            )
        elif math.isnan(loss) or math.isinf(loss):
            where.append(
                "forward: every watched layer's output was finite, so the loss computation made it"
            )
        if bwd is not None:
            where.append(
                f"backward: first non-finite gradient in {ctx.param_label(bwd)}"
                + (f" ({n_bad_grad} of {ctx.num_param_layers} layers)" if n_bad_grad > 1 else "")
            )
        return where

    def _remedy(
        self, fwd: int | None, act_sum: np.ndarray | None, suspects: Sequence[str], b: _Before
    ) -> str:
        """The fix, by what the steps before show (a divergence, a growing norm) or else by where."""
        ctx = self.ctx
        if b.diverged:
            return (
                f"the loss had already climbed from {fmt(b.start)} to {fmt(b.before)} before the "
                "NaN/Inf: the run diverged and the values overflowed; lower the LR by 10x and clip "
                "gradients (torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0))"
            )
        if b.exploded:
            return (
                f"the gradient norm was {fmt(b.growth)}x its usual value just before: clip gradients at "
                f"{fmt(2 * 10**b.usual)} (about 2x the usual norm) and lower the LR"
            )
        if fwd is None and act_sum is not None:
            return (
                "outputs were finite but the loss or its gradient was not: add an epsilon to the log "
                "(torch.log(p + 1e-8)), use log_softmax / F.cross_entropy on logits instead of "
                "log(softmax), and guard divisions and sqrt"
            )
        if suspects and fwd is not None:
            return (
                f"{suspects[0]} or {ctx.layer_names[fwd]} turned finite inputs into NaN/Inf: look for log, "
                "sqrt, exp, division or pow there and add an epsilon or a clamp"
            )
        if fwd == 0:
            return (
                "the first layer's output was already non-finite: check the input batch for NaN/Inf "
                "(the snapshot keeps it) and normalize the inputs"
            )
        if fwd is not None:
            return (
                f"{ctx.layer_names[fwd]} turned finite inputs into NaN/Inf: look for log, sqrt, exp, "
                "division or pow in it and add an epsilon or a clamp; lower the LR if its weights grew"
            )
        return "add an epsilon to logs and divisions in the loss, lower the LR, and clip gradients"


class _Before(NamedTuple):
    """What the steps before the NaN/Inf show: a gradient norm that grew, a loss that climbed."""

    usual: float
    growth: float
    exploded: bool
    start: float
    before: float
    diverged: bool

    @classmethod
    def of(cls, hist: RunHistory) -> _Before:
        usual = finite_median(hist.log_grad.values(100))
        last = hist.log_grad.last()
        growth = 10 ** (last - usual) if math.isfinite(last) and math.isfinite(usual) else math.nan
        exploded = math.isfinite(growth) and growth >= EXPLOSION_FACTOR
        start, before = hist.start_loss, hist.loss.last()
        diverged = (
            math.isfinite(start)
            and math.isfinite(before)
            and before - start > DIVERGED_FACTOR * max(abs(start), 1e-12)
        )
        return cls(usual, growth, exploded, start, before, diverged)


def _overflow_only(act_sum: np.ndarray | None, grad_layer: np.ndarray | None, loss: float) -> bool:
    """Every layer's gradient norm is known and finite (and so are the outputs and the loss, where
    known): an infinite global norm is then an overflow of its float32 sum, not a bad element."""
    if grad_layer is None or not grad_layer.size:
        return False
    known = grad_layer[~np.isnan(grad_layer)]
    if not known.size or not np.isfinite(known).all():
        return False
    if act_sum is not None and act_sum.size and not np.isfinite(act_sum).all():
        return False
    return not math.isinf(loss)
