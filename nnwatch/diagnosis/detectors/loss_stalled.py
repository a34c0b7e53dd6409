"""Loss stalled: training is not making progress, with the most specific cause the records show.

A flat loss is also what a converged run looks like, so a stall needs more than a flat loss:

* no gradient at all for 5 steps (the loss is detached, or backward() never reaches the weights);
* gradients that backward() made and the update did not find, 5 updates in a row (a zero_grad()
  between backward() and step());
* the LR is exactly 0 in every parameter group for 5 steps (a scheduler or warmup bug);
* the optimizer was built on a copy of the model (it holds tensors shaped like the model's
  parameters, none of them the model's own) and the loss has not moved in 5 steps;
* the updates are tiny against the weights: LR x gradient (SGD) or LR x sqrt(#params) (Adam and
  other normalizing optimizers) below 1e-6 of the weights' norm on 5 steps in a row whose LR did
  not rise (a warmup that starts near 0 rises), while the loss has not moved from where it started
  (healthy update/weight ratios are around 1e-3: at 1e-6 a thousand steps move the weights by
  0.1%, so waiting longer adds no evidence);
* or, with no specific cause, a run that has not learned anything yet: its loss never got 10% below
  where it started (nor rose 10% above it: that is divergence, which other detectors report), and
  the trend fitted over the last 40 steps projects less than a 2% drop. A run that once got 10%
  below its start and came back up has learned something: it is regressing or oscillating. Nor is
  a loss that is already near zero stalled, only converged (a run watched from a trained
  checkpoint): within 1e-4 of zero, or under 1% of ln(K) for a K-class model.

* the loss does not depend on the parameters: every gradient exactly 0, or the loss the same to
  the last bit, for 5 steps from the start (a loss on detached outputs, cross_entropy over a
  single logit, which is always 0);
* a scheduler took the LR down 1000x or more below the run's own peak and the loss has been flat
  over the last 40 steps while still above half of where it began (a per-epoch StepLR stepped
  every batch; a cosine schedule that reaches 0 at the end of a run that learned is not this);
* or, with no specific cause, a run that has not learned anything yet: its loss never got 10% below
  where it started (nor rose 10% above it: that is divergence, which other detectors report), and
  the trend fitted over the last 40 steps projects less than a 2% drop. A run that once got 10%
  below its start and came back up has learned something: it is regressing or oscillating. Nor is
  a loss that is already near zero stalled, only converged (a run watched from a trained
  checkpoint): within 1e-4 of zero, or under 1% of ln(K) for a K-class model.

A plateau before a drop (attention learning to count, sparse parity, small initial weights at a
saddle) sits at the label entropy for hundreds of steps and then falls; while it lasts it looks
exactly like a stall. So the cause-less rule is a note (severity ``info``), and it becomes a
warning only with a cause the records show beside it: a layer that gets no gradient, vanishing
gradients, dead units, a collapsing AMP scale, a Softmax layer whose probabilities the loss takes
as logits; or when the evidence is conclusive on its own: at chance, within 10% of ln(K), for 1000
steps. A run of unknown K (regression, a GAN) is never warned about on a flat loss alone.

Levels are medians and trends are least-squares fits, so a noisy loss does not look like a moving one.
"""

from __future__ import annotations

import math

import numpy as np

from nnwatch.diagnosis.context import ADAPTIVE_OPTIMIZERS, RunContext
from nnwatch.diagnosis.detectors.base import Detector, lr_now
from nnwatch.diagnosis.differential import remedy_text
from nnwatch.diagnosis.episode import Episode
from nnwatch.diagnosis.history import RunHistory, linear_fit, median
from nnwatch.diagnosis.mechanism import Mechanism
from nnwatch.diagnosis.row import Row
from nnwatch.store.finding import Finding, fmt
from nnwatch.store.schema import FieldName

