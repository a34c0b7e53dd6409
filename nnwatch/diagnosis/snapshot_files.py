"""Reading a snapshot directory and the user's model factory, for a replay.

No code is unpickled: every file is read with ``torch.load(weights_only=True)``. The model comes from
the user's own factory, ``module:function`` or ``path/to/file.py:function``.
"""

from __future__ import annotations

import hashlib
import importlib
import importlib.util
import os
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, cast

import numpy as np

from nnwatch.diagnosis import snapshot as snap
from nnwatch.diagnosis.float_bits import from_bits, json_float
from nnwatch.store.clean_text import loads
from nnwatch.store.paths import SNAPSHOTS_DIR
from nnwatch.store.run_reader import load_run
from nnwatch.store.safe_read import held_size, hole_tail, open_file, open_regular, read_small_file
from nnwatch.store.schema import FieldName


class ReplayError(RuntimeError):
    """A replay cannot run; the message says what is wrong and what to do."""


def _load_without_torch(p: Path) -> Any:
    """A snapshot file read where torch is not installed (``nnwatch show`` on a laptop)."""
    from nnwatch.diagnosis.pt_numpy import PtReadError, load

    try:
        return load(p)
    except PtReadError as exc:
        raise ReplayError(str(exc)) from None


@dataclass
class Snapshot:
    """A snapshot directory. Tensors are loaded on demand, always with ``weights_only=True``."""

    path: Path
    manifest: dict[str, Any]
    #: what could not be verified against the manifest's checksums, in words (show and replay
    #: print each: a snapshot read unverified must say so)
    unverified: list[str] = field(default_factory=list)

    @property
    def step(self) -> int:
        return int(self.manifest["step"])

    def _load(self, name: str) -> Any:
        p = self.path / name
        if not p.exists():
            raise ReplayError(f"{p} is missing: the snapshot is incomplete")
        try:
            import torch
        except ModuleNotFoundError:  # a laptop that only watches: tensors come as numpy arrays
            return _load_without_torch(p)
        try:
            with open_file(p) as fh:  # never a link, never a FIFO (torch.load would wait on it)
                return torch.load(fh, map_location="cpu", weights_only=True)
        except OSError as exc:
            raise ReplayError(f"{p} cannot be read: {exc.strerror or exc}") from exc
        except Exception as exc:  # noqa: BLE001 - torch raises several types for a bad file
            raise ReplayError(
                f"{p} cannot be loaded safely (weights_only=True): {exc}. nnwatch never unpickles "
                "code from a snapshot"
            ) from exc

    def state(self) -> dict[str, Any]:
        return cast("dict[str, Any]", self._load(snap.STATE))

    def rng(self) -> dict[str, Any]:
        return cast("dict[str, Any]", self._load(snap.RNG))

    def batch(self) -> Any:
        if not self.manifest.get("has", {}).get("batch"):
            raise ReplayError(
                "this snapshot has no batch: the training loop called w.step(loss) without "
                "batch=...; pass the batch (w.step(loss, batch=batch)) so that steps can be replayed"
            )
        return self._load(snap.BATCH)

    def metrics(self) -> np.ndarray:
        p = self.path / snap.METRICS
        return load_npy(p) if os.path.lexists(p) else np.zeros(0)

    def findings(self) -> list[dict[str, Any]]:
        p = self.path / snap.FINDINGS
        if not os.path.lexists(p):
            return []
        try:
            found = loads(read_small_file(p))
        except (OSError, ValueError, RecursionError) as exc:
            raise ReplayError(f"{p} cannot be read: {exc}") from exc
        return found if isinstance(found, list) else []

    def original(self) -> dict[str, Any] | None:
        """The recorded loss and gradient norm of this step (float32), or None if unknown."""
        p = self.path / snap.RECORD
        rec = snap.read_record(p) if p.exists() else None  # None when damaged: use the run log
        if rec is not None:
            return {
                "loss": from_bits(rec.get("loss_bits")),
                FieldName.GRAD_NORM: from_bits(rec.get("grad_norm_bits")),
                FieldName.CLIP_THRESHOLD: json_float(rec.get(FieldName.CLIP_THRESHOLD)),
                "source": str(p),
            }
        run_dir = Path(self.manifest.get("run_dir", ""))
        for candidate in (self.path.parent.parent, run_dir):
            try:
                run = load_run(candidate)
            except Exception:  # noqa: BLE001 - not a run directory: try the next
                continue
            hit = np.flatnonzero(np.asarray(run.scalars[FieldName.STEP]) == self.step)
            if hit.size:
                r = run.scalars[int(hit[-1])]
                with np.errstate(over="ignore"):  # float64 values past float32's range
                    loss, norm = np.float32(r[FieldName.LOSS]), np.float32(r[FieldName.GRAD_NORM])
                return {
                    "loss": loss,
                    FieldName.GRAD_NORM: norm,
                    FieldName.CLIP_THRESHOLD: float(r[FieldName.CLIP_THRESHOLD]),
                    "source": str(candidate / "scalars.bin"),
                }
        return None


