"""Bad initial loss: before training, a K-class classifier should score about ln(K).

A fresh classifier is unsure of everything, so its cross-entropy starts near -ln(1/K) = ln(K). The
first recorded loss is compared with it once (skipped when ``num_classes`` was not given, when the
optimizer already held state at ``watch()`` time: a resumed run has trained, and when the first
loss's graph shows it is not a plain cross-entropy: ``RunContext.loss_form``). With
gradient accumulation over k micro-batches the loss handed to ``w.step()`` is usually the last
micro-batch's loss divided by k: a low first loss that is healthy times k is that, not a leak. A
healthy init lands within a few tenths; the rule allows ``max(0.75, 0.5 ln K)`` above (default
inits give logits with some spread) and half of ln K below. The evidence then points at the most
likely cause: a loss that is ~batch-size x ln K sums instead of averaging, a huge first-layer output
means unnormalized inputs, huge logits mean a badly scaled last layer. A first loss near ln 2 with
K > 2 is a per-class binary loss (multi-label BCE starts there), not a problem.

ln(K) is the loss of logits that are all equal. A new head with PyTorch's default init on top of
features with some scale (a pretrained body: trained ReLU features are large) gives logits that
are random but spread, and uninformed logits of spread s score up to ln(K) + s^2/2 (Jensen's bound
on E[logsumexp] of i.i.d. logits). So when the last layer's outputs at step 0 have a moderate
spread (std up to half of the 5 that counts as oversized), the expected level is raised by s^2/2:
a fine-tune under a fresh default head is healthy. A spread beyond that is itself the problem.
"""

from __future__ import annotations

import math

import numpy as np

from nnwatch.diagnosis.context import RunContext
from nnwatch.diagnosis.detectors.base import Detector
from nnwatch.diagnosis.history import RunHistory
from nnwatch.diagnosis.row import Row
from nnwatch.store.finding import Finding, fmt

FIRST_STEPS = 3  # the first finite loss must come within these steps to count as "initial"
HIGH_ABS, HIGH_REL = 0.75, 0.5
LOW_ABS, LOW_REL = 0.3, 0.5
INPUT_STD_LIMIT = 100.0  # textbook activation std bound
LOGIT_STD_LIMIT = 5.0
FRESH_HEAD_STD = LOGIT_STD_LIMIT / 2  # logit spreads a default-init head produces