NO_GRAD_STEPS = 5
ZERO_LR_STEPS = 5
TINY_UPDATE = 1e-6
TINY_UPDATE_STEPS = 5
COPY_STEPS = 5
WINDOW = 40
MIN_PROGRESS = 0.02
MAX_REGRESSION = 0.10  # a loss that rose more than this is diverging, not stalled
LEARNED = 0.10  # a run whose loss ever got 10% below its start has learned something
CONVERGED_ABS = 1e-4  # a flat loss this close to zero has nothing left to learn
CONVERGED_LN_K = 0.01  # ... nor one under 1% of chance level for a classifier
RELEASE = 50
CHANCE_BAND = 0.10  # within 10% of ln(K): the loss is at chance level
COLLAPSE_UNLEARNED = 0.5  # an LR collapse stalls a run that has not learned half its loss away
PATIENCE = 1000  # steps at chance before a plateau with no cause beside it is a warning
#: Open findings that explain a loss sitting at chance (the layers do not learn)
SUPPORTING_KINDS = ("zero_gradient_layer", "vanishing_gradients", "dead_relu", "amp_scale_collapse")
CAUSES = (
    "no_grad", "zero_lr", "tiny_update", "flat", "optimizer_copy", "loss_independent",
    "lr_collapsed", "grads_wiped", "mechanism",
)  # fmt: skip
#: Mechanisms that stall a run even after it learned something (a loss that fell, then stopped
#: far from where it could be): judged on a loss flat over the last ``MECH_WINDOW`` steps. The
#: others (updates too small, rounded away, pinned by decay) explain a run that never learned,
#: since a converged run ends with small updates too: judged, like ``tiny_update``, on a loss that
#: has not moved from its start. An adaptive optimizer's nominal step that is large against the
#: weights as they began (``adaptive_step_too_large``) is judged on a flat loss that has kept at
#: least half of where it began: a run that learns grows its weights into such a step (a
#: regression to targets in the thousands at Adam's LR 0.05 falls 99% and is healthy).
AFTER_LEARNING = frozenset({
    "updates_too_large", "loss_broadcast", "params_without_grad", "params_not_in_optimizer",
    "loss_squashed_twice",
})  # fmt: skip
LITTLE_LEARNED = 0.5  # a run whose loss fell less than this share from its start
MECH_WINDOW = 20  # steps of flat loss a mechanism that allows some learning needs beside it
MECH_MIN_STEPS = 5  # losses before a mechanism of a run that never learned is judged
WIPED_STEPS = 5  # updates in a row that found the gradients of their own backward gone