def load_snapshot(path: str | Path) -> Snapshot:
    """Open a snapshot directory (``<run>/snapshots/step-N``); a run directory picks its latest."""
    p = Path(path).expanduser()
    if (p / SNAPSHOTS_DIR).is_dir() and not (p / snap.MANIFEST).exists():
        found = sorted(
            (
                d
                for d in (p / SNAPSHOTS_DIR).iterdir()
                if d.is_dir() and not d.is_symlink() and not d.name.startswith(".")
            ),
            key=lambda d: d.lstat().st_mtime,
        )
        if not found:
            raise ReplayError(f"{p} is a run directory without snapshots")
        p = found[-1]
    m = p / snap.MANIFEST
    if not m.exists():
        raise ReplayError(
            f"{p} is not an nnwatch snapshot (no {snap.MANIFEST}); pass a directory like "
            "<run>/snapshots/step-N"
        )
    try:
        manifest = snap.read_manifest(m)  # every field checked; one plain line when it is not
    except snap.SnapshotError as exc:
        raise ReplayError(str(exc)) from exc
    if int(manifest.get("version", 0)) > snap.SNAPSHOT_VERSION:
        raise ReplayError(f"{p} was written by a newer nnwatch; upgrade nnwatch to replay it")
    return Snapshot(p, manifest, verify_files(p, manifest))


def verify_files(path: Path, manifest: dict[str, Any]) -> list[str]:
    """Check every file the manifest lists against its sha256, before anything is loaded from it;
    return what could not be checked, in words (a manifest without its ``files`` map, a file it
    does not list), for the caller to show.

    A flipped byte in ``batch.pt`` or ``state.pt`` still loads as tensors (a feature of -6.6e27,
    weights that no longer reproduce the step), so without this check ``show`` and ``replay``
    would report on damaged data as if it were the run's. A listed file that is missing is left
    to the loader, which names it when (and only if) it is needed. Sizes come first: a file
    whose length is not the one recorded, or that ends in a hole, is damaged without hashing
    gigabytes of zeros.
    """
    files = manifest.get("files")
    if not isinstance(files, dict):
        return [
            f"not verified: {path / snap.MANIFEST} lists no checksums (written by an older "
            "nnwatch, or damaged), so the snapshot's files are read as they are"
        ]
    sizes = manifest["sizes"] if isinstance(manifest.get("sizes"), dict) else {}
    for name, expected in sorted(files.items()):
        if not isinstance(name, str) or "/" in name or name in ("", ".", ".."):
            raise ReplayError(f"{path / snap.MANIFEST} is corrupt: it lists a file named {name!r}")
        if not isinstance(expected, str) or len(expected) != 64:
            raise ReplayError(
                f"{path / snap.MANIFEST} is corrupt: the sha256 of {name} is {expected!r}"
            )
        try:
            _check_size(path / name, sizes.get(name))
            found = file_sha256(path / name)
        except FileNotFoundError:
            continue
        except OSError as exc:
            raise ReplayError(f"{path / name} cannot be read: {exc.strerror or exc}") from exc
        if found != expected.lower():
            raise ReplayError(
                f"{path / name} does not match the sha256 in {snap.MANIFEST} (recorded "
                f"{expected[:12]}..., now {found[:12]}...): the file was damaged after the "
                "snapshot was written, so nothing is shown or replayed from it"
            )
    present = [n for n in _LOADED if n not in files and os.path.lexists(path / n)]
    return [f"not verified: {', '.join(present)} (the manifest lists no checksum for it)"] if present else []


