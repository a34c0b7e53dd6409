"""One step record as plain Python numbers and small numpy views: what every detector reads.

Records arrive as rows of the run's structured dtype. Converting each scalar once, here, keeps the
detectors cheap (they run in the run-log writer thread and share the GIL with training) and lets
offline diagnosis feed them rows rebuilt from a run log, where a per-layer block may be missing.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from nnwatch.store.schema import sums_measured

_SCALARS = (
    "step",
    "loss",
    "grad_norm",
    "grad_norm_clipped",
    "clip_threshold",
    "amp_scale",
    "amp_skipped",
    "nonfinite_grads",
    "layer_stats",
    "samples_per_sec",
    "step_time",
    "grads_kept",
    "params_no_grad",
    "params_unoptimized",
    "update_frozen",
    "label_entropy",
    "label_mean",
    "label_var",
    "weight_drift",
)
_LAYER = ("act_sum", "act_mean", "act_std", "act_zero", "act_maxabs", "act_nonfinite", "act_dead")
#: what each measured update did, per parameter-owning layer (None on rows without an update)
_UPDATE = ("weight_layer", "update_layer", "frozen_layer")


class Row:
    """The fields of one step that detectors use. Per-layer arrays are None when not recorded."""

    __slots__ = (
        "step",
        "loss",
        "grad_norm",
        "grad_norm_clipped",
        "clip_threshold",
        "amp_scale",
        "amp_skipped",
        "nonfinite_grads",
        "lr",
        "sampled",
        "measured",
        "act_sum",
        "act_mean",
        "act_std",
        "act_zero",
        "act_maxabs",
        "act_nonfinite",
        "act_dead",
        "act_rows",
        "grad_layer",
        "batch_size",
        "grads_kept",
        "params_no_grad",
        "params_unoptimized",
        "update_frozen",
        "label_entropy",
        "label_mean",
        "label_var",
        "weight_drift",
        "weight_layer",
        "update_layer",
        "frozen_layer",
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
        lr = rows["lr"].reshape(n, int(np.prod(rows.dtype["lr"].shape))) if "lr" in names else np.zeros((n, 0))
        sampled = [v == 1.0 for v in cols.get("layer_stats", nan)]
        per_layer = {f: rows[f] for f in _LAYER if f in names}
        rows_seen = rows["act_rows"] if "act_rows" in names else None
        measured = sums_measured(rows)
        grad = rows["grad_layer"] if "grad_layer" in names else np.zeros((n, 0), np.float32)
        upd = {f: rows[f] for f in _UPDATE if f in names}
        updated = (
            np.isfinite(upd["update_layer"]).any(axis=1) if "update_layer" in upd
            else np.zeros(n, dtype=bool)
        )
        out: list[Row] = []
        for i in range(n):
            r = Row.__new__(Row)
            r.step = int(cols["step"][i])
            r.loss = cols["loss"][i]
            r.grad_norm = cols["grad_norm"][i]
            r.grad_norm_clipped = cols.get("grad_norm_clipped", nan)[i]
            r.clip_threshold = cols.get("clip_threshold", nan)[i]
            r.amp_scale = cols.get("amp_scale", nan)[i]
            r.amp_skipped = cols.get("amp_skipped", nan)[i]
            r.nonfinite_grads = cols.get("nonfinite_grads", nan)[i]
            r.lr = lr[i]
            r.sampled = sampled[i]
            sps, dt = cols.get("samples_per_sec", nan)[i], cols.get("step_time", nan)[i]
            r.batch_size = sps * dt if math.isfinite(sps) and math.isfinite(dt) else math.nan
            r.measured = bool(measured[i])
            known = (act_known is None or bool(act_known[i])) and r.measured
            r.act_sum = per_layer["act_sum"][i] if known and "act_sum" in per_layer else None
            r.act_rows = rows_seen[i] if known and rows_seen is not None else None
            if r.sampled and "act_zero" in per_layer:
                r.act_mean = per_layer["act_mean"][i] if "act_mean" in per_layer else None
                r.act_std = per_layer["act_std"][i]
                r.act_zero = per_layer["act_zero"][i]
                r.act_maxabs = per_layer["act_maxabs"][i]
                r.act_nonfinite = per_layer["act_nonfinite"][i]
                r.act_dead = per_layer["act_dead"][i] if "act_dead" in per_layer else None
            else:
                r.act_mean = r.act_std = r.act_zero = r.act_maxabs = r.act_nonfinite = None
                r.act_dead = None
            r.grad_layer = grad[i]
            r.grads_kept = cols.get("grads_kept", nan)[i]
            r.params_no_grad = cols.get("params_no_grad", nan)[i]
            r.params_unoptimized = cols.get("params_unoptimized", nan)[i]
            r.update_frozen = cols.get("update_frozen", nan)[i]
            r.label_entropy = cols.get("label_entropy", nan)[i]
            r.label_mean = cols.get("label_mean", nan)[i]
            r.label_var = cols.get("label_var", nan)[i]
            r.weight_drift = cols.get("weight_drift", nan)[i]
            if updated[i]:
                r.weight_layer = upd["weight_layer"][i]
                r.update_layer = upd["update_layer"][i]
                r.frozen_layer = upd["frozen_layer"][i]
            else:
                r.weight_layer = r.update_layer = r.frozen_layer = None
            out.append(r)
        return out

    @property
    def lr0(self) -> float:
        """The first parameter group's LR (NaN when unknown)."""
        return float(self.lr[0]) if self.lr.size else math.nan
