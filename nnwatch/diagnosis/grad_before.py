"""The grad norms leading up to a snapshot's step, from the run log or the snapshot's metrics.

Apart from the batch report because it reads the run's history, not the batch: the report shows it
beside the batch so the failing step is seen with what came before it.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import numpy as np

from nnwatch.diagnosis.replay import ReplayError
from nnwatch.diagnosis.snapshot_files import load_npy
from nnwatch.store.run_reader import load_run
from nnwatch.store.schema import FieldName

#: Steps of grad-norm history shown before the snapshot's step.
GRAD_STEPS = 50


def grad_norms_before(
    snapshot_dir: Path, step: int, manifest: dict[str, Any], n: int = GRAD_STEPS
) -> tuple[np.ndarray, np.ndarray]:
    """The pre-clip grad norm of the ``n`` steps before ``step`` and of ``step`` itself.

    From the run log when the snapshot sits in its run directory (the full history), else from
    the snapshot's own ``metrics.npy`` (the last 500 steps). Unmeasured steps stay NaN."""
    for run_dir in (snapshot_dir.parent.parent, Path(manifest.get("run_dir") or "")):
        if not (run_dir / "scalars.bin").exists():
            continue
        try:
            run = load_run(run_dir)
            steps = np.asarray(run.steps, dtype=np.int64)
            norms = np.asarray(run[FieldName.GRAD_NORM], dtype=np.float64)
        except Exception:  # noqa: BLE001 - a damaged log: try the snapshot's own metrics
            continue
        keep = (steps >= step - n) & (steps <= step)
        if keep.any():
            return steps[keep], norms[keep]
    p = snapshot_dir / "metrics.npy"
    if os.path.lexists(p):
        try:
            rows = load_npy(p)  # never a link or a FIFO; no shape larger than the file
            steps = np.asarray(rows[FieldName.STEP], dtype=np.int64)
            norms = np.asarray(rows[FieldName.GRAD_NORM], dtype=np.float64)
        except (OSError, ValueError, KeyError, ReplayError):
            return np.zeros(0, dtype=np.int64), np.zeros(0)
        keep = (steps >= step - n) & (steps <= step)
        return steps[keep], norms[keep]
    return np.zeros(0, dtype=np.int64), np.zeros(0)