class LossStalledDetector(Detector):
    kind = "loss_stalled"

    def __init__(self, ctx: RunContext) -> None:
        super().__init__(ctx)
        self.episode = Episode(confirm=1, release=RELEASE)
        self.no_grad = 0
        self.wiped = 0
        self.zero_lr = 0
        self.tiny = 0
        self.tiny_lr = math.nan  # the LR when the current run of tiny updates began
        self.steps = 0
        self.update_ratio = math.nan
        self.adaptive = ctx.optimizer in ADAPTIVE_OPTIMIZERS if ctx.optimizer else None
        self.warned = False  # this episode already raised a warning (a note may come first)
        self.mechanism: Mechanism | None = None  # what the updates show, for the "mechanism" cause

    def update(self, row: Row, hist: RunHistory) -> Finding | None:
        if not math.isfinite(row.loss):
            return None
        self._count(row)
        obs = hist.obs
        copy = self.ctx.optimizer_on_copy and self.steps >= COPY_STEPS
        flat_possible = len(hist.loss) >= WINDOW and not hist.learned(LEARNED)
        independent = obs.loss_independent and not hist.learned(LEARNED)
        collapsed = _lr_collapsed(hist)
        mech = self._mechanism(row, hist, flat_possible)
        if not (
            self.no_grad or self.wiped or self.zero_lr or copy or self.tiny or flat_possible
            or independent or collapsed or mech
        ):  # fmt: skip
            # the usual step of a run that learns: no cause counting, nothing to compute
            if self.episode.active:
                self.episode.update(False, row.step)
            return None
        prog = hist.progress_since_start(min(10, max(3, len(hist.loss))))
        unmoved = math.isfinite(prog) and -MAX_REGRESSION < prog < MIN_PROGRESS
        cause = _cause(self, hist, copy, independent, mech, collapsed, flat_possible, prog, unmoved)
        if cause == "mechanism":
            self.mechanism = mech
        opened = self.episode.update(cause is not None, row.step)
        if opened:
            self.warned = False
        if cause is None or not self.episode.active:
            return None
        support = self._support(hist) if cause == "flat" else ""
        severity = "warning" if cause != "flat" or support or self._long_at_chance(hist) else "info"
        if opened or (severity == "warning" and not self.warned):
            self.warned = severity == "warning"
            return self._finding(row, hist, cause, prog, severity, support)
        return None

    def _count(self, row: Row) -> None:
        """Advance the counters of the causes that need several steps in a row (LR 0, gradients
        wiped or absent, tiny updates): one odd step proves nothing."""
        lr = row.lr
        zero_lr = row.lr0 == 0.0 and bool((lr == 0).all())  # NaN compares unequal
        self.zero_lr = self.zero_lr + 1 if zero_lr else 0
        self.steps += 1
        # backward made gradients, the update found none (a zero_grad() between backward() and
        # step()): the probe records the norm the update used as exactly 0, with no clip
        wiped = row.grad_norm > 0 and row.grad_norm_clipped == 0.0 and math.isnan(row.clip_threshold)
        self.wiped = self.wiped + 1 if wiped else 0
        if row.measured:  # steps the cost budget left unmeasured tell nothing about gradients
            absent = math.isnan(row.grad_norm) and (
                row.grad_layer.size == 0 or bool(np.isnan(row.grad_layer).all())
            )
            self.no_grad = self.no_grad + 1 if absent and self.ctx.num_param_layers else 0
        ratio = self._update_ratio(row)  # Adam's needs no gradient: known on every step
        if math.isfinite(ratio):
            self.update_ratio = ratio
            lr0 = row.lr0
            if ratio < TINY_UPDATE and (self.tiny == 0 or lr0 <= self.tiny_lr):
                self.tiny_lr = lr0 if self.tiny == 0 else self.tiny_lr
                self.tiny += 1
            else:
                self.tiny = 0

    def _mechanism(self, row: Row, hist: RunHistory, flat_possible: bool) -> Mechanism | None:
        """What the updates show behind a loss that has stopped falling (see AFTER_LEARNING)."""
        if len(hist.loss) < MECH_MIN_STEPS:
            return None
        found = hist.obs.update.stall(self.ctx, row.lr0)
        if not found:
            return None
        flat = len(hist.loss) >= MECH_WINDOW and self._flat(hist, MECH_WINDOW) and not self._converged(hist)
        prog = hist.progress_since_start(min(10, len(hist.loss)))
        unmoved = math.isfinite(prog) and -MAX_REGRESSION < prog < MIN_PROGRESS and not hist.learned(LEARNED)
        for mech in found:  # the most certain one the loss's course allows
            if mech.code == "adaptive_step_too_large":
                allowed = flat and _little_learned(hist)
            else:
                allowed = flat if mech.code in AFTER_LEARNING else unmoved
            if allowed:
                return mech
        return None

    def _support(self, hist: RunHistory) -> str:
        """A cause the records show for a loss flat at chance, in words, or nothing."""
        k = self.ctx.num_classes
        if not k or k < 2:
            return ""
        lnk = math.log(k)
        level = median(hist.loss.values(WINDOW).tolist())
        if abs(level - lnk) > CHANCE_BAND * lnk:
            return ""
        names = {
            "zero_gradient_layer": "a layer gets no gradient at all",
            "vanishing_gradients": "the gradients vanish before they reach the first layers",
            "dead_relu": "most units of a ReLU layer are dead",
            "amp_scale_collapse": "the AMP scaler skips the updates",
        }
        for kind in SUPPORTING_KINDS:
            if kind in hist.obs.active:
                return names[kind]
        if self.ctx.layer_kinds and self.ctx.layer_kinds[-1] == "Softmax":
            return (
                f"the model ends in {self.ctx.layer_label(self.ctx.num_layers - 1)}: the loss gets "
                "probabilities where it expects logits (cross_entropy applies softmax again), "
                "which flattens its gradient"
            )
        return ""

    def _long_at_chance(self, hist: RunHistory) -> bool:
        """A cause-less plateau that means "nothing learned": at ln(K) for PATIENCE steps."""
        k = self.ctx.num_classes
        if not k or k < 2 or len(hist.loss) < PATIENCE:
            return False
        lnk = math.log(k)
        level = median(hist.loss.values(WINDOW).tolist())
        return abs(level - lnk) <= CHANCE_BAND * lnk

    def _update_ratio(self, row: Row) -> float:
        ctx = self.ctx
        lr, g = row.lr0, row.grad_norm
        if self.adaptive is None or not (math.isfinite(ctx.param_norm) and ctx.param_norm > 0):
            return math.nan
        if not math.isfinite(lr) or lr <= 0:
            return math.nan
        if self.adaptive:
            return lr * math.sqrt(max(ctx.total_numel, 1)) / ctx.param_norm
        if not math.isfinite(g):
            return math.nan
        return lr * g / ctx.param_norm

    def _converged(self, hist: RunHistory) -> bool:
        """The loss level is already near zero: flat because there is nothing left to learn."""
        level = abs(median(hist.loss.values(WINDOW).tolist()))
        k = self.ctx.num_classes
        if k and k > 1 and level <= CONVERGED_LN_K * math.log(k):
            return True
        return level <= CONVERGED_ABS

    @staticmethod
    def _flat(hist: RunHistory, window: int = WINDOW) -> bool:
        """The fitted trend over the window projects less than a 2% drop across the window."""
        v = hist.loss.values(window)
        slope, _, _ = linear_fit(v)
        level = abs(median(v.tolist())) or 1.0
        return slope * v.size > -MIN_PROGRESS * level

    def _finding(
        self, row: Row, hist: RunHistory, cause: str, prog: float, severity: str, support: str = ""
    ) -> Finding:
        evidence, chance = self._evidence(row, hist, prog)
        texts = self._no_update_text(row, hist, cause, chance) or self._small_update_text(
            row, hist, cause, chance
        )
        if texts is None and cause == "mechanism" and self.mechanism is not None:
            m = self.mechanism
            texts = f"the loss has stopped falling at {fmt(hist.recent_loss(10))}{chance}, and {m.text}.", m.remedy
            evidence.update(m.evidence)
        summary, remedy = texts or _plateau_text(row, hist, prog, severity, support, chance)
        if row.clip_threshold == 0.0:
            # the evidence says why before any other cause: the user's clip zeroes every gradient
            evidence[FieldName.CLIP_THRESHOLD] = 0.0
            remedy = (
                "your clip_grad_norm_ has max_norm=0, which scales every gradient to zero: set it "
                "to a positive value (about 1.0) first; if the loss still does not move, " + remedy
            )
        evidence["cause_code"] = CAUSES.index(cause)
        return self.report(
            row,
            severity,
            summary,
            remedy,
            evidence,
            onset_step=(
                max(hist.first_loss_step, 0)
                if cause == "flat" or (cause == "mechanism" and not hist.learned(LEARNED))
                else self.episode.first_hit
            ),
            obs=hist.obs,
        )

    def _evidence(self, row: Row, hist: RunHistory, prog: float) -> tuple[dict[str, float], str]:
        """The numbers every stall cites, and `` (chance level ...)`` when the loss sits there."""
        ctx = self.ctx
        now = hist.recent_loss(10)
        evidence: dict[str, float] = {
            "loss_at_start": hist.start_loss,
            "loss_now": now,
            "progress_since_start": prog,
            "steps_observed": len(hist.loss),
            "lr": row.lr0,
            FieldName.GRAD_NORM: row.grad_norm,
            "update_to_weight_ratio": self.update_ratio,
        }
        chance = ""
        if ctx.num_classes and ctx.num_classes > 1:
            lnk = math.log(ctx.num_classes)
            evidence["ln_num_classes"] = lnk
            if math.isfinite(now) and abs(now - lnk) <= 0.1 * lnk:
                chance = f" (chance level ln({ctx.num_classes}) = {fmt(lnk)})"
        return evidence, chance

    def _no_update_text(self, row: Row, hist: RunHistory, cause: str, chance: str) -> tuple[str, str] | None:
        """(summary, remedy) of a stall whose weights get no update at all, or None."""
        now = hist.recent_loss(10)
        if cause == "no_grad":
            return (
                f"no parameter has received a gradient for {self.no_grad} steps; the loss sits at {fmt(now)}{chance}.",
                "make sure loss.backward() runs on the loss tensor itself: no .item(), .detach() or "
                "torch.no_grad() on the way, and the parameters have requires_grad=True",
            )
        if cause == "grads_wiped":
            return (
                f"on the last {self.wiped} updates the optimizer found no gradient: backward() made "
                f"them (norm {fmt(row.grad_norm)}), and they were gone by optimizer.step(). The "
                f"weights never move; the loss sits at {fmt(now)}{chance}.",
                "call optimizer.zero_grad() before loss.backward() (or after optimizer.step()), "
                "never between backward() and step()",
            )
        if cause == "zero_lr":
            return (
                f"the LR has been exactly 0 for {self.zero_lr} steps; the loss sits at {fmt(now)}{chance}.",
                "check the LR scheduler or warmup: it sets the LR to 0 (print scheduler.get_last_lr())",
            )
        if cause == "optimizer_copy":
            return (
                "the optimizer you passed holds a copy of the model's parameters, not the model's "
                f"own: its updates never reach the model, and the loss sits at {fmt(now)}{chance}.",
                "build the optimizer on the model you train, after any copy or wrapping: "
                "optimizer = torch.optim.SGD(model.parameters(), ...) (a deepcopy or a model "
                "re-created after the optimizer leaves it holding stale tensors)",
            )
        return None

    def _small_update_text(self, row: Row, hist: RunHistory, cause: str, chance: str) -> tuple[str, str] | None:
        """(summary, remedy) of a stall whose updates cannot move the loss, or None."""
        now, obs = hist.recent_loss(10), hist.obs
        if cause == "tiny_update":
            return (
                f"each update changes the weights by about {fmt(self.update_ratio)} of their norm "
                f"(healthy is around 1e-3) and the loss has not moved from {fmt(hist.start_loss)}{chance}.",
                f"raise the LR{lr_now(row)} by 100x or more, or run an LR range test",
            )
        if cause == "loss_independent":
            what = (
                "every gradient has been exactly 0" if obs.zero_grad >= obs.constant_loss
                else "the loss has been exactly 0"
            )
            return (
                f"the loss does not depend on the parameters: {what} for "
                f"{max(obs.zero_grad, obs.constant_loss)} steps (loss {fmt(now)}), so no update can move it.",
                "check how the loss is computed: from outputs detached from the model (.detach(), "
                ".item(), .data, torch.no_grad()), from a constant, or from a single logit "
                "(cross_entropy over one class is always 0; use binary_cross_entropy_with_logits "
                "for one output)",
            )
        if cause == "lr_collapsed":
            return (
                f"the loss has stopped moving ({fmt(now)}) since the LR fell from {fmt(obs.lr_peak)} "
                f"(step {obs.lr_peak_step}) to {fmt(obs.lr)}, {fmt(1 / obs.lr_collapse)}x lower: "
                "the updates are too small to learn.",
                "check how often the scheduler steps: a per-epoch schedule (StepLR, MultiStepLR, "
                "ExponentialLR) stepped every batch decays far too fast; step it once per epoch or "
                "give it a step_size in batches",
            )
        return None


