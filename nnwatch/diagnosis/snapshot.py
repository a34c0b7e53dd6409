"""Snapshots: everything needed to re-run one training step, written atomically next to the run.

``<run>/snapshots/step-N/`` holds:

- ``manifest.json``  what this is: step, reason, versions, device, thread count, which parts exist
- ``state.pt``       model state_dict and optimizer state from *before* this step's update, scaler state
- ``rng.pt``         RNG states from the start of the step's forward (torch CPU/CUDA, numpy, Python),
                     stored as plain tensors and numbers so that ``torch.load(weights_only=True)`` reads them
- ``batch.pt``       the batch passed to ``w.step(loss, batch=...)``, moved to the CPU
- ``metrics.npy``    the last 500 step records (scalars and per-layer stats), oldest first
- ``layers.json``    the latest per-layer statistics, by layer name, for people
- ``findings.json``  the findings so far
- ``meta.json``      the run's meta (layer names, schema)
- ``record.json``    this step's own recorded loss and gradient norm; the record is published after the
                     snapshot, so the detectors' writer thread adds this file when it arrives. Replay
                     falls back to the run's ``scalars.bin`` when it is missing.

Everything is written into a hidden temporary directory and renamed into place, so a reader never
sees half a snapshot. A write that fails (disk full, permissions) removes the temporary directory,
becomes a ``snapshot_failed`` finding, and raises: the probe turns the exception into an event.
"""

from __future__ import annotations

import hashlib
import json
import os
import platform
import secrets
import shutil
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Protocol, cast

import numpy as np

from nnwatch.diagnosis.snapshot_record import RECORD as RECORD  # re-exported: read from here too
from nnwatch.diagnosis.snapshot_record import plain_number as _plain_number
from nnwatch.diagnosis.snapshot_record import read_record as read_record
from nnwatch.diagnosis.snapshot_rng import rng_to_tensors
from nnwatch.store.clean_text import loads
from nnwatch.store.disk_errors import describe_os_error, free_bytes
from nnwatch.store.finding import Finding
from nnwatch.store.paths import (
    SNAPSHOT_MANIFEST,
    SNAPSHOTS_DIR,
    check_own_dir,
    create_exclusive,
    make_dir,
    pinned,
    rename_file,
)
from nnwatch.store.safe_read import open_regular, read_small_file
from nnwatch.store.schema import FieldName, RunMeta, RunSchema

SNAPSHOT_VERSION = 1
MANIFEST, STATE, RNG, BATCH = SNAPSHOT_MANIFEST, "state.pt", "rng.pt", "batch.pt"
METRICS, LAYERS, FINDINGS, META = "metrics.npy", "layers.json", "findings.json", "meta.json"


class RunPlace(Protocol):
    """Where a run stands: its step, directory, name, metadata and record layout (what the
    snapshot writer and the probe's views of the run both read first)."""

    @property
    def step_index(self) -> int: ...

    @property
    def run_dir(self) -> Path | None: ...

    @property
    def name(self) -> str: ...

    @property
    def meta(self) -> RunMeta | None: ...

    @property
    def schema(self) -> RunSchema: ...


class SnapshotSubject(RunPlace, Protocol):
    """What a snapshot is taken of: where the run stands, its records, its model and the
    optimizer whose update the snapshot precedes, and where a failure is reported."""

    @property
    def device(self) -> Any: ...

    @property
    def model(self) -> Any:
        """The ``nn.Module`` (its state and class are saved)."""

    @property
    def stepping_optimizer(self) -> Any:
        """The torch optimizer whose update the weights precede (None: watch() got none)."""

    @property
    def num_classes(self) -> int | None: ...

    @property
    def findings(self) -> Sequence[Finding]: ...

    def recent_records(self) -> np.ndarray: ...

    def add_finding(self, finding: Finding) -> None: ...

    def set_log_error(self, why: str) -> None:
        """Show ``why`` where monitors read the run's trouble (the ring header)."""


class SnapshotError(OSError):
    """A snapshot could not be written; the message says where and why."""


