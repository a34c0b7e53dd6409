"""One step record split into the rows the run log keeps: a scalar row, and a layer row when due.

The log writer (:mod:`nnwatch.store.runlog`), the loader that takes a crashed run's last steps
from its ring, the live monitors and the exporters all split ring records the same way, so the
split lives here on its own: pure numpy over a :class:`~nnwatch.store.schema.RunSchema`, with
the dtypes built once per schema.
"""

from __future__ import annotations

import functools

import numpy as np

from nnwatch.store.schema import FieldName, RunSchema, sums_measured


@functools.lru_cache(maxsize=16)
def schema_dtypes(schema: RunSchema) -> tuple[np.dtype, np.dtype]:
    """(scalar row, layer row) dtypes; building them costs more than a live poll, so once a run."""
    return schema.scalar_dtype(), schema.layer_row_dtype()


def split_records(rows: np.ndarray, schema: RunSchema) -> tuple[np.ndarray, np.ndarray]:
    """Full step records -> (scalar rows, layer rows), as the log stores them.

    A layer row is kept for steps whose per-layer stats were sampled (which hold the measured
    update too, in the default budget: a statistics step is measured when statistics are the
    rarer), and for any step that held a non-finite value, so that the origin of a NaN survives
    in the history. The live monitor splits ring records with this same function.
    """
    n = len(rows)
    scalar_dtype, row_dtype = schema_dtypes(schema)
    if not n:  # a read or a message that carried none (its dtype may be any)
        return np.zeros(0, scalar_dtype), np.zeros(0, row_dtype)
    rows = np.ascontiguousarray(rows)
    raw = rows.view(np.uint8).reshape(n, schema.record_size)
    scalars = np.empty(n, dtype=scalar_dtype)
    scalars.view(np.uint8).reshape(n, -1)[:] = raw[:, : schema.scalar_size]
    keep = (
        (rows[FieldName.LAYER_STATS] == 1.0)
        | (rows[FieldName.NONFINITE_GRADS] == 1.0)
        | (~np.isfinite(rows[FieldName.ACT_SUM]).all(axis=1) & sums_measured(rows))
    )
    layers = np.empty(int(keep.sum()), dtype=row_dtype)
    if len(layers):
        layers.view(np.uint8).reshape(len(layers), -1)[:, 8:] = raw[keep, schema.scalar_size :]
        layers[FieldName.STEP] = rows[FieldName.STEP][keep].astype(np.int64)
    return scalars, layers
