"""Diagnosis: turn the probe's numbers into answers (what is wrong, where, what to do).

* :class:`Diagnosis`: the detectors attached to a live run (created by ``watch(..., detectors=True)``).
* :class:`Finding`: one diagnosed problem, with its evidence and remedy.
* :func:`diagnose_run`: the same detectors over a recorded run.
* :mod:`nnwatch.diagnosis.snapshot` and :mod:`nnwatch.diagnosis.replay`: capture a failing step and
  re-run it bit for bit (``replay``, ``load_snapshot``).

Nothing here imports a UI library; torch is imported only where a model is touched.
"""

from __future__ import annotations

from nnwatch.diagnosis.live import Diagnosis
from nnwatch.diagnosis.offline import diagnose_run
from nnwatch.diagnosis.replay import ReplayError, ReplayResult, Snapshot, load_snapshot, replay
from nnwatch.store.finding import KINDS, SEVERITIES, Finding

__all__ = [
    "KINDS",
    "SEVERITIES",
    "Diagnosis",
    "Finding",
    "ReplayError",
    "ReplayResult",
    "Snapshot",
    "diagnose_run",
    "load_snapshot",
    "replay",
]
