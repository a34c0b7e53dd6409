"""What stands out across the ranks of one job, as findings a user can act on.

Judged from one summary row per rank (however the rows were gathered: this machine's files, SSH
to every node, or rank 0's job summary), against the job's own median, never a fixed scale:

- **straggler**: a rank whose usual step time is well above the job's median (with its host: a
  slow node, a throttled GPU, a busy data loader), or that lags the leading rank by several steps.
  Under DDP every rank waits in the gradient all-reduce for the slowest, so their wall step
  times converge; the lag and the pre-collective time still show the culprit when the job is not
  fully synchronous, and the heat strip shows it at a glance.
- **loss outlier**: one rank's loss far from the others' median, in units of their spread (a data
  sharding bug: a shard with wrong labels, another normalisation, duplicated samples).
- **grad norm outlier**: likewise for the gradient norm before clipping (DDP averages gradients,
  so this is the local norm before the all-reduce only where the probe saw it; after the
  all-reduce ranks agree, and a difference means the replicas differ).
- **first non-finite**: the rank whose loss or activations went NaN/Inf first.
- **died / holds the job**: from :mod:`nnwatch.store.job_health`, the rank that stopped first, or
  the one the others wait for in a collective, said before the collective's timeout.
- **replicas diverged**: the consistency check's findings, from any rank that reported them.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from nnwatch.store.schema import FieldName

#: A rank this many times slower than the job's median step time is a straggler ...
STRAGGLER_RATIO = 1.5
#: ... when it is also at least this much slower (seconds), so microsecond noise never counts.
STRAGGLER_MIN_S = 0.005
#: A value further than this many robust spreads (MAD) from the median is an outlier ...
OUTLIER_MADS = 6.0
#: ... and at least this far relatively (loss and grad norm wobble by rank on healthy jobs).
OUTLIER_REL = 0.5
#: Fewer ranks than this have no meaningful median to compare against.
MIN_RANKS = 3


#: A rank counts as behind at 2 steps, or a second of the job's steps in a fast job: ranks are
#: not read at one instant, and at 10 steps/s a rank read later is a step or two ahead.
LAG_STEPS = 2
LAG_S = 1.0


def lag_limit(steps_per_s: Iterable[float | None]) -> int:
    """How many steps behind the leading rank count as behind, for these ranks' rates."""
    rates = [float(x) for x in steps_per_s if x is not None and math.isfinite(x) and x > 0]
    return max(LAG_STEPS, math.ceil(LAG_S * float(np.median(rates)))) if rates else LAG_STEPS


@dataclass(frozen=True)
class JobFinding:
    """One job-level finding: what, which ranks (and hosts), in plain words."""

    kind: str  # straggler, loss_outlier, grad_outlier, first_nonfinite, rank_stopped, diverged
    severity: str  # error or warning
    ranks: tuple[int, ...]
    summary: str
    hosts: tuple[str, ...] = ()

    def to_dict(self) -> dict[str, Any]:
        return {"kind": self.kind, "severity": self.severity, "ranks": list(self.ranks),
                "summary": self.summary, "hosts": list(self.hosts)}  # fmt: skip


def _finite(values: Iterable[float]) -> np.ndarray:
    a = np.asarray([float(v) for v in values], dtype=np.float64)
    return a[np.isfinite(a)]


def outliers(values: Sequence[float]) -> tuple[list[int], float]:
    """Indices of the values far from the median (see OUTLIER_MADS, OUTLIER_REL), and the median.

    The spread is the median absolute deviation, floored at 1% of the median, so a job whose
    ranks agree to the last digit does not make a tiny wobble look huge."""
    a = np.asarray([float(v) for v in values], dtype=np.float64)
    ok = np.isfinite(a)
    if ok.sum() < MIN_RANKS:
        return [], math.nan
    med = float(np.median(a[ok]))
    mad = float(np.median(np.abs(a[ok] - med)))
    spread = max(mad, 0.01 * abs(med), 1e-12)
    far = ok & (np.abs(a - med) > OUTLIER_MADS * spread) & (np.abs(a - med) > OUTLIER_REL * abs(med))
    return [int(i) for i in np.flatnonzero(far)], med


def _ranks(ranks: Sequence[int]) -> str:
    items = [str(r) for r in ranks]
    if len(items) > 6:
        items = [*items[:5], f"… ({len(ranks)} ranks)"]
    joined = items[0] if len(items) == 1 else ", ".join(items[:-1]) + " and " + items[-1]
    return f"rank{'s' if len(ranks) > 1 else ''} {joined}"