#: The files show and replay load, which the manifest's checksums must cover.
_LOADED = (snap.STATE, snap.RNG, snap.BATCH, snap.METRICS, snap.FINDINGS, snap.META)
#: A file nnwatch wrote never ends in a hole; a sparse copy may leave a block or so of zeros as one.
_MAX_HOLE = 1 << 20


def _check_size(p: Path, recorded: object) -> None:
    """Refuse a file whose length is not the one the manifest recorded, or that ends in more
    than a little never-written space (a damaged or extended file: hashing it would read it all)."""
    size, held = hole_tail(p)
    if isinstance(recorded, int) and not isinstance(recorded, bool) and recorded != size:
        raise ReplayError(
            f"{p} is {size} bytes, but the snapshot recorded {recorded}: the file was changed "
            "after the snapshot was written, so nothing is shown or replayed from it"
        )
    if size - held > _MAX_HOLE:
        raise ReplayError(
            f"{p} ends in {size - held} bytes that were never written (a hole): the file was "
            "extended after the snapshot was written, so nothing is shown or replayed from it"
        )


def load_npy(p: Path) -> np.ndarray:
    """A ``.npy`` file of a snapshot, never through a link or a FIFO, and only when the array
    its header describes fits in the file (a header can claim any shape: numpy would size the
    array from it before reading a byte)."""
    try:
        with open_file(p) as fh:
            fmt = np.lib.format
            version = fmt.read_magic(fh)
            read_header = fmt.read_array_header_1_0 if version == (1, 0) else fmt.read_array_header_2_0
            shape, _fortran, dtype = read_header(fh)
            need = int(np.prod(shape, dtype=np.float64)) * dtype.itemsize
            if dtype.hasobject or need > held_size(fh.fileno()) - fh.tell():
                raise ReplayError(f"{p} is damaged: its header describes more than the file holds")
            fh.seek(0)
            return cast("np.ndarray", np.load(fh, allow_pickle=False))
    except (OSError, ValueError) as exc:
        raise ReplayError(f"{p} cannot be read: {exc}") from exc


def file_sha256(path: Path) -> str:
    """The sha256 of a regular file (never through a symlink, never blocking on a FIFO)."""
    h = hashlib.sha256()
    fd = open_regular(path)
    with os.fdopen(fd, "rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def load_factory(spec: str) -> Callable[[], Any]:
    """``module:function`` or ``path/to/file.py:function`` -> the function (called later, no args)."""
    if ":" not in spec:
        raise ReplayError(
            f"--model {spec!r} must look like module:function or path/to/file.py:function "
            "(a function that returns the model, or {'model': ..., 'loss_fn': ...})"
        )
    mod_name, _, attr = spec.rpartition(":")
    try:
        if mod_name.endswith(".py") or "/" in mod_name or "\\" in mod_name:
            path = Path(mod_name).expanduser().resolve()
            if not path.exists():
                raise ReplayError(f"{path} does not exist")
            sys.path.insert(0, str(path.parent))
            unique = f"nnwatch_replay_factory_{abs(hash(str(path)))}"
            spec_obj = importlib.util.spec_from_file_location(unique, path)
            if spec_obj is None or spec_obj.loader is None:
                raise ReplayError(f"cannot import {path}")
            module = importlib.util.module_from_spec(spec_obj)
            sys.modules[unique] = module
            spec_obj.loader.exec_module(module)
        else:
            module = importlib.import_module(mod_name)
    except ReplayError:
        raise
    except Exception as exc:  # noqa: BLE001 - the user's module failed to import
        raise ReplayError(f"importing {mod_name!r} failed: {exc!r}") from exc
    fn = getattr(module, attr, None)
    if fn is None or not callable(fn):
        raise ReplayError(f"{mod_name!r} has no function {attr!r}")
    return cast("Callable[[], Any]", fn)