def write_snapshot(
    w: SnapshotSubject, *, reason: str, state: dict[str, Any], rng: dict[str, Any], batch: Any
) -> Path:
    """Write the snapshot of the step being recorded (``w.step_index``); returns its directory."""
    step = int(w.step_index)
    root = Path(_run_dir(w)) / SNAPSHOTS_DIR
    tmp: Path | None = None
    try:
        try:
            make_dir(root)  # every path here goes through the pinned run directory
        except FileExistsError:
            pass
        check_own_dir(root)  # a symlink or someone else's directory is refused
        tmp = root / f".step-{step}-{secrets.token_hex(6)}"
        make_dir(tmp)
        _write_contents(w, tmp, step=step, reason=reason, state=state, rng=rng, batch=batch)
        final = _free_name(root, f"step-{step}")
        rename_file(tmp, final)
        tmp = None
    except Exception as exc:
        # judged before the half-written files are removed: torch reports a full disk as
        # "unexpected pos 1152 vs 1046", which only the free space explains
        why = describe_os_error(exc, root)
        if tmp is not None:
            _remove_tree(tmp)
        _report_failure(w, step, reason, root, why)
        raise SnapshotError(
            f"could not write the snapshot of step {step} in {root}: {why}"
        ) from exc
    return final


def _remove_tree(path: Path) -> None:
    """Remove a half-written snapshot: through the pinned run directory where Python can (3.11+:
    a swapped symlink redirects nothing), else by its path."""
    if sys.version_info >= (3, 11):
        dir_fd, rel = pinned(path)
        shutil.rmtree(rel, ignore_errors=True, dir_fd=dir_fd)
    else:
        shutil.rmtree(path, ignore_errors=True)


def _run_dir(w: SnapshotSubject) -> Path:
    if w.run_dir is None:
        raise SnapshotError("the run has no directory (monitoring is off)")
    return w.run_dir


def _free_name(root: Path, name: str) -> Path:
    path = root / name
    k = 1
    while _exists(path):
        path = root / f"{name}.{k}"
        k += 1
    return path


def _exists(path: Path) -> bool:
    dir_fd, rel = pinned(path)  # looked up in the pinned run directory, like every write here
    try:
        os.stat(rel, dir_fd=dir_fd, follow_symlinks=False)
    except FileNotFoundError:
        return False
    return True


def _report_failure(w: SnapshotSubject, step: int, reason: str, root: Path, why: str) -> None:
    finding = Finding(
        kind="snapshot_failed",
        severity="error",
        step=step,
        summary=f"the {reason} snapshot could not be written to {root}: {why}. Training goes on.",
        remedy=(
            "free disk space or fix the permissions of the run directory (or point NNWATCH_RUN_DIR "
            "at a larger, writable disk), then take a snapshot again"
        ),
        evidence={"snapshot_step": step},
        onset_step=step,
    )
    try:
        w.add_finding(finding)
    except Exception:  # noqa: BLE001 - the exception below still tells the probe
        pass
    w.set_log_error(why)  # monitors read the cause from the ring header


def preflight(w: SnapshotSubject, margin: float = 1.5) -> str | None:
    """Why a snapshot of ``w`` would fail now, or None: checked when a monitor asks for one, so
    that the reply does not promise a snapshot that a full disk will refuse. The size is
    estimated from the weights, the optimizer state (up to twice the weights) and a margin."""
    try:
        import torch

        weights = sum(p.numel() * p.element_size() for p in w.model.parameters())
        opt = w.stepping_optimizer
        extra = 0
        if opt is not None:
            extra = sum(
                t.numel() * t.element_size()
                for st in opt.state.values() for t in st.values() if isinstance(t, torch.Tensor)
            )  # fmt: skip
        need = int((weights + extra) * margin) + (1 << 20)
    except Exception:  # noqa: BLE001 - an estimate only
        return None
    run_dir = w.run_dir
    if run_dir is None:
        return "the run has no directory (monitoring is off)"
    free = free_bytes(Path(run_dir))
    if free is not None and free < need:
        return (
            f"the disk is full: a snapshot needs about {need // 1024} KiB and {Path(run_dir)} "
            f"has {free // 1024} KiB free; free some space or set NNWATCH_RUN_DIR to a larger disk"
        )
    if not os.access(run_dir, os.W_OK):
        return f"permission denied: {run_dir} is not writable"
    return None


# ------------------------------------------------------------------------------------------------
# contents


class _Files:
    """The files of one snapshot directory as they are written: each one's sha256 and length."""

    def __init__(self, d: Path) -> None:
        self.d = d
        self.files: dict[str, str] = {}
        self.sizes: dict[str, int] = {}

    def save_bytes(self, name: str, write: Any) -> None:
        """Create ``name`` (new, private) and have ``write(fh)`` fill it."""
        path = self.d / name
        with _new_file(path) as fh:
            write(fh)
        self.files[name] = _sha256(path, self.sizes)

    def save_torch(self, name: str, obj: Any) -> None:
        import torch

        self.save_bytes(name, lambda fh: torch.save(obj, fh))

    def save_json(self, name: str, obj: Any) -> None:
        text = json.dumps(obj, indent=1, sort_keys=True, default=_json_default, allow_nan=False)
        self.save_bytes(name, lambda fh: fh.write(text.encode()))


