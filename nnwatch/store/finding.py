"""What a detector says: one frozen record per problem episode, readable by people and programs.

A finding answers three questions a user asks when training goes wrong: what is wrong (``kind``),
where (``step``, ``layer``) and what to do (``remedy``). The ``evidence`` holds the numbers the
verdict rests on, so that a user, a monitor or a test can check the reasoning instead of trusting it.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

SEVERITIES: tuple[str, ...] = ("info", "warning", "error", "critical")

@dataclass(frozen=True)
class KindSpec:
    """What a kind of finding means, and the severities it is reported at."""

    severities: tuple[str, ...]
    description: str


#: Every kind of finding nnwatch emits, with its severities and meaning (docs/detectors.md says
#: more). ``tests/unit/test_kinds.py`` reads the package for every kind a finding is made with and
#: fails on one missing here. ``snapshot_failed`` and ``nnwatch_error`` report nnwatch's own
#: trouble, not the model's.
KIND_SPECS: Mapping[str, KindSpec] = {
    "exploding_gradients": KindSpec(
        ("info", "warning", "error", "critical"),
        "the grad norm jumped far above its own recent range while the loss got worse",
    ),
    "vanishing_gradients": KindSpec(("error",), "the global norm, or the first layers' share of it, collapsed"),
    "dead_relu": KindSpec(("warning", "error"), "most units of a ReLU layer are zero for every input"),
    "nan_or_inf": KindSpec(
        ("error", "critical"), "a non-finite loss, activation or gradient, with the first module that produced it"
    ),
    "loss_stalled": KindSpec(("info", "warning"), "no progress, with the mechanism the records show"),
    "bad_initial_loss": KindSpec(("warning",), "the first loss is far from ln(K) for a plain cross-entropy"),
    "amp_scale_collapse": KindSpec(("error",), "the AMP loss scale keeps falling once calibration is over"),
    "oscillating_loss": KindSpec(("warning",), "the loss swings far more than its own noise level"),
    "loss_diverging": KindSpec(
        ("info", "warning", "error"), "the loss keeps rising against the run's own earlier level"
    ),
    "loss_spike": KindSpec(("warning",), "one isolated jump of the loss that came back down"),
    "clipping_misuse": KindSpec(
        ("warning", "error"), "a clip threshold of 0, one that clips every step, or a clip before unscale_"
    ),
    "saturated_activation": KindSpec(("warning",), "a Tanh or Sigmoid layer pinned at its limits"),
    "zero_gradient_layer": KindSpec(("info", "warning"), "a layer that gets exactly zero (or no) gradient"),
    "grads_not_cleared": KindSpec(
        ("error",), "the last update's gradients were still there when the next backward added to them"
    ),
    "lr_negative": KindSpec(("error",), "an LR below 0: every update climbs the gradient"),
    "adversarial_imbalance": KindSpec(("warning",), "one side of a GAN has won: its loss sits near zero"),
    "rank_divergence": KindSpec(("error",), "replicas of a distributed job that drifted apart"),
    "rank_nonfinite": KindSpec(("error",), "the rank of a distributed job that first went non-finite"),
    "snapshot_failed": KindSpec(("error",), "nnwatch could not write a snapshot"),
    "nnwatch_error": KindSpec(("error",), "nnwatch's own trouble (its run log failed, a full disk); training goes on"),
}

#: The kinds' names, in the order above.
KINDS: tuple[str, ...] = tuple(KIND_SPECS)


def _number(value: Any) -> float | int | str | None:
    """Evidence as JSON numbers: NaN becomes null and infinities the strings "inf"/"-inf"."""
    if isinstance(value, bool):
        return int(value)
    if isinstance(value, int):
        return value
    try:
        f = float(value)
    except (TypeError, ValueError):
        return None
    if math.isnan(f):
        return None
    if math.isinf(f):
        return "inf" if f > 0 else "-inf"
    return f


@dataclass(frozen=True)
class Finding:
    """One diagnosed problem. ``message`` is the full sentence shown to users (it ends with the remedy)."""

    kind: str
    severity: str
    step: int
    summary: str
    remedy: str
    layer: str | None = None
    evidence: Mapping[str, float] = field(default_factory=dict)
    onset_step: int | None = None
    """First step of the episode (when the condition started), which can precede ``step``."""

    def __post_init__(self) -> None:
        if self.severity not in SEVERITIES:
            raise ValueError(f"severity must be one of {SEVERITIES}, got {self.severity!r}")

    @property
    def message(self) -> str:
        where = f" in `{self.layer}`" if self.layer else ""
        return f"step {self.step}: {self.kind.replace('_', ' ')}{where}: {self.summary} Fix: {self.remedy}"

    def to_dict(self) -> dict[str, Any]:
        return {
            "kind": self.kind,
            "severity": self.severity,
            "step": int(self.step),
            "onset_step": None if self.onset_step is None else int(self.onset_step),
            "layer": self.layer,
            "evidence": {str(k): _number(v) for k, v in self.evidence.items()},
            "summary": self.summary,
            "remedy": self.remedy,
            "message": self.message,
        }

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> Finding:
        """Rebuild a finding from ``to_dict()`` output or an events.jsonl line."""
        evidence: dict[str, float] = {}
        for k, v in dict(d.get("evidence") or {}).items():
            if v is None:
                evidence[k] = math.nan
            elif isinstance(v, str):
                evidence[k] = float(v) if v in ("inf", "-inf") else math.nan
            else:
                evidence[k] = float(v)
        onset = d.get("onset_step")
        return cls(
            kind=str(d["kind"]),
            severity=str(d.get("severity", "warning")),
            step=int(d.get("step", 0)),
            summary=str(d.get("summary", d.get("message", ""))),
            remedy=str(d.get("remedy", "")),
            layer=d.get("layer"),
            evidence=evidence,
            onset_step=None if onset is None else int(onset),
        )


def fmt(x: float) -> str:
    """A number the way a person reads it in a sentence: 3 significant digits, e.g. 0.0123 or 4.1e+05."""
    if x is None or (isinstance(x, float) and math.isnan(x)):
        return "n/a"
    if math.isinf(x):
        return "inf" if x > 0 else "-inf"
    ax = abs(x)
    if ax != 0 and (ax >= 1e5 or ax < 1e-3):
        return f"{x:.2e}"
    return f"{x:.3g}"
