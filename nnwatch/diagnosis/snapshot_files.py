"""Reading a snapshot directory and the user's model factory, for a replay.

No code is unpickled: every file is read with ``torch.load(weights_only=True)``. The model comes from
the user's own factory, ``module:function`` or ``path/to/file.py:function``.
"""

from __future__ import annotations

import hashlib
import importlib
import importlib.util
import json
import os
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

import numpy as np

from nnwatch.diagnosis import snapshot as snap
from nnwatch.diagnosis.float_bits import from_bits, json_float
from nnwatch.store.paths import SNAPSHOTS_DIR, open_regular
from nnwatch.store.run_reader import load_run


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
            return torch.load(p, map_location="cpu", weights_only=True)
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
        return np.load(p, allow_pickle=False) if p.exists() else np.zeros(0)

    def findings(self) -> list[dict[str, Any]]:
        p = self.path / snap.FINDINGS
        return json.loads(p.read_text()) if p.exists() else []

    def original(self) -> dict[str, Any] | None:
        """The recorded loss and gradient norm of this step (float32), or None if unknown."""
        p = self.path / snap.RECORD
        rec = snap.read_record(p) if p.exists() else None  # None when damaged: use the run log
        if rec is not None:
            return {
                "loss": from_bits(rec.get("loss_bits")),
                "grad_norm": from_bits(rec.get("grad_norm_bits")),
                "clip_threshold": json_float(rec.get("clip_threshold")),
                "source": str(p),
            }
        run_dir = Path(self.manifest.get("run_dir", ""))
        for candidate in (self.path.parent.parent, run_dir):
            try:
                run = load_run(candidate)
            except Exception:  # noqa: BLE001 - not a run directory: try the next
                continue
            hit = np.flatnonzero(np.asarray(run.scalars["step"]) == self.step)
            if hit.size:
                r = run.scalars[int(hit[-1])]
                with np.errstate(over="ignore"):  # float64 values past float32's range
                    loss, norm = np.float32(r["loss"]), np.float32(r["grad_norm"])
                return {
                    "loss": loss,
                    "grad_norm": norm,
                    "clip_threshold": float(r["clip_threshold"]),
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
                if d.is_dir() and not d.name.startswith(".")
            ),
            key=lambda d: d.stat().st_mtime,
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
    verify_files(p, manifest)
    return Snapshot(p, manifest)


def verify_files(path: Path, manifest: dict[str, Any]) -> None:
    """Check every file the manifest lists against its sha256, before anything is loaded from it.

    A flipped byte in ``batch.pt`` or ``state.pt`` still loads as tensors (a feature of -6.6e27,
    weights that no longer reproduce the step), so without this check ``show`` and ``replay``
    would report on damaged data as if it were the run's. A listed file that is missing is left
    to the loader, which names it when (and only if) it is needed.
    """
    files = manifest.get("files")
    if not isinstance(files, dict):
        return
    for name, expected in sorted(files.items()):
        if not isinstance(name, str) or "/" in name or name in ("", ".", ".."):
            raise ReplayError(f"{path / snap.MANIFEST} is corrupt: it lists a file named {name!r}")
        if not isinstance(expected, str) or len(expected) != 64:
            raise ReplayError(
                f"{path / snap.MANIFEST} is corrupt: the sha256 of {name} is {expected!r}"
            )
        try:
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
