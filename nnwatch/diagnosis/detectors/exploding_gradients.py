"""Exploding gradients: the gradient norm jumps far above this run's own usual level, and stays.

Textbook rule: a global norm above 100 means exploding. It misfires both ways: a model whose norm
is a stable 5000 trains fine, and one whose usual norm is 0.01 is in trouble at 10. So the norm is
compared with the median of its own recent history (log scale, which a sudden spike barely moves),
and a step counts as a hit when the norm is at least 10x that median (more when the run is
naturally noisy, up to 100x) *and* the loss got worse by more than its own noise: a norm that grows
while the loss falls is a model leaving its initialization, not an explosion.

An episode needs two hits within three steps, so that a lone spike is left to the spike snapshot
(four within five while the loop clips: clipping already contains transient spikes, as in an RNN
crossing a cliff). A slower blow-up, whose rolling median follows it up (gradients that pile up
because ``zero_grad()`` is missing), is caught against the run's start instead: 10x the first
steps' norm while the loss is 10% worse than where the run began, or 3x while the loss is more than
10x above it (divergence). A step the GradScaler skipped is its business, not an explosion.

The layer named is the one whose gradient grew most against its own history (an EMA per layer).
The evidence also carries AutoTrainer's (ICSE 2021) first-to-last layer gradient ratio.

A norm that jumps with the loss is also what new data does (a curriculum stage, a data source
switched, a loss term turned on): the gradient of a larger loss is larger. What tells the two
apart is what follows: an explosion moves the weights further (the update-to-weight ratio ten
times its level, weights that grow by half, an LR that rose, a loss that runs away to 10x its
start) and the loss does not come back down; after new data the optimizer brings it down. When
the measured updates since the jump stayed their usual size the finding is a note, made an error
once the updates grow, or once ``CONFIRM`` steps pass without the loss falling back.
"""

from __future__ import annotations

import math
from collections import deque

import numpy as np

from nnwatch.diagnosis.context import RunContext
from nnwatch.diagnosis.detectors.base import Detector, lr_now
from nnwatch.diagnosis.differential import causes_sentence, remedy_text
from nnwatch.diagnosis.history import (
    MAD_TO_SIGMA,
    Ring,
    RunHistory,
    SortedWindow,
    median,
    median_sigma,
)
from nnwatch.diagnosis.observed import Observations
from nnwatch.diagnosis.row import Row
from nnwatch.store.finding import Finding, fmt
from nnwatch.store.schema import FieldName

MIN_HISTORY = 10  # finite norms needed before any verdict
BASELINE = 128  # norms in the rolling baseline
HIT_DECADES = 1.0  # 10x the usual norm ...
MAX_HIT_DECADES = 2.0  # ... up to 100x for very noisy runs (3 sigma of the run's own noise)
RELEASE_DECADES = math.log10(3.0)  # the episode ends after RELEASE steps within 3x of usual
RELEASE = 20
TEXTBOOK_LIMIT = 100.0
START_STEPS = 5  # norms that define where the run started
MATERIAL = 0.01  # a loss change below 1% of the run's loss scale is noise
DIVERGE_DECADES = math.log10(3.0)  # with the loss 10x above its start, 3x the norm suffices
LOSS_BLOWUP = 10.0
WORSE_THAN_START = 0.10
HITS, OF = 2, 3  # hits needed within the last steps
#: Without a clip, a norm 30x where the run began, twice within FAR_WITHIN steps, while the run's
#: usual norm itself has grown 3x, is an explosion even while the loss still improves: Adam
#: absorbs a recurrent net's blow-up into its second moment, and the loss creeps down between
#: spikes of 30-360 times the early norm (a vanilla RNN past its stability edge). Healthy runs
#: that learn fast grow their norm 10-25x over their first steps, smoothly.
FAR_DECADES, FAR_USUAL_DECADES, FAR_HITS, FAR_WITHIN = math.log10(30.0), 0.5, 2, 20
#: ... and each such step a spike: 4x the median of the last 16 norms. A norm that grows while
#: the loss falls is a model waking up, however far it grows: a deep ReLU net whose head starts at
#: zero grows its norm 30-90x as it learns, with swings of 2-3x around its rising level; a
#: recurrent net crossing a cliff spikes 5-15x above its level of the moment.
FAR_SPIKE_DECADES, RECENT = math.log10(4.0), 16
CLIPPED_HITS, CLIPPED_OF = 4, 5  # clipping bounds the updates: only a persistent blow-up counts
CONFIRM = 20  # steps after a jump with ordinary updates within which the loss must turn back down