class BadInitialLossDetector(Detector):
    kind = "bad_initial_loss"

    def __init__(self, ctx: RunContext) -> None:
        super().__init__(ctx)
        # a model that has trained already (the optimizer held state at watch time) is past it;
        # and ln K is the start of a plain cross-entropy only: a loss with other terms added (a
        # distillation KL, an auxiliary loss) or of another kind (BCE, a ranking loss) starts
        # elsewhere. A loss passed as a number has no graph to tell: it is judged as before.
        self.done = (
            not (ctx.num_classes and ctx.num_classes > 1)
            or ctx.resumed
            or ctx.loss_form not in ("", "cross_entropy")
        )
        self.first_std: np.ndarray | None = None

    def update(self, row: Row, hist: RunHistory) -> Finding | None:
        if self.done:
            return None
        if self.first_std is None and row.act_std is not None:
            self.first_std = row.act_std.astype(np.float64)
        if not math.isfinite(row.loss):
            if row.step >= FIRST_STEPS:
                self.done = True
            return None
        self.done = True
        if row.step >= FIRST_STEPS:
            return None
        k = int(self.ctx.num_classes or 0)
        lnk = math.log(k)
        loss = row.loss
        low = lnk - loss > max(LOW_ABS, LOW_REL * lnk)
        high = not low and not self._healthy(loss, lnk)
        if not (high or low):
            return None
        if low and k > 2 and abs(loss - math.log(2.0)) < 0.1:
            return None  # ~ln 2: a per-class binary loss (multi-label BCE), not a K-way softmax
        micro = self.ctx.micro_batches
        if low and micro > 1 and self._healthy(loss * micro, lnk):
            return None  # the micro-batch's loss, divided by the accumulation steps as usual
        return self._finding(row, k, lnk, loss, high)

    def _healthy(self, loss: float, lnk: float) -> bool:
        return not (
            loss - lnk - self._spread_allowance() > max(HIGH_ABS, HIGH_REL * lnk)
            or lnk - loss > max(LOW_ABS, LOW_REL * lnk)
        )

    def _spread_allowance(self) -> float:
        """What uninformed logits of the observed (moderate) spread add to ln K: s^2 / 2."""
        std = self.first_std
        if std is None or not std.size:
            return 0.0
        spread = float(std[-1])
        if not (math.isfinite(spread) and spread <= FRESH_HEAD_STD):
            return 0.0
        return 0.5 * spread * spread

    def _finding(self, row: Row, k: int, lnk: float, loss: float, high: bool) -> Finding:
        std = self.first_std
        input_std = logit_std = math.nan
        if std is not None and std.size:
            input_std = float(std[0])
            logit_std = float(std[-1])
        bs = row.batch_size
        ratio = loss / lnk
        evidence = {
            "initial_loss": loss,
            "expected_ln_k": lnk,
            "num_classes": k,
            "ratio_to_ln_k": ratio,
            "first_layer_output_std": input_std,
            "last_layer_output_std": logit_std,
            "batch_size": bs,
        }
        causes, layer = self._causes(k, ratio, bs, input_std, logit_std, high)
        summary = (
            f"the first loss is {fmt(loss)}, but a fresh {k}-class classifier should start near "
            f"ln({k}) = {fmt(lnk)} ({fmt(ratio)}x)."
        )
        return self.report(
            row,
            "warning",
            summary,
            "; ".join(causes),
            evidence,
            layer=layer,
            onset_step=row.step,
        )

    def _causes(
        self, k: int, ratio: float, bs: float, input_std: float, logit_std: float, high: bool
    ) -> tuple[list[str], str | None]:
        """Why the first loss is off, most specific first, and the layer to blame if one is."""
        ctx = self.ctx
        causes: list[str] = []
        layer = None
        if high and math.isfinite(bs) and bs > 1 and abs(ratio / bs - 1) < 0.25:
            causes.append(
                f"the loss is about batch size ({fmt(bs)}) x ln K: it sums over the batch; "
                "use reduction='mean' or divide by the batch size"
            )
        if high and math.isfinite(input_std) and input_std > INPUT_STD_LIMIT:
            causes.append(
                f"the first layer's outputs have std {fmt(input_std)}: normalize the inputs "
                "(zero mean, unit variance; divide pixels by 255)"
            )
            layer = ctx.layer_names[0] if ctx.layer_names else None
        if high and math.isfinite(logit_std) and logit_std > LOGIT_STD_LIMIT:
            causes.append(
                f"the last layer's outputs (logits) have std {fmt(logit_std)}: fix the init, scale "
                "its weights down (e.g. x0.01) and zero its bias so it starts near uniform"
            )
            if layer is None and ctx.layer_names:
                layer = ctx.layer_names[-1]
        if high and not causes:
            causes.append(
                "fix the init of the last layer (small weights, zero bias), normalize the inputs, "
                "and check that the model does not apply softmax before a loss that expects logits"
            )
        if not high:
            causes.append(
                "a loss this far below chance before training means a leak or a scaling error: "
                "check that labels are not part of the inputs, that the loss is not divided twice "
                + (f"(with {ctx.micro_batches} micro-batches per update, pass w.step() the loss "
                   "before dividing it) " if ctx.micro_batches > 1 else "")
                +
                f"and that num_classes={k} is right (a model loaded from trained weights starts "
                "below chance by design: leave num_classes out when watching one)"
            )
        return causes, layer
