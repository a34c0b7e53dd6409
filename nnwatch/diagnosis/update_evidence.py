"""What the measured updates show: the mechanisms behind a loss that stalls or rises.

A loss curve says *that* a run does not learn; the update says *why*. Each measured update
records, per layer, the weights' norm, the norm of the change the optimizer made and the share of
elements it left unchanged, and for the run the optimizer's parameters without a gradient and the
model's parameters in no group. From those this module keeps a short, bounded memory and names a
mechanism only when the records show it:

* **updates that round away**: a quarter or more of the elements an update should move are left
  bit for bit unchanged (half-precision weights: an update under half an ulp is lost);
* **parameters without a gradient**: the optimizer holds trainable parameters that backward never
  reaches, or the model has parameters that get gradients and sit in no group;
* **weights pinned by decay**: the weights' norm has fallen to half of where the run began while
  a weight decay is set;
* **updates far too small**: each update changes the weights by less than 1e-5 of their norm
  (the classic healthy ratio is about 1e-3), with the gradient or the LR to blame;
* **updates far too large**: each update changes the weights by a third of their norm or more;
* **a broadcast in the loss**: the first step's graph shows a (B, 1) prediction against a (B,)
  target;
* and, for a loss that rises: an LR now well above the one the run was stable at, an update ratio
  ten times its stable level, weights that grow fast.

A mechanism is a fact with its number, worded once (here, or in :mod:`~nnwatch.diagnosis.mechanism`
for those judged on this memory alone); the detectors decide what it explains.
"""

from __future__ import annotations

import math
from collections import deque

import numpy as np

from nnwatch.diagnosis.context import ADAPTIVE_OPTIMIZERS, SPARSE_GRAD_KINDS, RunContext
from nnwatch.diagnosis.mechanism import (
    MIN_UPDATES,
    Mechanism,
    labels_in_order,
    loss_graph_faults,
    median,
    updates_frozen,
    weights_pinned,
)
from nnwatch.diagnosis.row import Row
from nnwatch.store.finding import fmt

RECENT = 8  # measured updates judged together
NO_GRAD_SHARE = 0.01  # 1% of the trainable elements without a gradient at the update
NO_GRAD_UPDATES = 5  # ... on this many measured updates in a row
TINY_RATIO = 1e-5  # an update under 1e-5 of the weights (healthy ~1e-3)
LARGE_RATIO = 0.3  # an update of a third of the weights' norm
#: an adaptive optimizer whose nominal step (the LR on every element) is half the weights' size
#: themselves: its measured ratio falls once most units die, its LR stays the cause
NOMINAL_RATIO = 0.5
RISE_LR = 2.0  # an LR twice the one the run was stable at
#: an update ratio ten times the run's stable one: more than an adaptive optimizer's own swing
#: (Adam's step grows about 4x when a noisy gradient turns consistent, as on new data)
RISE_RATIO = 10.0
RISE_WEIGHTS = 1.5  # weights half as large again as when the run was stable
HISTORY = 64  # measured updates kept for the stable baseline
LR_WINDOW = 32  # steps over which the LR's own swings are counted
LR_MOVE = math.log(1.25)  # an LR step of a quarter or more, up or down
LR_REVERSALS = 8  # ... going back and forth at least this often in the window


