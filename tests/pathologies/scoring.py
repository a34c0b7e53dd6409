"""Run suite cases and score the detectors: recall per kind, false alarms, detection delay.

A case is detected when a finding of its kind, of warning severity or worse, arrives at or after
its onset; the delay is the
finding's step minus the onset. Any finding on a healthy run is a false alarm, and so is any
finding on a sick run *before* its onset (the run was still healthy then). Findings of other kinds
on a sick run are listed but not scored: a NaN that follows an explosion is both.
"""

from __future__ import annotations

import math
import statistics
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

import nnwatch
from nnwatch.store.finding import Finding

from .common import Case

NOT_SCORED = {"snapshot_failed"}


@dataclass
class CaseOutcome:
    case: Case
    findings: list[Finding]
    onset: int | None
    seconds: float
    steps: int
    run_dir: Path
    error: str | None = None
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def scored(self) -> list[Finding]:
        return [f for f in self.findings if f.kind not in NOT_SCORED]

    @property
    def hit(self) -> Finding | None:
        if self.case.expect is None or self.onset is None:
            return None
        return next(  # an info finding is a note, not a diagnosis
            (
                f
                for f in self.scored
                if f.kind == self.case.expect and f.step >= self.onset and f.severity != "info"
            ),
            None,
        )

    @property
    def delay(self) -> int | None:
        h = self.hit
        return None if h is None or self.onset is None else h.step - self.onset

    @property
    def false_alarms(self) -> list[Finding]:
        if self.case.expect is None:  # info findings are notes, not alarms
            return [f for f in self.scored if f.severity != "info"]
        if self.onset is None:
            return []
        return [f for f in self.scored if f.step < self.onset]

    @property
    def other_kinds(self) -> list[str]:
        return sorted(
            {
                f.kind
                for f in self.scored
                if f.kind != self.case.expect and f not in self.false_alarms
            }
        )


def first_nonfinite_step(run_dir: Path) -> int | None:
    run = nnwatch.load_run(run_dir)
    bad = ~np.isfinite(run["loss"]) | (run["nonfinite_grads"] == 1.0)
    idx = np.flatnonzero(bad)
    return int(run["step"][idx[0]]) if idx.size else None


def run_case(case: Case, **watch_kwargs: Any) -> CaseOutcome:
    """Train one case with nnwatch attached (set NNWATCH_RUN_DIR first) and collect its findings."""
    kw = {"channel": False, **watch_kwargs}
    t0 = time.perf_counter()
    try:
        w = case.train(kw)
    except Exception as exc:  # noqa: BLE001 - a crashing case is reported, not fatal to the suite
        return CaseOutcome(
            case, [], case.onset, time.perf_counter() - t0, 0, Path(), error=repr(exc)
        )
    seconds = time.perf_counter() - t0
    if getattr(w, "disabled", None):
        return CaseOutcome(
            case, [], case.onset, seconds, 0, Path(), error=f"nnwatch was off: {w.disabled}"
        )
    findings = [f for f in w.findings if isinstance(f, Finding)]
    onset = case.onset if case.onset is not None else first_nonfinite_step(w.run_dir)
    return CaseOutcome(case, findings, onset, seconds, int(w.step_index), Path(w.run_dir))


def score(outcomes: list[CaseOutcome]) -> dict[str, Any]:
    """Recall per kind, false alarms on healthy runs (and before onset), median delay."""
    kinds = sorted({o.case.expect for o in outcomes if o.case.expect})
    per_kind: dict[str, dict[str, Any]] = {}
    delays: list[int] = []
    for k in kinds:
        cases = [o for o in outcomes if o.case.expect == k]
        hits = [o for o in cases if o.hit is not None]
        d = [o.delay for o in hits if o.delay is not None]
        delays += d
        per_kind[k] = {
            "cases": len(cases),
            "detected": len(hits),
            "recall": len(hits) / len(cases) if cases else math.nan,
            "median_delay": statistics.median(d) if d else math.nan,
            "max_delay": max(d) if d else math.nan,
        }
    healthy = [o for o in outcomes if o.case.expect is None]
    return {
        "per_kind": per_kind,
        "recall": sum(v["detected"] for v in per_kind.values())
        / max(1, sum(v["cases"] for v in per_kind.values())),
        "healthy_runs": len(healthy),
        "healthy_with_false_alarms": sum(1 for o in healthy if o.false_alarms),
        "false_alarms": sum(len(o.false_alarms) for o in outcomes),
        "median_delay": statistics.median(delays) if delays else math.nan,
        "errors": [o.case.name for o in outcomes if o.error],
    }
