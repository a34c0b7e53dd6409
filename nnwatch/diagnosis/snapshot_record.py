"""A snapshot's ``record.json``: the step's own loss and norms as the probe recorded them, and
their float32 bits, which a replay must reproduce exactly. The record reaches the run log a step
or so after the snapshot was written, so it is added then (:class:`SnapshotRecords`)."""

from __future__ import annotations

import contextlib
import json
import math
import threading
from pathlib import Path
from typing import Any

import numpy as np

from nnwatch.store.clean_text import loads
from nnwatch.store.paths import write_private_file
from nnwatch.store.safe_read import read_small_file
from nnwatch.store.schema import FieldName

RECORD = "record.json"


class SnapshotRecords:
    """The snapshots of one run still waiting for their step's record, which the run log brings
    a step or so after the snapshot was written. The snapshot taker tells it of each snapshot
    (:meth:`expect`) and registers it with the detectors, which pass every batch of records on
    (:meth:`observe`, in the writer thread): ``record.json`` is then written into the snapshot."""

    def __init__(self) -> None:
        self._lock = threading.Lock()  # the training thread expects, the writer thread observes
        self._waiting: dict[int, Path] = {}

    def expect(self, step: int, path: Path) -> None:
        with self._lock:
            self._waiting[step] = path

    def observe(self, rows: np.ndarray) -> None:
        """Write ``record.json`` into the snapshots whose step is among ``rows``."""
        with self._lock:
            if not self._waiting:
                return
            steps = rows[FieldName.STEP]
            hits = [(s, self._waiting.pop(s)) for s in list(self._waiting) if (steps == s).any()]
        for s, path in hits:
            row = rows[np.flatnonzero(steps == s)[0]]
            with contextlib.suppress(OSError):  # replay falls back to the run's scalars.bin
                write_record(path, row)


def write_record(path: Path, row: Any) -> None:
    """The step's loss and norm as recorded, and the float32 bits a replay reproduces exactly."""
    with np.errstate(over="ignore"):  # a float64 loss past float32's range has inf bits
        loss, gn = np.float32(row[FieldName.LOSS]), np.float32(row[FieldName.GRAD_NORM])
    record = {
        "step": int(row[FieldName.STEP]),
        "loss": plain_number(row[FieldName.LOSS]),
        "loss_bits": f"0x{int(loss.view(np.uint32)):08x}",
        FieldName.GRAD_NORM: plain_number(gn),
        "grad_norm_bits": f"0x{int(gn.view(np.uint32)):08x}",
        FieldName.GRAD_NORM_CLIPPED: plain_number(row[FieldName.GRAD_NORM_CLIPPED]),
        FieldName.CLIP_THRESHOLD: plain_number(row[FieldName.CLIP_THRESHOLD]),
        FieldName.NONFINITE_GRADS: plain_number(row[FieldName.NONFINITE_GRADS]),
        "source": "probe record (float32)",
    }
    write_private_file(
        path / RECORD, json.dumps(record, indent=1, sort_keys=True, allow_nan=False).encode()
    )


def read_record(path: Path) -> dict[str, Any] | None:
    """A snapshot's ``record.json`` (the step's own loss and grad norm, as float32 bit patterns),
    checked; None when it is missing or damaged (a truncated file), so replay falls back to the
    run log instead of failing."""
    try:
        rec = loads(read_small_file(path, limit=1 << 20))
    except (OSError, ValueError, RecursionError):
        return None
    if not isinstance(rec, dict):
        return None
    for key in ("loss_bits", "grad_norm_bits"):
        bits = rec.get(key)
        if not isinstance(bits, str) or not _is_u32_hex(bits):
            return None
    step = rec.get("step")
    if isinstance(step, bool) or not isinstance(step, int):
        return None
    return rec


def _is_u32_hex(text: str) -> bool:
    try:
        return text.startswith("0x") and 0 <= int(text, 16) <= 0xFFFFFFFF and len(text) <= 10
    except ValueError:
        return False



def plain_number(x: Any) -> Any:
    """JSON-safe: NaN -> None, +-inf -> "inf"/"-inf"; other numbers as Python floats/ints."""
    if x is None or isinstance(x, (bool, str)):
        return x
    try:
        f = float(x)
    except (TypeError, ValueError):
        return str(x)
    if math.isnan(f):
        return None
    if math.isinf(f):
        return "inf" if f > 0 else "-inf"
    return int(f) if isinstance(x, int) else f
