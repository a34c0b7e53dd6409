"""One step record as plain Python numbers and small numpy views: what every detector reads.

Records arrive as rows of the run's structured dtype. Converting each scalar once, here, keeps the
detectors cheap (they run in the run-log writer thread and share the GIL with training) and lets
offline diagnosis feed them rows rebuilt from a run log, where a per-layer block may be missing.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from nnwatch.store.schema import (
    ACT_SUM_FIELD,
    DEV_FIELDS,
    HOST_FIELDS,
    LAYER_FIELDS_ACT,
    LAYER_FIELDS_UPDATE,
    FieldName,
    sums_measured,
)

#: The record's scalars a detector reads: every one of the schema's but those only monitors show
#: (the clock, memory, CPU, the clip bit the norms already tell, the budget's measured flag).
_NOT_READ = frozenset({
    FieldName.TIME, FieldName.CUDA_ALLOCATED, FieldName.CUDA_RESERVED, FieldName.CUDA_PEAK,
    FieldName.CPU_PERCENT, FieldName.RSS, FieldName.LAYER_SUMS, FieldName.CLIPPED,
})
_SCALARS = tuple(f for f in (*HOST_FIELDS, *DEV_FIELDS) if f not in _NOT_READ)
_LAYER = (ACT_SUM_FIELD, *LAYER_FIELDS_ACT)
#: what each measured update did, per parameter-owning layer (None on rows without an update)
_UPDATE = LAYER_FIELDS_UPDATE


class Row:
    """The fields of one step that detectors use. Per-layer arrays are None when not recorded."""

    __slots__ = (
        FieldName.STEP,
        FieldName.LOSS,
        FieldName.GRAD_NORM,
        FieldName.GRAD_NORM_CLIPPED,
        FieldName.CLIP_THRESHOLD,
        FieldName.AMP_SCALE,
        FieldName.AMP_SKIPPED,
        FieldName.NONFINITE_GRADS,
        FieldName.LR,
        "sampled",
        "measured",
        FieldName.ACT_SUM,
        FieldName.ACT_MEAN,
        FieldName.ACT_STD,
        FieldName.ACT_ZERO,
        FieldName.ACT_MAXABS,
        FieldName.ACT_NONFINITE,
        FieldName.ACT_DEAD,
        FieldName.ACT_ROWS,
        FieldName.GRAD_LAYER,
        "batch_size",
        FieldName.GRADS_KEPT,
        FieldName.PARAMS_NO_GRAD,
        FieldName.PARAMS_UNOPTIMIZED,
        FieldName.UPDATE_FROZEN,
        FieldName.LABEL_ENTROPY,
        FieldName.LABEL_MEAN,
        FieldName.LABEL_VAR,
        FieldName.WEIGHT_DRIFT,
        FieldName.WEIGHT_LAYER,
        FieldName.UPDATE_LAYER,
        FieldName.FROZEN_LAYER,
    )
    step: int
    loss: float
    grad_norm: float
    grad_norm_clipped: float
    clip_threshold: float
    amp_scale: float
    amp_skipped: float
    nonfinite_grads: float
    lr: np.ndarray
    sampled: bool
    measured: bool
    act_sum: np.ndarray | None
    act_mean: np.ndarray | None
    act_std: np.ndarray | None
    act_zero: np.ndarray | None
    act_maxabs: np.ndarray | None
    act_nonfinite: np.ndarray | None
    act_dead: np.ndarray | None
    """Rectifier layers: the fraction of units zero for every input of the batch (NaN others)."""
    act_rows: np.ndarray | None
    """Measured steps: rows each layer's outputs had (0: the layer did not run); None if unknown."""
    grad_layer: np.ndarray
    batch_size: float
    grads_kept: float
    """1.0: this step's backward added to the last update's gradients (no zero_grad between)."""
    params_no_grad: float
    """Measured updates: the share of the optimizer's trainable elements without a gradient."""
    params_unoptimized: float
    """Measured updates: the share of the model's gradient-carrying elements in no group."""
    update_frozen: float
    """Measured updates: the share of sampled elements the update left unchanged."""
    label_entropy: float
    """Measured steps of a classifier: the entropy of the batch's labels (nats)."""
    label_mean: float
    """... the mean of the batch's class indices."""
    label_var: float
    """... their variance."""
    weight_drift: float
    """Measured updates: ||w - w_start|| since the first measured update."""
    weight_layer: np.ndarray | None
    """Per parameter-owning layer, on a measured update: the weights' norm after it."""
    update_layer: np.ndarray | None
    """... the norm of the change the update made."""
    frozen_layer: np.ndarray | None
    """... the share of sampled elements it left unchanged."""

    def __init__(self, rec: Any, act_known: bool = True) -> None:
        """One row from a single structured record (see :meth:`batch` for many at once)."""
        rows = np.asarray(rec).reshape(1)
        other = Row.batch(rows, None if act_known else np.zeros(1, dtype=bool))[0]
        for name in Row.__slots__:
            setattr(self, name, getattr(other, name))

    @staticmethod
    def batch(rows: np.ndarray, act_known: np.ndarray | None = None) -> list[Row]:
        """Rows from a structured array, converting column by column (much cheaper than per field)."""
        names = rows.dtype.names or ()
        n = len(rows)
        cols = {f: rows[f].astype(np.float64).tolist() for f in _SCALARS if f in names}
        nan = [math.nan] * n
        # the width from the dtype, not -1: a log of 0 readable rows must give 0 rows, not fail
        lr = rows[FieldName.LR].reshape(n, int(np.prod(rows.dtype[FieldName.LR].shape))) if FieldName.LR in names else np.zeros((n, 0))
        sampled = [v == 1.0 for v in cols.get(FieldName.LAYER_STATS, nan)]
        per_layer = {f: rows[f] for f in _LAYER if f in names}
        rows_seen = rows[FieldName.ACT_ROWS] if FieldName.ACT_ROWS in names else None
        measured = sums_measured(rows)
        grad = rows[FieldName.GRAD_LAYER] if FieldName.GRAD_LAYER in names else np.zeros((n, 0), np.float32)
        upd = {f: rows[f] for f in _UPDATE if f in names}
        updated = (
            np.isfinite(upd[FieldName.UPDATE_LAYER]).any(axis=1) if FieldName.UPDATE_LAYER in upd
            else np.zeros(n, dtype=bool)
        )
        out: list[Row] = []
        for i in range(n):
            r = Row.__new__(Row)
            r.step = int(cols[FieldName.STEP][i])
            r.loss = cols[FieldName.LOSS][i]
            r.grad_norm = cols[FieldName.GRAD_NORM][i]
            r.grad_norm_clipped = cols.get(FieldName.GRAD_NORM_CLIPPED, nan)[i]
            r.clip_threshold = cols.get(FieldName.CLIP_THRESHOLD, nan)[i]
            r.amp_scale = cols.get(FieldName.AMP_SCALE, nan)[i]
            r.amp_skipped = cols.get(FieldName.AMP_SKIPPED, nan)[i]
            r.nonfinite_grads = cols.get(FieldName.NONFINITE_GRADS, nan)[i]
            r.lr = lr[i]
            r.sampled = sampled[i]
            sps, dt = cols.get(FieldName.SAMPLES_PER_SEC, nan)[i], cols.get(FieldName.STEP_TIME, nan)[i]
            r.batch_size = sps * dt if math.isfinite(sps) and math.isfinite(dt) else math.nan
            r.measured = bool(measured[i])
            known = (act_known is None or bool(act_known[i])) and r.measured
            r.act_sum = per_layer[FieldName.ACT_SUM][i] if known and FieldName.ACT_SUM in per_layer else None
            r.act_rows = rows_seen[i] if known and rows_seen is not None else None
            _fill_activations(r, per_layer, i)
            r.grad_layer = grad[i]
            r.grads_kept = cols.get(FieldName.GRADS_KEPT, nan)[i]
            r.params_no_grad = cols.get(FieldName.PARAMS_NO_GRAD, nan)[i]
            r.params_unoptimized = cols.get(FieldName.PARAMS_UNOPTIMIZED, nan)[i]
            r.update_frozen = cols.get(FieldName.UPDATE_FROZEN, nan)[i]
            r.label_entropy = cols.get(FieldName.LABEL_ENTROPY, nan)[i]
            r.label_mean = cols.get(FieldName.LABEL_MEAN, nan)[i]
            r.label_var = cols.get(FieldName.LABEL_VAR, nan)[i]
            r.weight_drift = cols.get(FieldName.WEIGHT_DRIFT, nan)[i]
            _fill_update(r, upd, i, bool(updated[i]))
            out.append(r)
        return out

    @property
    def lr0(self) -> float:
        """The first parameter group's LR (NaN when unknown)."""
        return float(self.lr[0]) if self.lr.size else math.nan


