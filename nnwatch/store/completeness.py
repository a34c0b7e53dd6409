"""What a recorded run's log is missing, judged against what the run itself wrote down.

The rows in ``scalars.bin`` are only part of the story: ``end.json`` says how many steps the run
took, how many records it could not write and why its log stopped, and ``events.jsonl`` holds the
findings the detectors made live, on records the log may no longer have (a full disk, a truncated
copy). A verdict on the log alone would call such a run healthy. :func:`audit` puts the three
side by side, so that ``nnwatch check`` can say what is missing and fail on anything it cannot
rule out.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from nnwatch.store.events import FindingEvent, LogFailed
from nnwatch.store.run_reader import Run
from nnwatch.store.schema import FieldName

#: Findings of these severities, recorded live in events.jsonl, make a run fail its check.
SERIOUS = ("error", "critical")
#: load_run warnings that only describe a recovery, not a loss or damage.
_BENIGN = ("recovered the last",)


@dataclass
class Audit:
    """The gaps and damage found in one recorded run, in plain words."""

    steps_expected: int | None  # from end.json (None while running, or without end.json)
    steps_in_log: int
    missing_steps: int
    #: errors a check cannot rule out: missing steps, lost records, a failed log, damaged rows
    problems: list[str] = field(default_factory=list)
    #: things worth knowing that are not errors (still running, interrupted, recovered steps)
    notes: list[str] = field(default_factory=list)
    #: error and critical findings the run recorded live in events.jsonl
    recorded_findings: list[FindingEvent] = field(default_factory=list)


def audit(run: Run) -> Audit:
    """Compare the log's rows with ``end.json`` and ``events.jsonl``; see :class:`Audit`."""
    steps = np.asarray(run.scalars[FieldName.STEP], dtype=np.float64) if len(run.scalars) else np.zeros(0)
    steps = steps[np.isfinite(steps)]
    present = np.unique(steps.astype(np.int64)) if len(steps) else np.zeros(0, np.int64)
    end = run.end or {}
    expected = end.get("steps") if isinstance(end.get("steps"), int) else None
    result = Audit(steps_expected=expected, steps_in_log=len(run.scalars), missing_steps=0)
    problems, notes = result.problems, result.notes
    if run.status == "running":
        notes.append("the run is still running: its log is read as far as it goes")
    elif not end:
        problems.append(
            "the run never finished: it has no end.json (killed, crashed, or the disk filled "
            "up at its end); its last steps may be missing"
        )
    elif end.get("status") == "crashed":
        problems.append(f"the run crashed: {end.get('reason') or end.get('error') or 'see events'}")
    elif end.get("status") in ("interrupted", "stopped"):
        notes.append(f"the run was {end.get('status')}")
    if expected is not None:
        start = _start_step(run, present)
        span = max(0, expected - start)
        inside = present[(present >= start) & (present < expected)]
        result.missing_steps = max(0, span - len(inside))
        if result.missing_steps:
            problems.append(
                f"the log holds {len(inside)} of {span} steps ({start}-{expected - 1}): "
                f"{result.missing_steps} missing{_ranges(start, expected, inside)}"
            )
    lost = end.get("lost_records")
    if isinstance(lost, int) and not isinstance(lost, bool) and lost > 0:
        problems.append(f"end.json says {lost} record(s) were lost (not written to the log)")
    if isinstance(end.get("log_error"), str) and end["log_error"]:
        problems.append(f"the run log stopped during the run: {end['log_error']}")
    for ev in run.events:
        if isinstance(ev, LogFailed):
            text = ev.error or "the run log stopped"
            if not any(text in p for p in problems):
                problems.append(f"the run log stopped during the run: {text}")
        elif isinstance(ev, FindingEvent) and ev.finding.severity in SERIOUS:
            result.recorded_findings.append(ev)
    for warning in run.warnings:
        (notes if warning.startswith(_BENIGN) else problems).append(warning)
    return result


def _start_step(run: Run, present: np.ndarray) -> int:
    start = (run.meta.extra or {}).get("start_step")
    if isinstance(start, int) and not isinstance(start, bool) and start >= 0:
        return start
    return int(present[0]) if len(present) else 0


def _ranges(start: int, stop: int, inside: np.ndarray, limit: int = 4) -> str:
    """The missing steps as ranges, at most ``limit`` of them: ": steps 1200-2639"."""
    if len(inside) == 0:
        return ""
    edges = np.concatenate([[start - 1], inside, [stop]])
    gaps = [(int(a) + 1, int(b) - 1) for a, b in zip(edges[:-1], edges[1:], strict=True) if b - a > 1]
    shown = ", ".join(f"{a}" if a == b else f"{a}-{b}" for a, b in gaps[:limit])
    more = f" and {len(gaps) - limit} more gap(s)" if len(gaps) > limit else ""
    return f": steps {shown}{more}" if shown else ""
