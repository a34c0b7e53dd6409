"""A late monitor's history: the run log up to where the ring takes over, without a silent gap.

A monitor attaches to the ring first (so nothing published from then on can be missed without
being counted as dropped), then loads the run log. The log's writer thread drains every quarter second (sooner when a
quarter of the ring is queued; see :class:`~nnwatch.store.runlog.RunLogWriter`), so the log
normally reaches well into what the ring still holds, and the overlap is dropped by step. If the log was behind the ring's oldest record when it was read (a tiny ring,
a busy disk), the steps in between are read from the log again: by then it has them.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from nnwatch.store.run_reader import load_run
from nnwatch.store.schema import FieldName


def load_history(run_dir: Path) -> tuple[np.ndarray, np.ndarray] | None:
    """(scalars, layer rows) from the run log, or None when there is no readable log yet."""
    try:
        run = load_run(run_dir)
    except Exception:  # noqa: BLE001 - no log yet (before the first step) or unreadable
        return None
    return run.scalars, run.layers


def gap_rows(
    run_dir: Path, after_step: float, before_step: float
) -> tuple[np.ndarray, np.ndarray] | None:
    """Log rows with ``after_step < step < before_step``: what neither the first history read nor
    the ring delivered."""
    loaded = load_history(run_dir)
    if loaded is None:
        return None
    scalars, layers = loaded
    s = scalars[FieldName.STEP]
    l_steps = layers[FieldName.STEP]
    return (
        np.array(scalars[(s > after_step) & (s < before_step)]),
        np.array(layers[(l_steps > after_step) & (l_steps < before_step)]),
    )
