"""Tensors saved by ``torch.save`` read as numpy arrays, without torch: a snapshot's batch on a
laptop that only watches (``nnwatch show`` after ``nnwatch pull``).

A ``.pt`` file is a zip of one pickle (``data.pkl``) and one raw file per storage. The pickle is
read by an unpickler that knows a fixed list of names (tensors rebuilt from their storages, the
storage types, ``OrderedDict``) and refuses every other one, so no code from the file runs: the
same promise as ``torch.load(weights_only=True)``. Anything else asks for torch in plain words.
"""

from __future__ import annotations

import collections
import pickle
import zipfile
from pathlib import Path
from typing import Any, cast

import numpy as np

from nnwatch.store.safe_read import open_file

#: The numpy dtype of each storage type torch writes (bfloat16 is read as its bits, see below).
_STORAGES: dict[str, str] = {
    "FloatStorage": "<f4", "DoubleStorage": "<f8", "HalfStorage": "<f2",
    "BFloat16Storage": "<u2", "LongStorage": "<i8", "IntStorage": "<i4", "ShortStorage": "<i2",
    "CharStorage": "i1", "ByteStorage": "u1", "BoolStorage": "?", "ComplexFloatStorage": "<c8",
    "ComplexDoubleStorage": "<c16",
}  # fmt: skip


class PtReadError(ValueError):
    """The file holds something this reader cannot rebuild without torch; says what."""


class _Storage:
    """A storage type named in the pickle: which dtype its bytes hold."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.dtype = np.dtype(_STORAGES[name])


def _rebuild_tensor(
    storage: tuple[np.ndarray, str],
    offset: int,
    size: tuple[int, ...],
    stride: tuple[int, ...],
    *_: Any,
) -> np.ndarray:
    """``torch._utils._rebuild_tensor_v2``: a view of the storage's elements, copied out."""
    flat, name = storage
    item = flat.dtype.itemsize
    view = np.lib.stride_tricks.as_strided(
        flat[offset:], shape=tuple(size), strides=tuple(s * item for s in stride)
    ).copy()
    if name == "BFloat16Storage":  # bfloat16 is the top half of a float32
        view = (view.astype(np.uint32) << 16).view(np.float32)
    return cast("np.ndarray", view)


_ALLOWED: dict[tuple[str, str], Any] = {
    ("torch._utils", "_rebuild_tensor_v2"): _rebuild_tensor,
    ("torch._utils", "_rebuild_tensor"): _rebuild_tensor,
    ("collections", "OrderedDict"): collections.OrderedDict,
}


def load(path: str | Path) -> Any:
    """What ``torch.load(path, weights_only=True)`` returns, with numpy arrays for tensors."""
    path = Path(path)
    try:  # never a link, never a FIFO
        fh = open_file(path)
    except OSError as exc:
        raise PtReadError(f"{path} cannot be read: {exc.strerror or exc}") from None
    try:
        archive = zipfile.ZipFile(fh)
    except (OSError, zipfile.BadZipFile) as exc:
        fh.close()
        raise PtReadError(f"{path} is not a torch.save zip file: {exc}") from None
    with fh, archive:
        names = archive.namelist()
        if any(i.compress_type != zipfile.ZIP_STORED for i in archive.infolist()):
            raise PtReadError(f"{path} holds compressed entries: torch.save never writes those")
        pkl = next((n for n in names if n.endswith("/data.pkl") or n == "data.pkl"), None)
        if pkl is None:
            raise PtReadError(f"{path} has no data.pkl: not a file torch.save wrote")
        prefix = pkl[: -len("data.pkl")]
        if f"{prefix}byteorder" in names and archive.read(f"{prefix}byteorder") != b"little":
            raise PtReadError(f"{path} was saved big-endian; reading it needs torch")

        class Unpickler(pickle.Unpickler):
            def find_class(self, module: str, name: str) -> Any:
                if module == "torch" and name in _STORAGES:
                    return _Storage(name)
                found = _ALLOWED.get((module, name))
                if found is None:
                    raise PtReadError(
                        f"{path} holds a {module}.{name}; reading it needs torch (pip install torch)"
                    )
                return found

            def persistent_load(self, pid: Any) -> Any:
                if not (isinstance(pid, tuple) and pid and pid[0] == "storage"):
                    raise PtReadError(f"{path}: an unknown persistent id {pid!r}")
                kind, key = pid[1], str(pid[2])
                if not isinstance(kind, _Storage):
                    raise PtReadError(f"{path}: a storage of type {kind!r} needs torch to read")
                raw = archive.read(f"{prefix}data/{key}")
                return np.frombuffer(raw, dtype=kind.dtype), kind.name

        with archive.open(pkl) as f:
            try:
                return Unpickler(f).load()
            except PtReadError:
                raise
            except Exception as exc:  # noqa: BLE001 - a damaged pickle: say so, never crash
                raise PtReadError(f"{path} cannot be read: {exc}") from None