class ExplodingGradientsDetector(Detector):
    kind = "exploding_gradients"

    def __init__(self, ctx: RunContext) -> None:
        super().__init__(ctx)
        self.base = SortedWindow(BASELINE)
        self.base_loss = Ring(BASELINE)
        self.recent_hits: list[tuple[bool, int]] = []
        self.active = False
        self.calm = 0
        self.frozen: tuple[float, float] | None = None
        self.layer_ema = np.full(ctx.num_param_layers, np.nan)
        self.start: list[float] = []
        self._learned = 0
        self.far_steps: list[int] = []  # recent steps at 100x the start (no clip)
        self.recent: deque[float] = deque(maxlen=RECENT)  # the last log10 norms
        self.far = False  # this episode was opened by the far rule (the loss may improve)
        self.note = False  # the open episode was reported as a note: the updates stayed usual
        self.onset = -1
        self.peak_loss = -math.inf  # the highest loss of the open episode

    @property
    def confirmed(self) -> bool:
        """An open episode reported as an explosion (a note is not a cause for other findings)."""
        return self.active and not self.note

    def _spread(self, ref: float) -> float:
        """The baseline's spread (MAD as a sigma): only needed once the norm is well above it."""
        if self.frozen is not None:
            return self.frozen[1]
        return MAD_TO_SIGMA * median([abs(v - ref) for v in self.base.values()])

    def update(self, row: Row, hist: RunHistory) -> Finding | None:
        if row.amp_skipped == 1.0:
            return None  # the GradScaler overflowed on purpose and skipped the step
        g = row.grad_norm
        finite = math.isfinite(g) and g > 0
        if not finite and not (math.isinf(g) or (math.isnan(g) and row.nonfinite_grads == 1.0)):
            return None  # not measured, or exactly zero (the vanishing detector's business)
        if finite and len(self.start) < START_STEPS:
            self.start.append(math.log10(g))
        if finite:
            self.recent.append(math.log10(g))
        if len(self.base) < MIN_HISTORY:
            if finite:
                self._learn(row, math.log10(g))
            return None
        ref = self.frozen[0] if self.frozen is not None else self.base.median()
        x = math.log10(g) if finite else math.inf
        rise = x - ref
        sig = math.nan
        if finite:
            hit, sig, far = self._hit(row, hist, ref, x, rise)
            if far:
                self.active, self.calm, self.far = True, 0, True
                self.frozen = (ref, self._spread(ref))
                return self._finding(row, ref, rise, finite, hist.obs)
        else:  # overflow right after a jump is the end of an explosion; from nowhere it is not
            hit = any(h for h, _ in self.recent_hits)
        if self.active:
            return self._follow_episode(row, hist, ref, rise, finite)
        return self._open_episode(row, hist, ref, rise, finite, hit, x, sig)

    def _hit(
        self, row: Row, hist: RunHistory, ref: float, x: float, rise: float
    ) -> tuple[bool, float, bool]:
        """(hit, spread, far) for a finite norm: is it far enough above its usual level, or its
        start, with a loss that got worse; and, when not, has the far rule seen enough spikes?"""
        sig = math.nan
        from_start = x - median(self.start)
        # every rule needs the norm at least 3x above a reference: most steps stop here
        hit = max(rise, from_start) >= DIVERGE_DECADES
        if not hit:
            return hit, sig, False
        sig = self._spread(ref) if rise >= HIT_DECADES else math.nan
        need = min(max(HIT_DECADES, 3.0 * sig), MAX_HIT_DECADES)
        if hist.obs.adversarial:
            # one side of a game: its loss getting worse is the other side learning, so
            # it is no evidence; only a norm 100x its usual level counts
            hit = rise >= MAX_HIT_DECADES
        else:
            hit = (
                (rise >= need and self._loss_worse(row, hist))
                or (from_start >= HIT_DECADES and _worse_than_start(row, hist))
                or _loss_blew_up(row, hist)
            )
        far = not hit and self._far_spikes(row, hist, ref, x, from_start)
        return hit, sig, far

    def _far_spikes(
        self, row: Row, hist: RunHistory, ref: float, x: float, from_start: float
    ) -> bool:
        """Counts this step if it is a spike far above the start while the usual norm itself
        grew (no clip); True once FAR_HITS of them fall within FAR_WITHIN steps."""
        if (
            not hist.obs.adversarial
            and not self.active
            and from_start >= FAR_DECADES
            and not math.isfinite(row.clip_threshold)
            and ref - median(self.start) >= FAR_USUAL_DECADES
            and x - median(list(self.recent)) >= FAR_SPIKE_DECADES
        ):
            self.far_steps = [s for s in self.far_steps if row.step - s < FAR_WITHIN]
            self.far_steps.append(row.step)
            return len(self.far_steps) >= FAR_HITS
        return False

    def _follow_episode(
        self, row: Row, hist: RunHistory, ref: float, rise: float, finite: bool
    ) -> Finding | None:
        """An open episode: a note turns into an explosion or closes as new data, and the
        episode ends after RELEASE calm steps."""
        if self.note and finite:
            if math.isfinite(row.loss):
                self.peak_loss = max(self.peak_loss, row.loss)
            if self._backed(row, hist, self.onset) or self._not_recovering(row, hist):
                self.note = False  # the updates grew, or the loss stays up: an explosion
                return self._finding(row, ref, rise, finite, hist.obs)
            if self._recovered(row, hist):
                self._close()  # new data the run has learned: its norm's new level is usual
                self.base.clear()
                self.base_loss.clear()
                return None
        if rise < RELEASE_DECADES:
            self.calm += 1
            if self.calm >= RELEASE:
                self.active = self.far = False
                self.frozen = None
                self.recent_hits.clear()
        else:
            self.calm = 0
        return None

    def _open_episode(
        self, row: Row, hist: RunHistory, ref: float, rise: float, finite: bool,
        hit: bool, x: float, sig: float,
    ) -> Finding | None:  # fmt: skip
        """No episode open: enough recent hits open one (more while the loop clips); a step
        that is no hit teaches the baseline."""
        self.recent_hits = (self.recent_hits + [(hit, row.step)])[-CLIPPED_OF:]
        clipping = math.isfinite(row.clip_threshold)
        need_hits, of = (CLIPPED_HITS, CLIPPED_OF) if clipping else (HITS, OF)
        fire = hit and sum(h for h, _ in self.recent_hits[-of:]) >= need_hits
        if not fire:
            if finite and not hit:
                self._learn(row, x)
            return None
        self.active = True
        self.calm = 0
        self.frozen = (ref, sig if math.isfinite(sig) else self._spread(ref))
        self.onset = min([s for h, s in self.recent_hits if h] + [row.step])
        self.note = finite and self._backed(row, hist, self.onset) is False
        self.peak_loss = row.loss if math.isfinite(row.loss) else -math.inf
        return self._finding(row, ref, rise, finite, hist.obs)

    def _close(self) -> None:
        self.active = self.far = self.note = False
        self.frozen = None
        self.recent_hits.clear()
        self.calm = 0

    def _recovered(self, row: Row, hist: RunHistory) -> bool:
        """The loss has come back two thirds of the way from its peak toward where it was."""
        before = median([v for v in self.base_loss.values(20).tolist() if math.isfinite(v)])
        if not (math.isfinite(before) and math.isfinite(self.peak_loss) and math.isfinite(row.loss)):
            return False
        now = median(hist.loss.values(5).tolist() + [row.loss])
        return self.peak_loss - now >= 2 * (self.peak_loss - before) / 3

    def _not_recovering(self, row: Row, hist: RunHistory) -> bool:
        """``CONFIRM`` steps after the jump the loss has not come back a third of the way down
        from its peak toward where it was before."""
        if row.step - self.onset < CONFIRM or not math.isfinite(row.loss):
            return False
        before = median([v for v in self.base_loss.values(20).tolist() if math.isfinite(v)])
        if not (math.isfinite(before) and math.isfinite(self.peak_loss)):
            return False
        now = median(hist.loss.values(5).tolist() + [row.loss])
        return self.peak_loss - now < (self.peak_loss - before) / 3

    def _backed(self, row: Row, hist: RunHistory, onset: int) -> bool | None:
        """Do the updates (or a runaway loss) back the jump that began at ``onset``?"""
        if _loss_blew_up(row, hist):
            return True
        return hist.obs.update.backs_rise(row, onset)

    def _loss_worse(self, row: Row, hist: RunHistory) -> bool:
        """The loss is above its recent usual level by more than its own noise (and 1% of its scale)."""
        if not math.isfinite(row.loss):
            return True  # a non-finite loss or none at all: the norm decides alone
        usual = self.base_loss.values(20)
        usual = usual[np.isfinite(usual)]
        if usual.size < 3:
            return True
        med, sigma = median_sigma(usual)
        scale = max(abs(med), abs(hist.start_loss) if math.isfinite(hist.start_loss) else 0.0)
        return row.loss - med > max(MATERIAL * scale, sigma)

    def _learn(self, row: Row, x: float) -> None:
        self.base.push(x)
        if math.isfinite(row.loss):
            self.base_loss.push(row.loss)
        gl = row.grad_layer
        self._learned += 1
        if gl.size and (self._learned % 4 == 1 or np.isnan(self.layer_ema).any()):
            # the per-layer EMA only names the culprit layer: every 4th step is plenty
            ok = (gl > 0) & (gl < np.inf)  # NaN compares False
            lg = np.log10(np.where(ok, gl, 1.0).astype(np.float64))
            ema = self.layer_ema
            fresh = ok & np.isnan(ema)
            ema[fresh] = lg[fresh]
            upd = ok & ~fresh
            ema[upd] += 0.3 * (lg[upd] - ema[upd])

    def _finding(
        self, row: Row, ref: float, rise: float, finite: bool, obs: Observations
    ) -> Finding:
        usual = 10**ref
        layer, layer_growth = self._fastest_layer(row.grad_layer)
        clip = float(f"{2 * usual:.2g}")
        evidence = {
            FieldName.GRAD_NORM: row.grad_norm,
            "usual_grad_norm": usual,
            "times_usual": 10**rise if math.isfinite(rise) else math.inf,
            "loss": row.loss,
            "lr": row.lr0,
            "layer_growth": layer_growth,
            "first_to_last_layer_ratio": first_last_ratio(self.ctx, row.grad_layer),
            "above_textbook_100": 1.0 if row.grad_norm > TEXTBOOK_LIMIT else 0.0,
            FieldName.CLIP_THRESHOLD: row.clip_threshold,
        }
        start = 10 ** median(self.start) if self.start else math.nan
        if not finite:
            times = "non-finite"
        elif rise >= HIT_DECADES or not math.isfinite(start) or start <= 0:
            times = f"{fmt(10**rise)}x this run's usual {fmt(usual)}"
        else:  # fired against where the run began (a slow pile-up the usual level followed up)
            times = f"{fmt(row.grad_norm / start)}x its level over the first steps (median {fmt(start)})"
            evidence["times_start"] = row.grad_norm / start
        grew = (
            f" ({layer} grew most, {fmt(layer_growth)}x)" if layer and math.isfinite(layer_growth) else ""
        )
        summary = f"gradient norm {fmt(row.grad_norm)} is {times}{grew}{self._loss_part(row, usual, start)}."
        summary += causes_sentence(obs)
        return self.report(
            row,
            ("info" if self.note else "warning" if self.far else "error") if finite else "critical",
            summary,
            remedy_text(obs, _remedies(row, clip, obs.clip_rate), numbered=False),
            evidence,
            layer=layer,
            onset_step=min([s for h, s in self.recent_hits if h] + self.far_steps + [row.step]),
            obs=obs,
        )

    def _fastest_layer(self, gl: np.ndarray) -> tuple[str | None, float]:
        """The layer whose gradient grew most against its own average, and by how much."""
        if not gl.size:
            return None, math.nan
        with np.errstate(divide="ignore", invalid="ignore"):
            growth = np.log10(gl.astype(np.float64)) - self.layer_ema
        growth[~np.isfinite(growth)] = -np.inf
        if not np.isfinite(growth).any():
            return None, math.nan
        j = int(np.argmax(growth))
        return self.ctx.param_layer_names[j], 10 ** float(growth[j])

    def _loss_part(self, row: Row, usual: float, start: float) -> str:
        """What the loss did meanwhile: got worse, or (far from the start) still improves."""
        if self.far:
            loss_part = (
                f"; the usual norm itself has grown {fmt(usual / start)}x. The loss still improves "
                "between the spikes (an adaptive optimizer absorbs them), but each spike is an update "
                "in a direction the model cannot trust"
            )
        else:
            loss_part = f" while the loss got worse ({fmt(row.loss)})"
        if self.note:
            loss_part += (
                ", but the updates stayed their usual size: the gradient of a larger loss is "
                "larger. A jump of the loss and the norm together, after ordinary updates, is "
                "what new data does (a curriculum stage, another data source, a loss term "
                "switched on); a note, made an error if the updates grow"
            )
        return loss_part


