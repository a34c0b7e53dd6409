"""The contract every detector keeps: see one row at a time, return a finding or None.

Detectors run in the run-log writer thread. They must be cheap per row (a few scalar comparisons;
heavier statistics only on a fixed-size window), keep bounded memory, and never raise for odd
data: a NaN means "not measured" and is skipped, not reported.
"""

from __future__ import annotations

import math
from typing import ClassVar

from nnwatch.diagnosis.context import RunContext
from nnwatch.diagnosis.differential import causes_evidence
from nnwatch.diagnosis.history import RunHistory
from nnwatch.diagnosis.observed import Observations
from nnwatch.diagnosis.row import Row
from nnwatch.store.finding import Finding, fmt


class Detector:
    """Base class. Subclasses set ``kind`` and implement :meth:`update`."""

    kind: ClassVar[str] = ""

    def __init__(self, ctx: RunContext) -> None:
        self.ctx = ctx

    def update(self, row: Row, hist: RunHistory) -> Finding | None:
        """Look at one step. ``hist`` holds the steps before it."""
        raise NotImplementedError

    def report(
        self,
        row: Row,
        severity: str,
        summary: str,
        remedy: str,
        evidence: dict[str, float],
        *,
        layer: str | None = None,
        onset_step: int | None = None,
        obs: Observations | None = None,
    ) -> Finding:
        """The end every finding shares: this detector's kind, at this row's step. With ``obs``,
        each set-up cause the records show joins the evidence, after the detector's own numbers."""
        if obs is not None:
            evidence.update(causes_evidence(obs))
        return Finding(
            kind=self.kind,
            severity=severity,
            step=row.step,
            summary=summary,
            remedy=remedy,
            layer=layer,
            evidence=evidence,
            onset_step=onset_step,
        )


def lr_now(row: Row) -> str:
    """`` (now 0.1)`` when the run's LR is known, else nothing: a remedy never cites an unknown LR."""
    lr = row.lr0
    return f" (now {fmt(lr)})" if math.isfinite(lr) else ""