def _plateau_text(
    row: Row, hist: RunHistory, prog: float, severity: str, support: str, chance: str
) -> tuple[str, str]:
    """(summary, remedy) of a loss flat without a mechanism: a note, or at chance level."""
    start, now, steps = hist.start_loss, hist.recent_loss(10), len(hist.loss)
    if severity == "info":
        return (
            f"the loss has not moved from {fmt(start)} in {steps} steps (now {fmt(now)}{chance}, "
            f"{fmt(100 * prog)}% progress). This is a note, not yet a warning: a plateau before "
            "a drop (small initial weights, a saddle) and an adversarial loss look the same.",
            "wait a little longer; if the loss stays here, check that the optimizer was given "
            "model.parameters() and that inputs and labels line up, and try to overfit one batch",
        )
    if support:
        remedy = (
            "fix that first (the finding about it says how); then try to overfit one batch to "
            "check that the model can learn at all"
        )
        if "Softmax" in support:
            remedy = (
                "remove the Softmax layer at the end of the model and pass the raw logits to "
                "cross_entropy (or use LogSoftmax with nll_loss)"
            )
        return (
            f"the loss has sat at chance level for {steps} steps (now {fmt(now)}{chance}, "
            f"{fmt(100 * prog)}% progress from {fmt(start)}), and {support}.",
            remedy,
        )
    return (
        f"the loss has sat at chance level for {steps} steps (now {fmt(now)}{chance}, "
        f"{fmt(100 * prog)}% progress from {fmt(start)}): the model has learned nothing.",
        remedy_text(hist.obs, [
            ("raise_lr", f"raise the LR{lr_now(row)}"),
            ("", "check that the optimizer was given model.parameters(), that inputs and labels "
                 "line up and that the inputs are normalized; try to overfit one batch"),
        ]),  # fmt: skip
    )