class UpdateEvidence:
    """Bounded memory of the measured updates (see the module docstring)."""

    def __init__(self) -> None:
        self.updates = 0  # measured updates seen
        self.ratio: deque[float] = deque(maxlen=RECENT)
        """The whole model's update norm over its weight norm, per recent measured update."""
        self.ratio_history: deque[tuple[int, float]] = deque(maxlen=HISTORY)
        self.frozen: deque[float] = deque(maxlen=RECENT)
        self.no_grad: deque[float] = deque(maxlen=RECENT)
        self.no_grad_run = 0
        self.unoptimized: deque[float] = deque(maxlen=RECENT)
        self.unoptimized_run = 0
        self.weight_start = math.nan
        self.weight = math.nan
        self.weights: deque[tuple[int, float]] = deque(maxlen=HISTORY)
        self.grad_ratio: deque[float] = deque(maxlen=RECENT)
        """The global gradient norm over the weights' norm, per recent measured update."""
        self.lr_at: deque[tuple[int, float]] = deque(maxlen=HISTORY)
        self.layer_ratio: np.ndarray | None = None
        #: per recent measured batch of a classifier: (label entropy, mean, variance)
        self.labels: deque[tuple[float, float, float]] = deque(maxlen=16)
        self.batch = math.nan  # samples per batch (last seen)
        self._mix: tuple[int | None, Mechanism | None] | None = None  # label_mix, until a batch
        self._dense: np.ndarray | None = None
        #: per parameter layer: its own watched output (to see whether it ran), or -1
        self._output_of: np.ndarray | None = None
        #: measured steps in a row on which some layer ran and got no gradient at all
        self.ran_without_grad = 0
        #: per recent step: +1 / -1 when the LR moved up / down by LR_MOVE or more, else 0
        self.lr_moves: deque[int] = deque(maxlen=LR_WINDOW)
        self._lr_prev = math.nan
        self._lr_seen: deque[float] = deque(maxlen=LR_WINDOW)

    def configure(self, ctx: RunContext) -> None:
        """Embeddings update only the rows a batch looks up: the model's ratio leaves them out."""
        kinds = ctx.param_layer_kinds
        dense = np.array([k not in SPARSE_GRAD_KINDS for k in kinds], dtype=bool)
        self._dense = dense if dense.any() else None
        pos = {n: i for i, n in enumerate(ctx.layer_names)}
        self._output_of = np.array([pos.get(n, -1) for n in ctx.param_layer_names], dtype=np.int64)

    # -- feeding -----------------------------------------------------------------------------------
    def _see_layers(self, row: Row) -> None:
        """Count the measured steps on which a layer that ran got no gradient at all (a layer
        that did not run, like a mixture's expert no token chose, is not expected to)."""
        gl, rows, out = row.grad_layer, row.act_rows, self._output_of
        if not row.measured or not gl.size or out is None or out.shape != gl.shape:
            return
        if not (math.isfinite(row.grad_norm) and row.grad_norm > 0):
            return
        ran = np.ones(gl.shape, dtype=bool)
        if rows is not None and rows.size:
            own = out >= 0
            ran[own] = rows[out[own]] != 0  # NaN: unknown, counted as ran
        hit = bool((np.isnan(gl) & ran).any())
        self.ran_without_grad = self.ran_without_grad + 1 if hit else 0

    def push(self, row: Row) -> None:
        self._see_layers(row)
        lr, prev = row.lr0, self._lr_prev
        if math.isfinite(lr) and lr > 0:
            if math.isfinite(prev) and prev > 0:
                step = math.log(lr / prev)
                self.lr_moves.append(0 if abs(step) < LR_MOVE else (1 if step > 0 else -1))
            self._lr_prev = lr
            self._lr_seen.append(lr)
        if math.isfinite(row.label_entropy) and math.isfinite(row.label_var):
            self.labels.append((row.label_entropy, row.label_mean, row.label_var))
            self.batch = row.batch_size
            self._mix = None
        # the shares come with every measured step, an update sampled or not (an optimizer that
        # holds only frozen parameters samples nothing)
        self.no_grad_run = _run(self.no_grad, row.params_no_grad, self.no_grad_run)
        self.unoptimized_run = _run(self.unoptimized, row.params_unoptimized, self.unoptimized_run)
        if row.update_layer is None or row.weight_layer is None:
            return
        self.updates += 1
        upd = row.update_layer.astype(np.float64)
        wt = row.weight_layer.astype(np.float64)
        ok = np.isfinite(upd) & np.isfinite(wt) & (wt > 0)
        if self._dense is not None and self._dense.shape == ok.shape and (ok & self._dense).any():
            ok &= self._dense
        if ok.any():
            w = math.sqrt(float(np.sum(wt[ok] ** 2)))
            ratio = math.sqrt(float(np.sum(upd[ok] ** 2))) / w
            self.ratio.append(ratio)
            self.ratio_history.append((row.step, ratio))
            with np.errstate(divide="ignore", invalid="ignore"):
                self.layer_ratio = np.where(ok, upd / np.where(wt > 0, wt, np.nan), np.nan)
            if not math.isfinite(self.weight_start):
                self.weight_start = w
            self.weight = w
            self.weights.append((row.step, w))
            g = row.grad_norm
            if math.isfinite(g) and w > 0:
                self.grad_ratio.append(g / w)
            if math.isfinite(row.lr0):
                self.lr_at.append((row.step, row.lr0))
        if math.isfinite(row.update_frozen):
            self.frozen.append(row.update_frozen)

    # -- what the recent updates show ------------------------------------------------------------
    @property
    def ready(self) -> bool:
        return self.updates >= MIN_UPDATES and len(self.ratio) >= MIN_UPDATES

    def recent_ratio(self) -> float:
        return median(self.ratio)

    def stall(self, ctx: RunContext, lr: float) -> list[Mechanism]:
        """The mechanisms that explain a loss that does not fall, the most certain first."""
        found = self._missing_gradients()
        if found is None and ctx.loss_broadcast:
            found = Mechanism(
                "loss_broadcast",
                f"the loss broadcasts: {ctx.loss_broadcast}, so every prediction is pulled toward "
                "the mean of the batch's targets and the model can learn only that mean",
                "give the prediction and the target the same shape (pred.squeeze(-1) against a "
                "(B,) target, or y.view(-1, 1)); torch's mse_loss warns about this mismatch",
            )
        out: list[Mechanism | None] = [found, *loss_graph_faults(ctx)]
        if self.ready:
            # a huge LR kills units, after which the measured updates are tiny: large first
            rounded = updates_frozen(self.frozen, ctx)
            pinned = weights_pinned(self.weight_start, self.weight, ctx)
            out += [rounded, pinned, self._large(lr, ctx), self._tiny(lr)]
        return [m for m in out if m is not None]

    def _missing_gradients(self) -> Mechanism | None:
        if self.no_grad_run >= NO_GRAD_UPDATES and self.ran_without_grad >= NO_GRAD_UPDATES:
            share = median(self.no_grad)
            return Mechanism(
                "params_without_grad",
                f"{fmt(100 * share)}% of the trainable parameters the optimizer holds have never "
                f"had a gradient at a measured update, though their layers run (the last "
                f"{self.ran_without_grad} measured steps): backward never reaches them, so they "
                "never change",
                "make sure the forward pass uses those parameters themselves (not .data, a "
                ".detach()ed copy or a tensor rebuilt from them each step), or freeze them "
                "with requires_grad_(False) if they are meant to stay fixed",
                {"share_without_grad": share},
            )
        if self.unoptimized_run >= NO_GRAD_UPDATES:
            share = median(self.unoptimized)
            return Mechanism(
                "params_not_in_optimizer",
                f"{fmt(100 * share)}% of the model's parameters get gradients but are in no "
                "parameter group of the optimizer: nothing ever updates them",
                "build the optimizer from model.parameters() after the model is complete (a "
                "module added or replaced after the optimizer was made is left out), or "
                "add_param_group() for the new parameters",
                {"share_not_in_optimizer": share},
            )
        return None

    def _tiny(self, lr: float) -> Mechanism | None:
        ratio = self.recent_ratio()
        if not ratio < TINY_RATIO or self._lr_rising(lr):
            return None  # a warmup from a tiny LR is not a stall: its updates grow by design
        g = median(self.grad_ratio)
        ev = {"update_to_weight_ratio": ratio, "grad_to_weight_ratio": g, "lr": lr}
        if math.isfinite(g) and g < TINY_RATIO and not (math.isfinite(lr) and lr * g >= ratio * 10):
            return Mechanism(
                "gradient_too_small",
                f"each update changes the weights by {fmt(ratio)} of their norm (healthy is "
                f"about 1e-3) because the gradient itself is tiny ({fmt(g)} of the weights' "
                "norm)",
                "check how the loss is scaled: divided by a large constant, multiplied by a tiny "
                "weight, or summed where it should be averaged the other way; then the LR",
                ev,
            )
        return Mechanism(
            "updates_too_small",
            f"each update changes the weights by {fmt(ratio)} of their norm (healthy is about "
            "1e-3): the LR" + (f" ({fmt(lr)})" if math.isfinite(lr) else "") + " is far too small",
            "raise the LR by 100x or more, or run the LR range test (nnwatch check MODULE:FACTORY)",
            ev,
        )

    def _lr_rising(self, lr: float) -> bool:
        """The LR is above the one of the oldest recent measured update by half (a warmup)."""
        recent = [x for _, x in self.lr_at][-RECENT:]
        return bool(recent) and math.isfinite(lr) and lr > 1.5 * recent[0]

    def _large(self, lr: float, ctx: RunContext) -> Mechanism | None:
        ratio = self.recent_ratio()
        nominal = _adaptive_step(lr, ctx)
        at = f" ({fmt(lr)})" if math.isfinite(lr) else ""
        remedy = (
            f"lower the LR{at} by 10-100x, or run the LR range test (nnwatch check MODULE:FACTORY)"
        )
        if ratio >= LARGE_RATIO:
            return Mechanism(
                "updates_too_large",
                f"each update changes the weights by {fmt(ratio)} of their norm (healthy is about "
                f"1e-3): the LR{at} is far too high, so every step overshoots what the last one "
                "learned",
                remedy, {"update_to_weight_ratio": ratio, "lr": lr},
            )  # fmt: skip
        if not nominal >= NOMINAL_RATIO:
            return None
        rms = ctx.param_norm / math.sqrt(ctx.total_numel)
        return Mechanism(  # judged only on a run that learned nothing: weights may grow into it
            "adaptive_step_too_large",
            f"{ctx.optimizer} moves every weight by about the LR{at} on each step, "
            f"{fmt(nominal)} of the weights' typical size ({fmt(rms)}): far too high for it, "
            "so the units it throws into dead or saturated ranges stop learning (its measured "
            f"updates are now {fmt(ratio)} of the weights)",
            remedy, {"update_to_weight_ratio": ratio, "nominal_update_ratio": nominal, "lr": lr},
        )  # fmt: skip

    def backs_rise(self, row: Row, since: int) -> bool | None:
        """Did the updates grow with a rise that began at ``since``? True: the update ratio rose
        several-fold, the LR rose, or the weights grew; False: updates were measured since and
        stayed their usual size; None: none was measured since (unknown)."""
        if self.rise(since, row.lr0) is not None:
            return True
        then = median([r for s, r in self.ratio_history if s < since][-RECENT:])
        now = _row_ratio(row, self._dense)
        if math.isfinite(now) and then > 0:
            return now >= RISE_RATIO * then
        measured = any(s >= since for s, _ in self.ratio_history)
        return False if measured else None

    def rise(self, since: int, lr: float) -> Mechanism | None:
        """What in the updates backs a loss that has risen since step ``since``: an LR now well
        above the one before, an update ratio several times its earlier level, growing weights."""
        before = [lr0 for s, lr0 in self.lr_at if s < since]
        lr_then = median(before[-RECENT:])
        if math.isfinite(lr) and lr_then > 0 and lr >= RISE_LR * lr_then:
            return Mechanism(
                "lr_rose",
                f"the LR rose from {fmt(lr_then)} to {fmt(lr)} ({fmt(lr / lr_then)}x) since the "
                "run was stable",
                "cap the schedule's LR (a warmup written without min(1, ...) keeps growing), or "
                "lower its peak",
                {"lr_before": lr_then, "lr": lr},
            )
        then = median([r for s, r in self.ratio_history if s < since][-RECENT:])
        now = median([r for s, r in self.ratio_history if s >= since])
        if then > 0 and now >= RISE_RATIO * then:
            return Mechanism(
                "update_ratio_rose",
                f"each update now changes the weights by {fmt(now)} of their norm, "
                f"{fmt(now / then)}x what it did while the run was stable ({fmt(then)})",
                "lower the LR" + (f" (now {fmt(lr)})" if math.isfinite(lr) else "") + " by 10x, "
                "or clip the gradients",
                {"update_ratio_before": then, "update_ratio_now": now},
            )
        w_then = median([w for s, w in self.weights if s < since][-RECENT:])
        w_now = self.weight
        if w_then > 0 and w_now >= RISE_WEIGHTS * w_then:
            return Mechanism(
                "weights_grow",
                f"the weights grew from norm {fmt(w_then)} to {fmt(w_now)} "
                f"({fmt(w_now / w_then)}x) while the loss rose",
                "lower the LR" + (f" (now {fmt(lr)})" if math.isfinite(lr) else "") + " by 10x; "
                "if the update's sign may be wrong (a hand-written step, a custom backward), "
                "check that it descends the gradient",
                {"weight_norm_before": w_then, "weight_norm_now": w_now},
            )
        return None

    def lr_swings(self) -> Mechanism | None:
        """A schedule that moves the LR up and down by a quarter or more on most steps: one
        stepping far faster than meant. Designed schedules move it a few percent a step, jump
        rarely (a decay step, a restart) or, in a short warmup, climb steeply one way only."""
        moved = [m for m in self.lr_moves if m]
        moves = len(moved)
        if len(self.lr_moves) < LR_WINDOW or moves < LR_WINDOW // 2:
            return None
        reversals = sum(1 for a, b in zip(moved, moved[1:], strict=False) if a != b)
        if reversals < LR_REVERSALS:
            return None
        lo, hi = min(self._lr_seen), max(self._lr_seen)
        return Mechanism(
            "lr_swings",
            f"the LR changes by a quarter or more on {moves} of the last {LR_WINDOW} steps "
            f"(between {fmt(lo)} and {fmt(hi)}): a schedule stepping far faster than meant",
            "step the scheduler as it was designed: a CyclicLR's step_size_up and a OneCycleLR's "
            "total_steps count iterations, not epochs (2-10 epochs' worth of batches for a "
            "cycle), and a per-epoch schedule is stepped once per epoch",
            {"lr_low": lo, "lr_high": hi, "lr_moves": float(moves)},
        )

    def label_mix(self, k: int | None) -> Mechanism | None:
        """Batches that each hold a few of the classes: data in label order, never shuffled.

        Shuffled batches carry nearly all of the labels' variance within each batch (the batch
        means vary by about 1/B of it, whatever the classes' balance); in label order nearly
        all of it lies between the batches."""
        if self._mix is not None and self._mix[0] == k:
            return self._mix[1]
        found = labels_in_order(self.labels, self.batch, k)
        self._mix = (k, found)
        return found