def _loss_blew_up(row: Row, hist: RunHistory) -> bool:
    """The loss is more than 10x above where the run began (divergence)."""
    start = hist.start_loss
    if not (math.isfinite(row.loss) and math.isfinite(start)) or start == 0:
        return False
    return row.loss - start > LOSS_BLOWUP * abs(start)


def _worse_than_start(row: Row, hist: RunHistory) -> bool:
    """The loss is now above where the run began: training has gone backwards."""
    start = hist.start_loss
    if not (math.isfinite(row.loss) and math.isfinite(start)):
        return False
    recent = np.append(hist.loss.values(2), row.loss)
    return median(recent.tolist()) - start > WORSE_THAN_START * abs(start)


def _remedies(row: Row, clip: float, clip_rate: float) -> list[tuple[str, str]]:
    """(remedy id, text), most likely first: by whether the run clips, and whether its clip fires."""
    candidates: list[tuple[str, str]] = []
    if math.isfinite(row.clip_threshold):
        if math.isfinite(clip_rate) and clip_rate > 0:
            candidates.append((
                "clip_bounds",
                f"clipping at {fmt(row.clip_threshold)} (it fired on {fmt(100 * clip_rate)}% of "
                f"recent steps) bounds each update, but the gradients keep growing: lower the "
                f"LR{lr_now(row)} by 3-10x",
            ))  # fmt: skip
        else:
            candidates.append((
                "lower_lr",
                f"your clip at {fmt(row.clip_threshold)} never fired (the norm stayed below it), "
                f"so it bounds nothing: lower max_norm to about {fmt(clip)}, and lower the "
                f"LR{lr_now(row)} by 3-10x",
            ))  # fmt: skip
    else:
        candidates.append((
            "add_clip",
            f"clip gradients at {fmt(clip)} (about 2x this run's usual norm: "
            f"torch.nn.utils.clip_grad_norm_(model.parameters(), {fmt(clip)}))",
        ))  # fmt: skip
        candidates.append(("lower_lr", f"lower the LR{lr_now(row)} by 3-10x"))
    return candidates


def first_to_last(ctx: RunContext, grad_layer: np.ndarray) -> tuple[int, int, float, float] | None:
    """(first, last, first RMS, last RMS) over the non-sparse layers with a positive finite grad."""
    if grad_layer.size < 2:
        return None
    order = ctx.dense_param_order
    g = grad_layer[order]
    ok = np.flatnonzero(g > 0)  # NaN and +Inf compare False / are filtered below
    ok = ok[np.isfinite(g[ok])]
    if ok.size < 2:
        return None
    first, last = int(order[ok[0]]), int(order[ok[-1]])
    a, b = float(grad_layer[first]), float(grad_layer[last])
    if ctx.param_numel is not None:
        a /= math.sqrt(max(ctx.param_numel[first], 1.0))
        b /= math.sqrt(max(ctx.param_numel[last], 1.0))
    return first, last, a, b


def first_last_ratio(ctx: RunContext, grad_layer: np.ndarray) -> float:
    fl = first_to_last(ctx, grad_layer)
    if fl is None or fl[3] == 0:
        return math.nan
    return fl[2] / fl[3]