def _fill_activations(r: Row, per_layer: dict[str, np.ndarray], i: int) -> None:
    """Row ``i``'s activation statistics: only a sampled step recorded them, so any other row
    gets None rather than the block's placeholder values."""
    if r.sampled and FieldName.ACT_ZERO in per_layer:
        r.act_mean = per_layer[FieldName.ACT_MEAN][i] if FieldName.ACT_MEAN in per_layer else None
        r.act_std = per_layer[FieldName.ACT_STD][i]
        r.act_zero = per_layer[FieldName.ACT_ZERO][i]
        r.act_maxabs = per_layer[FieldName.ACT_MAXABS][i]
        r.act_nonfinite = per_layer[FieldName.ACT_NONFINITE][i]
        r.act_dead = per_layer[FieldName.ACT_DEAD][i] if FieldName.ACT_DEAD in per_layer else None
    else:
        r.act_mean = r.act_std = r.act_zero = r.act_maxabs = r.act_nonfinite = None
        r.act_dead = None


def _fill_update(r: Row, upd: dict[str, np.ndarray], i: int, updated: bool) -> None:
    """Row ``i``'s per-layer update block: None on a row without a measured update, so that
    detectors never read the empty block's NaNs as an update."""
    if updated:
        r.weight_layer = upd[FieldName.WEIGHT_LAYER][i]
        r.update_layer = upd[FieldName.UPDATE_LAYER][i]
        r.frozen_layer = upd[FieldName.FROZEN_LAYER][i]
    else:
        r.weight_layer = r.update_layer = r.frozen_layer = None