def _write_contents(
    w: SnapshotSubject,
    d: Path,
    *,
    step: int,
    reason: str,
    state: dict[str, Any],
    rng: dict[str, Any],
    batch: Any,
) -> None:
    out = _Files(d)
    saved_state: dict[str, Any] = {
        k: state[k] for k in ("model", "optimizer", "scaler") if k in state and state[k] is not None
    }
    out.save_torch(STATE, saved_state)
    out.save_torch(RNG, rng_to_tensors(rng))
    batch_notes: list[str] = []
    if batch is None:
        batch_notes.append(
            "w.step() was called without batch=...; pass the batch to make snapshots replayable"
        )
    else:
        out.save_torch(BATCH, _plain(batch, batch_notes, "batch"))
    recent = w.recent_records()
    if isinstance(recent, np.ndarray) and recent.dtype.names:
        out.save_bytes(METRICS, lambda fh: np.save(fh, recent, allow_pickle=False))
    out.save_json(LAYERS, latest_layer_stats(w, recent))
    out.save_json(FINDINGS, [_finding_dict(f) for f in list(w.findings)])
    meta = w.meta
    if meta is not None:
        out.save_bytes(META, lambda fh: fh.write(meta.to_json().encode()))
    manifest = _manifest(w, step, reason, state, saved_state, rng, batch is not None)
    manifest.update(batch_notes=batch_notes, files=out.files, sizes=out.sizes)
    out.save_json(MANIFEST, manifest)


def _manifest(
    w: SnapshotSubject,
    step: int,
    reason: str,
    state: dict[str, Any],
    saved_state: dict[str, Any],
    rng: dict[str, Any],
    has_batch: bool,
) -> dict[str, Any]:
    """What a replay needs to know of the step and of the versions, device and model it ran on."""
    import torch

    model = w.model
    device = str(w.device)
    optimizer = w.stepping_optimizer
    return {
        "version": SNAPSHOT_VERSION,
        "step": step,
        "reason": reason,
        "time": time.time(),
        "run": w.name,
        "run_dir": str(w.run_dir),
        "torch_version": torch.__version__,
        "numpy_version": np.__version__,
        "python_version": platform.python_version(),
        "nnwatch_version": getattr(w.meta, "nnwatch_version", ""),
        "device": device,
        "cuda_device": _cuda_name(device),
        "num_threads": torch.get_num_threads(),
        "default_dtype": str(torch.get_default_dtype()).replace("torch.", ""),
        "deterministic_algorithms": torch.are_deterministic_algorithms_enabled(),
        "model_class": f"{type(model).__module__}.{type(model).__qualname__}",
        "model_training": bool(model.training),
        "optimizer_class": type(optimizer).__name__ if optimizer is not None else None,
        "lr": [_plain_number(x) for x in (state.get("lr") or [])],
        "num_classes": w.num_classes,
        "has": {
            "model": "model" in saved_state,
            "optimizer": "optimizer" in saved_state,
            "scaler": "scaler" in saved_state,
            "batch": has_batch,
            "rng": sorted(rng),
        },
        "weights": (
            "before this step's optimizer update"
            if optimizer is not None
            else "unknown: watch() was given no optimizer, so the weights may already be updated"
        ),
        "buffers_note": "buffers (e.g. BatchNorm running stats) already include this step's forward",
    }


def _plain(obj: Any, notes: list[str], where: str) -> Any:
    """The batch as CPU tensors inside plain dicts, lists and tuples (what weights_only loads)."""
    import torch

    if isinstance(obj, torch.Tensor):
        return obj.detach().to("cpu", copy=True)
    if obj is None or isinstance(obj, (bool, int, float, str)):
        return obj
    if isinstance(obj, dict):
        if type(obj) is not dict:
            notes.append(f"{where}: {type(obj).__name__} stored as a plain dict")
        return {
            str(k) if not isinstance(k, (int, str)) else k: _plain(v, notes, f"{where}[{k!r}]")
            for k, v in obj.items()
        }
    if isinstance(obj, (list, tuple)):
        if type(obj) not in (list, tuple):
            notes.append(f"{where}: {type(obj).__name__} stored as a plain tuple")
        items = [_plain(v, notes, f"{where}[{i}]") for i, v in enumerate(obj)]
        return items if isinstance(obj, list) else tuple(items)
    if hasattr(obj, "items") and callable(obj.items):  # Mapping-like (e.g. BatchEncoding)
        notes.append(f"{where}: {type(obj).__name__} stored as a plain dict")
        return {str(k): _plain(v, notes, f"{where}[{k!r}]") for k, v in obj.items()}
    notes.append(
        f"{where}: a {type(obj).__name__} cannot be stored without pickling code; stored as None"
    )
    return None


