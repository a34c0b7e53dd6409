"""How a snapshot's batch is taken apart: which tensor holds the inputs, which the targets and
the attention mask, what kind of input it is (images, token ids, table rows), and each on the host
as numpy.

Apart from the batch report because it is about the batch's layout, not about what is wrong with
it: the report reads it once and flags what it finds in the pieces.
"""

from __future__ import annotations

import sys
from typing import Any, cast

import numpy as np

INPUT_KEYS = ("input_ids", "inputs", "input", "x", "images", "image", "pixel_values", "features")
TARGET_KEYS = ("labels", "label", "targets", "target", "y")


def is_tensor(v: Any) -> bool:
    """A tensor, or the numpy array a snapshot's tensor is read as where torch is missing."""
    if isinstance(v, np.ndarray):
        return True
    torch = sys.modules.get("torch")
    return torch is not None and isinstance(v, torch.Tensor)


def to_host(t: Any) -> Any:
    return t if isinstance(t, np.ndarray) else t.detach().cpu()


def split_batch(batch: Any) -> tuple[Any, Any, Any]:
    """(inputs, targets, attention mask) of a batch, each a tensor (or numpy array) or None."""

    def tensor(v: Any) -> Any:
        return v if is_tensor(v) else None

    if is_tensor(batch):
        return batch, None, None
    if isinstance(batch, dict):
        inputs = next(
            (tensor(batch[k]) for k in INPUT_KEYS if tensor(batch.get(k)) is not None), None
        )
        if inputs is None:
            inputs = next((v for v in batch.values() if is_tensor(v)), None)
        targets = next(
            (tensor(batch[k]) for k in TARGET_KEYS if tensor(batch.get(k)) is not None), None
        )
        return inputs, targets, tensor(batch.get("attention_mask"))
    if isinstance(batch, (list, tuple)):
        items = [v for v in batch if is_tensor(v)]
        if not items:
            nested = [v for v in batch if isinstance(v, (dict, list, tuple))]
            return split_batch(nested[0]) if nested else (None, None, None)
        return items[0], (items[1] if len(items) > 1 else None), None
    return None, None, None


def input_kind(x: Any) -> str:
    """ "tokens" (integer ids), "image" (N,C,H,W or N,H,W), "table" (N,F floats) or "other"."""
    if x.ndim == 0:
        return "other"
    if isinstance(x, np.ndarray):
        integer = x.dtype.kind in "iu"
    else:
        integer = not x.is_floating_point() and not x.is_complex() and x.dtype != _bool()
    if integer:
        return "tokens" if x.ndim in (1, 2) else "other"
    if x.ndim == 4 and x.shape[1] in (1, 3, 4) and min(x.shape[2], x.shape[3]) >= 4:
        return "image"
    if x.ndim == 3 and min(x.shape[1], x.shape[2]) >= 8:
        return "image"
    if x.ndim == 2:
        return "table"
    return "other"


def _bool() -> Any:
    import torch

    return torch.bool


def to_numpy(t: Any) -> np.ndarray:
    if isinstance(t, np.ndarray):
        return t
    import torch

    if t.dtype in (torch.bfloat16, torch.float16):
        t = t.float()
    return cast("np.ndarray", t.numpy())


def label_of(ys: np.ndarray, i: int) -> Any:
    y = ys[i]
    if np.ndim(y) == 0:
        return int(y) if np.issubdtype(np.asarray(y).dtype, np.integer) else float(y)
    return [
        int(v) if np.issubdtype(np.asarray(y).dtype, np.integer) else float(v)
        for v in np.asarray(y).reshape(-1)
    ]


def describe_tensor(t: Any) -> str:
    return f"{str(t.dtype).replace('torch.', '')} {list(t.shape)}"