def _hosts(rows: Sequence[Any], ranks: Iterable[int]) -> tuple[str, ...]:
    by_rank = {r.rank: r.host for r in rows}
    return tuple(sorted({str(by_rank.get(r) or "?") for r in ranks}))


def job_findings(
    rows: Sequence[Any],
    *,
    nan_origin: Sequence[int] = (),
    stops: Any = None,
    cross_rank: Iterable[dict[str, Any]] = (),
) -> tuple[JobFinding, ...]:
    """The job-level findings for one poll's rows (``RankSummary``), most urgent first."""
    out: list[JobFinding] = []
    if stops is not None and str(getattr(stops, "summary", None) or ""):
        who = tuple(stops.first or stops.holders)
        out.append(JobFinding("rank_stopped", "error", who, stops.summary, _hosts(rows, who)))
    if nan_origin and len(nan_origin) < len(rows):
        first = min((r.nonfinite_step for r in rows if r.rank in nan_origin and r.nonfinite_step
                     is not None), default=None)  # fmt: skip
        at = f" at step {first}" if first is not None else ""
        out.append(JobFinding(
            "first_nonfinite", "error", tuple(nan_origin),
            f"{_ranks(nan_origin)} went non-finite first{at} (on {', '.join(_hosts(rows, nan_origin))}); "
            "the others followed through the gradient all-reduce: check that rank's data shard",
            _hosts(rows, nan_origin),
        ))  # fmt: skip
    seen: set[str] = set()
    for ev in cross_rank:
        if ev.get("kind") != "rank_divergence" or "rank_divergence" in seen:
            continue
        seen.add("rank_divergence")
        odd = tuple(int(v) for k, v in sorted((ev.get("evidence") or {}).items())
                    if k.startswith("odd_rank_") and v is not None)  # fmt: skip
        out.append(JobFinding("diverged", "error", odd, str(ev.get("summary") or ev.get("message")),
                              _hosts(rows, odd)))  # fmt: skip
    live = [r for r in rows if getattr(r, "reachable", True)]
    out += _stragglers(rows, live) + _outliers(rows, live)
    return tuple(out)


def _stragglers(rows: Sequence[Any], live: list[Any]) -> list[JobFinding]:
    """The ranks whose steps take far longer than the job's median (fewer than half of them)."""
    out: list[JobFinding] = []
    times = [getattr(r, FieldName.STEP_TIME, math.nan) for r in live]
    ok = _finite(times)
    if len(ok) >= 2:
        med = float(np.median(ok))
        slow = [r for r, t in zip(live, times, strict=True)
                if math.isfinite(t) and t > STRAGGLER_RATIO * med and t - med > STRAGGLER_MIN_S]  # fmt: skip
        if slow and len(slow) <= len(live) // 2:
            worst = max(slow, key=lambda r: r.step_time)
            out.append(JobFinding(
                "straggler", "warning", tuple(r.rank for r in slow),
                f"{_ranks([r.rank for r in slow])} step{'s' if len(slow) == 1 else ''} slower than "
                f"the job: rank {worst.rank} on {worst.host} takes {worst.step_time * 1e3:.0f} ms a "
                f"step against a median of {med * 1e3:.0f} ms ({worst.step_time / med:.1f}x)",
                _hosts(rows, [r.rank for r in slow]),
            ))  # fmt: skip
    return out


def _outliers(rows: Sequence[Any], live: list[Any]) -> list[JobFinding]:
    """The ranks whose loss or gradient norm sits far from the job's median (a third at most)."""
    out: list[JobFinding] = []
    for field, kind, what in (("loss", "loss_outlier", "loss"),
                              (FieldName.GRAD_NORM, "grad_outlier", "gradient norm")):  # fmt: skip
        values = [getattr(r, field) if r.nonfinite_step is None else math.nan for r in live]
        idx, med = outliers(values)
        if idx and len(idx) <= len(live) // 3:
            far = [live[i] for i in idx]
            vals = ", ".join(f"rank {r.rank}: {getattr(r, field):.4g}" for r in far[:4])
            hint = (" (a data-sharding bug? one shard's labels or normalisation differ)"
                    if kind == "loss_outlier" else "")  # fmt: skip
            out.append(JobFinding(
                kind, "warning", tuple(r.rank for r in far),
                f"{_ranks([r.rank for r in far])}: {what} far from the job's median {med:.4g} "
                f"({vals}){hint}", _hosts(rows, [r.rank for r in far]),
            ))  # fmt: skip
    return out