def latest_layer_stats(w: SnapshotSubject, recent: np.ndarray) -> dict[str, Any]:
    """The newest sampled per-layer statistics and the newest per-layer gradient norms, by name."""
    out: dict[str, Any] = {"step": None, "layers": {}, "grad_step": None, "grad_norms": {}}
    if not isinstance(recent, np.ndarray) or not recent.dtype.names or not len(recent):
        return out
    schema = w.schema
    sampled = recent[recent[FieldName.LAYER_STATS] == 1.0]
    if len(sampled):
        r = sampled[-1]
        out["step"] = int(r[FieldName.STEP])
        for i, name in enumerate(schema.layer_names):
            out["layers"][name] = {
                "kind": schema.layer_kinds[i],
                **{
                    f: _plain_number(r[f][i])
                    for f in (FieldName.ACT_MEAN, FieldName.ACT_STD, FieldName.ACT_ZERO, FieldName.ACT_NONFINITE, FieldName.ACT_MAXABS)
                },
            }
    r = recent[-1]
    out["grad_step"] = int(r[FieldName.STEP])
    for j, name in enumerate(schema.param_layer_names):
        out["grad_norms"][name] = _plain_number(r[FieldName.GRAD_LAYER][j])
    return out


# ------------------------------------------------------------------------------------------------


def _new_file(path: Path) -> Any:
    """A new file opened for writing: mode 0600, created exclusively, never through a symlink."""
    return os.fdopen(create_exclusive(path, 0o600), "wb")


# ------------------------------------------------------------------------------------------------
# reading, with every field checked


def read_manifest(path: Path) -> dict[str, Any]:
    """A snapshot's ``manifest.json``, checked: raises :class:`SnapshotError` with one plain line
    when it is unreadable, not a JSON object, or has a version or step of the wrong kind."""
    path = Path(path)
    try:
        manifest = loads(read_small_file(path))
    except FileNotFoundError as exc:
        raise SnapshotError(f"{path} is missing: this is not a complete snapshot") from exc
    except OSError as exc:
        raise SnapshotError(f"{path} cannot be read: {exc.strerror or exc}") from exc
    except (ValueError, RecursionError) as exc:
        raise SnapshotError(f"{path} is corrupt (not JSON): {exc}") from exc
    if not isinstance(manifest, dict):
        raise SnapshotError(f"{path} is corrupt: it is not a JSON object")
    version = manifest.get("version", 0)
    if isinstance(version, bool) or not isinstance(version, int) or version < 0:
        raise SnapshotError(
            f"{path} is corrupt: its version is {_show(version)}, not a whole number"
        )
    if version > SNAPSHOT_VERSION:
        raise SnapshotError(f"{path} was written by a newer nnwatch; upgrade nnwatch to read it")
    step = manifest.get("step")
    if isinstance(step, bool) or not isinstance(step, int) or not 0 <= step < 1 << 53:
        raise SnapshotError(f"{path} is corrupt: its step is {_show(step)}, not a step number")
    for key, kind in (("has", dict), ("files", dict), ("sizes", dict), ("reason", str), ("run_dir", str)):
        if key in manifest and not isinstance(manifest[key], kind):
            raise SnapshotError(f"{path} is corrupt: {key} has the wrong type")
    return manifest


def _show(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


def _sha256(path: Path, sizes: dict[str, int]) -> str:
    h = hashlib.sha256()
    with os.fdopen(open_regular(path), "rb") as fh:  # the file just written, not a link
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            h.update(chunk)
        sizes[path.name] = fh.tell()
    return h.hexdigest()


def _json_default(obj: Any) -> Any:
    if isinstance(obj, np.generic):
        return _plain_number(obj.item())
    return str(obj)


def _finding_dict(f: Any) -> dict[str, Any]:
    if hasattr(f, "to_dict"):
        return cast("dict[str, Any]", f.to_dict())
    if isinstance(f, dict):
        return {str(k): _plain_number(v) if isinstance(v, float) else v for k, v in f.items()}
    return {"message": str(f)}


def _cuda_name(device: str) -> str | None:
    if not device.startswith("cuda"):
        return None
    try:
        import torch

        return torch.cuda.get_device_name(torch.device(device))
    except Exception:  # noqa: BLE001
        return None