def _adaptive_step(lr: float, ctx: RunContext) -> float:
    """An adaptive optimizer's nominal update over the weights: it moves every element by
    about the LR, so LR x sqrt(#elements) / ||w|| (NaN for others, or when unknown)."""
    if ctx.optimizer not in ADAPTIVE_OPTIMIZERS or not (ctx.param_norm > 0 and ctx.total_numel):
        return math.nan
    return lr * math.sqrt(ctx.total_numel) / ctx.param_norm if math.isfinite(lr) else math.nan


def _row_ratio(row: Row, dense: np.ndarray | None) -> float:
    """The whole model's update ratio on ``row`` (NaN when it has no measured update)."""
    if row.update_layer is None or row.weight_layer is None:
        return math.nan
    upd, wt = row.update_layer.astype(np.float64), row.weight_layer.astype(np.float64)
    ok = np.isfinite(upd) & np.isfinite(wt) & (wt > 0)
    if dense is not None and dense.shape == ok.shape and (ok & dense).any():
        ok &= dense
    if not ok.any():
        return math.nan
    return math.sqrt(float(np.sum(upd[ok] ** 2))) / math.sqrt(float(np.sum(wt[ok] ** 2)))


def _run(values: deque[float], share: float, run: int) -> int:
    """Append ``share`` and count the measured updates in a row at or above NO_GRAD_SHARE."""
    if not math.isfinite(share):
        return run
    values.append(share)
    return run + 1 if share >= NO_GRAD_SHARE else 0


