"""The bundled pathology suite: small real training runs, two or more per kind, plus healthy runs.

``CASES`` lists them all; :func:`run_case` trains one with nnwatch attached and returns what the
detectors said, and :func:`score` turns outcomes into recall per kind, false alarms and delays.
``bench/detection.py`` prints the table; ``tests/integration/test_diagnosis_suite.py`` asserts the targets.
"""

from __future__ import annotations

from . import (
    amp,
    clipping,
    dead,
    diverging,
    exploding,
    healthy,
    healthy_extra,
    healthy_mechanisms,
    healthy_more,
    initial_loss,
    mechanisms,
    nonfinite,
    oscillating,
    saturated,
    spikes,
    stalled,
    vanishing,
    zero_grad,
)
from .common import Case
from .scoring import CaseOutcome, run_case, score

SICK_CASES: list[Case] = [
    *exploding.CASES,
    *vanishing.CASES,
    *dead.CASES,
    *nonfinite.CASES,
    *stalled.CASES,
    *initial_loss.CASES,
    *amp.CASES,
    *oscillating.CASES,
    *diverging.CASES,
    *spikes.CASES,
    *clipping.CASES,
    *zero_grad.CASES,
    *saturated.CASES,
    *mechanisms.CASES,
]
HEALTHY_CASES: list[Case] = [
    *healthy.CASES, *healthy_more.CASES, *healthy_extra.CASES, *healthy_mechanisms.CASES,
]  # fmt: skip
CASES: list[Case] = [*SICK_CASES, *HEALTHY_CASES]

__all__ = ["CASES", "HEALTHY_CASES", "SICK_CASES", "Case", "CaseOutcome", "run_case", "score"]
