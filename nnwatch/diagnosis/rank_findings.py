"""The findings of the cross-rank check: replicas that drifted apart, and the rank that went
non-finite first.

The probe's consistency check (``nnwatch/probe/consistency.py``) compares checksums and first
non-finite steps across ranks; what that means, and what to do about it, is worded here, with the
other findings.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

from nnwatch.store.finding import Finding
from nnwatch.store.job_health import join_words as join

KIND_DIVERGENCE = "rank_divergence"
KIND_NONFINITE = "rank_nonfinite"


def divergence_finding(
    step: int, first: str, diverged: int, checked: int, odd: Sequence[int], world: int,
    rank: int, every: int, last_clean: int | None,
) -> Finding:
    """``diverged`` of ``checked`` parameter tensors differ across the ``world`` ranks, the first
    ``first``; ``odd`` are the ranks outside the majority ([] when there is none)."""
    if odd:
        many = len(odd) > 1
        who = f"rank{'s' if many else ''} {join(odd)} hold{'' if many else 's'} different weights than the other ranks"
    else:
        who = f"ranks {join(range(world))} do not agree (with {world} ranks it cannot tell which one drifted)"
    summary = (
        f"the data-parallel replicas diverged: {diverged} of {checked} parameter tensors differ "
        f"across ranks, first {first}; {who}. Checked every {every} optimizer steps."
    )
    if last_clean is not None:
        summary += f" The weights still agreed at step {last_clean}."
    remedy = (
        "look for code that changes weights on some ranks only (an edit under `if rank == 0`, "
        "a checkpoint loaded without a broadcast, parameters DDP does not manage), fix it, and "
        "restart from a checkpoint taken before this step: the ranks now train different models."
    )
    evidence = {"tensors_diverged": float(diverged), "tensors_checked": float(checked),
                "this_rank": float(rank)}  # fmt: skip
    evidence.update({f"odd_rank_{i}": float(x) for i, x in enumerate(odd)})
    finding = Finding(KIND_DIVERGENCE, "error", int(step), summary, remedy, layer=first, evidence=evidence)
    if last_clean is not None:
        finding = dataclasses.replace(finding, onset_step=last_clean + 1)
    return finding


def nonfinite_finding(step: int, bad: dict[int, int], world: int, rank: int) -> Finding:
    """``bad``: each rank that went non-finite -> its first non-finite step; the earliest are
    named as the origin, the others as carried over by the all-reduce."""
    first = min(bad.values())
    origin = sorted(i for i, s in bad.items() if s == first)
    later = sorted((i for i in bad if i not in origin), key=lambda i: (bad[i], i))
    s = "s" if len(origin) > 1 else ""
    summary = (
        f"rank{s} {join(origin)} went non-finite first, at step {first} (a NaN or Inf in "
        f"{'their' if s else 'its'} loss or activations)"
    )
    if later:
        summary += "; then " + ", ".join(f"rank {i} at step {bad[i]}" for i in later)
        summary += ", as the all-reduce carried the bad gradients over"
    clean = [i for i in range(world) if i not in bad]
    if clean:
        summary += f"; rank{'s' if len(clean) > 1 else ''} {join(clean)} still finite"
    summary += "."
    remedy = (
        f"open rank {origin[0]}'s run (its run directory ends in -r{origin[0]}) to see the first "
        f"non-finite layer, and check the batch rank {origin[0]} read at step {first} "
        "(its data shard)."
    )
    evidence = {f"rank_{i}_first_step": float(s) for i, s in bad.items()}
    evidence["this_rank"] = float(rank)
    evidence["origin_rank"] = float(origin[0])
    return Finding(KIND_NONFINITE, "error", int(step), summary, remedy, layer=None, evidence=evidence)
