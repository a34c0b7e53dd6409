"""Float32 values as their exact bits: how a replay proves it reproduced a step bit for bit.

The manifest stores each recorded float32 as hex bits next to its JSON value (JSON has no NaN, and a
decimal round trip could hide a last-bit difference).
"""

from __future__ import annotations

import math
from typing import Any, cast

import numpy as np


def bits_of(x: Any) -> str:
    return f"0x{int(np.float32(x).view(np.uint32)):08x}"


def same_bits(a: str | None, b: str | None) -> bool | None:
    if a is None or b is None:
        return None
    if a == b:
        return True
    fa, fb = from_bits(a), from_bits(b)
    return bool(np.isnan(fa) and np.isnan(fb))  # NaN payloads may differ; both NaN counts as equal


def from_bits(bits: str | None) -> np.float32:
    if bits is None:
        return cast("np.float32", np.float32(np.nan))
    return cast("np.float32", np.array([int(bits, 16)], dtype=np.uint32).view(np.float32)[0])


def json_float(v: Any) -> float:
    if v is None:
        return math.nan
    if isinstance(v, str):
        return float(v) if v in ("inf", "-inf") else math.nan
    return float(v)


def num_text(x: float) -> str:
    return repr(float(x)) if math.isfinite(x) else str(x)
