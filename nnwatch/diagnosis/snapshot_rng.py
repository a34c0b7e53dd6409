"""A step's random-number state, kept so that replay draws the same dropout masks and samples.

Torch's CPU and CUDA generators, numpy's and Python's, stored as tensors and plain numbers only
(so that ``torch.load(weights_only=True)`` reads them back) and set again before a replay. Apart
from the snapshot writer because the same form is both written and restored.
"""

from __future__ import annotations

import random
from typing import Any

import numpy as np


def rng_to_tensors(rng: dict[str, Any]) -> dict[str, Any]:
    """RNG states as tensors and numbers only, so that ``weights_only=True`` loading accepts them."""
    import torch

    out: dict[str, Any] = {}
    if "torch" in rng:
        out["torch"] = rng["torch"].clone()
    if "cuda" in rng:
        out["cuda"] = [s.clone() for s in rng["cuda"]]
    if "numpy" in rng:
        name, keys, pos, has_gauss, cached = rng["numpy"][:5]
        out["numpy"] = {
            "name": str(name),
            "keys": torch.from_numpy(np.asarray(keys, dtype=np.int64).copy()),
            "pos": int(pos),
            "has_gauss": int(has_gauss),
            "cached_gaussian": float(cached),
        }
    if "python" in rng:
        version, internal, gauss_next = rng["python"]
        out["python"] = {
            "version": int(version),
            "state": torch.tensor(list(internal), dtype=torch.int64),
            "gauss_next": gauss_next,
        }
    return out


def restore_rng(saved: dict[str, Any], cuda: bool = False) -> None:
    """Set the process's RNGs to a state saved by :func:`rng_to_tensors`."""
    import torch

    if "torch" in saved:
        torch.set_rng_state(saved["torch"])
    if cuda and "cuda" in saved and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(saved["cuda"])
    if "numpy" in saved:
        s = saved["numpy"]
        keys = s["keys"].numpy().astype(np.uint32)
        np.random.set_state((s["name"], keys, s["pos"], s["has_gauss"], s["cached_gaussian"]))
    if "python" in saved:
        s = saved["python"]
        random.setstate((s["version"], tuple(int(x) for x in s["state"].tolist()), s["gauss_next"]))
