"""Remedies from a differential: the causes the evidence supports, in order, none it rules out.

A finding lists what it would advise (``Remedy`` ids, most likely first). :func:`remedy_text`
puts first the set-up causes the records show outright (:mod:`nnwatch.diagnosis.observed`),
each with the number behind it, then the finding's own remedies minus those ``RULES_OUT`` drops.
The rule-out table is data, one row per (remedy, fact), so that a test can check each row.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

from nnwatch.diagnosis.observed import Observations
from nnwatch.store.finding import fmt


@dataclass(frozen=True)
class Cause:
    """A cause the records show, with the number that shows it."""

    code: str
    value: float
    text: str
    remedy: str


def observed_causes(obs: Observations) -> list[Cause]:
    """The set-up causes the records show now, the most certain first."""
    out: list[Cause] = []
    if obs.lr_negative:
        out.append(Cause(
            "lr_negative", obs.lr,
            f"the LR is negative ({fmt(obs.lr)}): every update climbs the gradient",
            "make the LR positive (a sign error in the LR or its schedule)",
        ))  # fmt: skip
    if obs.grads_not_cleared:
        out.append(Cause(
            "grads_not_cleared", float(obs.kept),
            f"the gradients are not cleared between updates ({obs.kept} updates in a row added "
            "to the last one's gradients): each step's gradient holds every earlier step's",
            "call optimizer.zero_grad() once per update, before backward()",
        ))  # fmt: skip
    if obs.loss_independent:
        n = max(obs.zero_grad, obs.constant_loss)
        what = (
            "every gradient is exactly zero" if obs.zero_grad >= obs.constant_loss
            else "the loss is exactly 0 on every step"
        )
        out.append(Cause(
            "loss_independent", float(n),
            f"the loss does not depend on the parameters ({what}, {n} steps)",
            "check the loss: it is computed from detached tensors, from a constant, or from a "
            "single logit (cross_entropy over one class is always 0)",
        ))  # fmt: skip
    if obs.lr_zero:
        out.append(Cause(
            "lr_zero", 0.0, f"the LR has been 0 for {obs.nonpositive_lr} steps",
            "check the LR scheduler or warmup (print scheduler.get_last_lr())",
        ))  # fmt: skip
    collapse = obs.lr_collapse
    if math.isfinite(collapse):
        out.append(Cause(
            "lr_collapsed", collapse,
            f"the LR fell from {fmt(obs.lr_peak)} (step {obs.lr_peak_step}) to {fmt(obs.lr)}, "
            f"{fmt(1 / collapse if collapse > 0 else math.inf)}x lower",
            "check how often the scheduler steps: a per-epoch schedule (StepLR, "
            "MultiStepLR, ExponentialLR) stepped every batch decays far too fast",
        ))  # fmt: skip
    return out


#: remedy id -> (why it is left out, the fact that rules it out). One row, one test.
RULES_OUT: dict[str, list[tuple[str, Callable[[Observations], bool]]]] = {
    "lower_lr": [
        ("the LR is negative", lambda o: o.lr_negative),
        ("the gradients are not cleared", lambda o: o.grads_not_cleared),
        ("the LR is already scheduled down 1000x", lambda o: math.isfinite(o.lr_collapse)),
        ("the LR is 0", lambda o: o.lr_zero),
        ("the loss does not depend on the parameters", lambda o: o.loss_independent),
    ],
    "raise_lr": [
        ("the loss diverges", lambda o: "loss_diverging" in o.active),
        ("the gradients explode", lambda o: "exploding_gradients" in o.active),
        ("the LR is negative", lambda o: o.lr_negative),
        ("the loss does not depend on the parameters", lambda o: o.loss_independent),
    ],
    "add_clip": [
        ("the run clips already", lambda o: o.clips),
        ("the gradients are not cleared", lambda o: o.grads_not_cleared),
        ("the LR is negative", lambda o: o.lr_negative),
    ],
    "clip_bounds": [
        ("the clip never fired", lambda o: not o.clips or o.clip_rate == 0.0),
    ],
    "raise_max_norm": [
        ("the loss diverges", lambda o: "loss_diverging" in o.active),
        ("the gradients explode", lambda o: "exploding_gradients" in o.active),
    ],
    "fix_init": [
        ("the loss does not depend on the parameters", lambda o: o.loss_independent),
    ],
}


def ruled_out(remedy: str, obs: Observations) -> str | None:
    """Why ``remedy`` does not fit what was observed, or None when nothing rules it out."""
    for why, fact in RULES_OUT.get(remedy, ()):
        if fact(obs):
            return why
    return None


def remedy_text(obs: Observations, candidates: list[tuple[str, str]], *, numbered: bool = True) -> str:
    """The remedy of a finding: the observed causes' fixes first, then ``candidates``
    ((remedy id, text), most likely first) that the observations do not rule out."""
    steps = [c.remedy for c in observed_causes(obs)]
    steps += [text for rid, text in candidates if ruled_out(rid, obs) is None]
    if not steps:
        return ""
    if not numbered or len(steps) == 1:
        return "; ".join(steps)
    return "in this order: " + "; ".join(f"{i}) {s}" for i, s in enumerate(steps, 1))


def causes_sentence(obs: Observations) -> str:
    """`` Observed: ...`` naming each set-up cause with its number, or nothing."""
    causes = observed_causes(obs)
    return (" Observed: " + "; ".join(c.text for c in causes) + ".") if causes else ""


def causes_evidence(obs: Observations) -> dict[str, float]:
    """Each observed cause as an evidence entry (``cause_<code>``: its number)."""
    return {f"cause_{c.code}": c.value for c in observed_causes(obs)}
