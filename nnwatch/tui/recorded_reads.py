"""What the monitor reads again from a recorded run when its own bounded picture has no rows for
the place the cursor is at (scrubbing far back): a :class:`Seekable` source answers at full
resolution. Kept apart from :class:`~nnwatch.tui.model.RunState`, which only asks when its
history and kept layer rows fall short.
"""

from __future__ import annotations

import math
from typing import Protocol, runtime_checkable

import numpy as np

from nnwatch.store.schema import FieldName
from nnwatch.tui.scalar_history import first_column

#: How many older per-layer rows a seekable source is asked for, looking back for a measured update.
UPDATE_LOOKBACK = 16


@runtime_checkable
class Seekable(Protocol):
    """A source that can read any part of its history again (a recorded run): used for scrubbing."""

    def scalars_between(self, first_step: float, last_step: float) -> np.ndarray: ...

    def layer_row_at(self, step: int) -> np.ndarray | None: ...


def updated(row: np.ndarray) -> bool:
    """Did this per-layer row measure an update (any layer's update norm finite)?"""
    return bool(np.isfinite(row[FieldName.UPDATE_LAYER]).any())


def last_measured(values: np.ndarray) -> float:
    """The last value that is not NaN (not measured); NaN when there is none. Inf counts."""
    ok = np.flatnonzero(~np.isnan(values))
    return float(values[ok[-1]]) if len(ok) else math.nan


def update_row_before(source: Seekable, at: float) -> np.ndarray | None:
    """The per-layer row of the last measured update at or before step ``at``, read from the
    source, looking back at most ``UPDATE_LOOKBACK`` rows; None if there is none."""
    for _ in range(UPDATE_LOOKBACK):
        if not math.isfinite(at) or at < 0:
            return None
        row = source.layer_row_at(int(at))
        if row is None:
            return None
        if updated(row):
            return row
        at = float(row["step"]) - 1
    return None


def value_before(source: Seekable, field: str, cursor: float, span: int, measured: bool) -> float:
    """``field`` at the cursor step, read from the last ``span`` steps of the source (with
    ``measured``: its last measured value); NaN when the source has none."""
    rows = source.scalars_between(cursor - span, cursor)
    col = first_column(rows[field]) if len(rows) else None
    if col is not None:
        if measured:  # the last measured value, as from the tail
            return last_measured(col)
        return float(col[-1])
    return math.nan
