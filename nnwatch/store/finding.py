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

#: The kinds the detectors emit. ``snapshot_failed`` reports nnwatch's own trouble, not the model's.
KINDS: tuple[str, ...] = (
    "exploding_gradients",
    "vanishing_gradients",
    "dead_relu",
    "nan_or_inf",
    "loss_stalled",
    "bad_initial_loss",
    "amp_scale_collapse",
    "oscillating_loss",
    "loss_diverging",
    "loss_spike",
    "clipping_misuse",
    "saturated_activation",
    "zero_gradient_layer",
    "snapshot_failed",
)


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