def _little_learned(hist: RunHistory) -> bool:
    """The recent loss kept at least half of the lowest of the first losses (a spike that the
    huge step caused early on is not a start to have learned from)."""
    first = [x for x in hist.first_losses if math.isfinite(x)]
    if not first or min(first) <= 0 or len(hist.loss) < 10:
        return False
    return (min(first) - hist.recent_loss(10)) / min(first) < LITTLE_LEARNED


def _lr_collapsed(hist: RunHistory) -> bool:
    """The LR fell 1000x below the run's peak while the loss is still above half of where it
    began: a schedule that ends near 0 after the run has learned (cosine to its end) is not a
    collapse."""
    obs = hist.obs
    return (
        math.isfinite(obs.lr_collapse)
        and len(hist.loss) >= WINDOW
        and hist.recent_loss(WINDOW) >= COLLAPSE_UNLEARNED * hist.start_loss
    )


def _cause(
    det: LossStalledDetector, hist: RunHistory, copy: bool, independent: bool,
    mech: Mechanism | None, collapsed: bool, flat_possible: bool, prog: float, unmoved: bool,
) -> str | None:  # fmt: skip
    """The most specific cause the records show (the first that holds, in the order of
    CAUSES' docs: no update at all, then updates that cannot move the loss, then a flat loss
    with nothing beside it), or None."""
    if det.no_grad >= NO_GRAD_STEPS:
        return "no_grad"
    if det.wiped >= WIPED_STEPS:
        return "grads_wiped"
    if det.zero_lr >= ZERO_LR_STEPS:
        return "zero_lr"
    if copy and unmoved:
        return "optimizer_copy"
    if independent:
        return "loss_independent"
    if mech is not None:
        return "mechanism"
    if det.tiny >= TINY_UPDATE_STEPS and unmoved and not hist.obs.update.ready:
        return "tiny_update"  # estimated from the LR, where no update was measured
    if collapsed and det._flat(hist) and not det._converged(hist):
        return "lr_collapsed"
    if (
        flat_possible
        and prog > -MAX_REGRESSION
        and det._flat(hist)
        and not det._converged(hist)
    ):
        return "flat"
    return None
