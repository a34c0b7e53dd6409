"""Diagnose a recorded run after the fact, exactly as the live detectors would have.

``diagnose_run(run_dir)`` rebuilds full step records from ``scalars.bin`` and ``layers.bin`` (which
holds the per-layer block only for sampled steps and steps with a non-finite value) and feeds
them through the same pipeline. Parameter sizes are unknown offline, so rules that need them
(per-element gradient ratios, update/weight ratio) fall back or stay off.
"""

from __future__ import annotations

import os
from typing import Any

import numpy as np

from nnwatch.diagnosis.context import RunContext
from nnwatch.diagnosis.pipeline import Pipeline
from nnwatch.store.finding import Finding
from nnwatch.store.run_reader import Run, load_run
from nnwatch.store.schema import FieldName


def full_records(run: Run) -> tuple[np.ndarray, np.ndarray]:
    """(records, act_known): every step as a full record; act_known[i] tells if its layer block was logged."""
    schema = run.meta.schema
    dtype = schema.record_dtype()
    n = len(run.scalars)
    rec = np.zeros(n, dtype=dtype)
    for name in dtype.names or ():
        base = rec[name]
        base[...] = np.nan
    for name in run.scalars.dtype.names or ():
        rec[name] = run.scalars[name]
    known = np.zeros(n, dtype=bool)
    if len(run.layers) and n:
        steps = np.asarray(run.scalars[FieldName.STEP], dtype=np.int64)
        order = np.argsort(steps, kind="stable")
        lsteps = np.asarray(run.layers[FieldName.STEP], dtype=np.int64)
        pos = np.searchsorted(steps[order], lsteps)
        pos = np.clip(pos, 0, n - 1)
        idx = order[pos]
        ok = steps[idx] == lsteps
        for name in run.layers.dtype.names or ():
            if name != FieldName.STEP:
                rec[name][idx[ok]] = run.layers[name][ok]
        known[idx[ok]] = True
    return rec, known


def diagnose_run(run: Run | str | os.PathLike[str], **context: Any) -> list[Finding]:
    """Findings for a recorded run. ``context`` overrides RunContext fields (e.g. ``num_classes``)."""
    if not isinstance(run, Run):
        run = load_run(run)
    ctx = RunContext.from_meta(run.meta)
    if context:
        from dataclasses import replace

        ctx = replace(ctx, **context)
    rec, known = full_records(run)
    order = np.argsort(rec[FieldName.STEP], kind="stable")
    return Pipeline(ctx).feed(rec[order], known[order])
