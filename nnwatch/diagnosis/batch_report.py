"""What a snapshot's batch held, sample by sample: the failing step made readable.

The seed's protocol after a divergence is to look at the grad-norm log just before the failure,
then print the exact inputs and label indices that triggered it. A snapshot already keeps that
batch (``batch.pt``); this module reads it back (``torch.load(weights_only=True)``: no pickled
code runs), guesses what the inputs are (images, token ids, table rows), and flags what the seed
names: non-finite or all-zero inputs, out-of-range targets, empty sequences, duplicate inputs with
different labels, a single-class batch, and table values far from the rest of the batch.

Headless on purpose (numpy and torch, no UI library): ``nnwatch show`` prints it as text or JSON,
and the inspector screen draws the same report.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, cast

import numpy as np

from nnwatch.diagnosis.batch_tensors import (
    describe_tensor,
    input_kind,
    label_of,
    split_batch,
    to_host,
    to_numpy,
)
from nnwatch.diagnosis.grad_before import grad_norms_before
from nnwatch.diagnosis.replay import ReplayError, load_factory, load_snapshot, match_prefix
from nnwatch.diagnosis.snapshot_files import Snapshot
from nnwatch.store.clean_text import loads
from nnwatch.store.safe_read import read_small_file
from nnwatch.store.schema import FieldName

#: The targets value cross-entropy ignores (``ignore_index``); never "out of range".
IGNORE_INDEX = -100
#: Robust distance (in MADs) at or above which a table value is flagged as extreme for this batch.
ROBUST_FLAG = 10.0
#: Per-sample losses are recomputed for at most this many samples (one forward each at worst).
MAX_LOSS_SAMPLES = 512


class ReportError(RuntimeError):
    """The snapshot cannot be shown; the message says why and what to do."""


@dataclass
class SampleView:
    """One sample of the batch, as the inspector shows it."""

    index: int
    inputs: np.ndarray  # this sample's inputs (float for images/tables, int64 for tokens)
    label: Any  # an int label index, a list of target ids, or None
    flags: list[str] = field(default_factory=list)
    loss: float | None = None  # recomputed per-sample loss (needs a model factory)
    zscores: np.ndarray | None = None  # tabular: per-feature z-score against the batch
    length: int | None = None  # tokens: the sequence length (attention mask), if known
    decoded: str | None = None  # tokens: text from the decoder, if one was given

    def to_dict(self, kind: str) -> dict[str, Any]:
        d: dict[str, Any] = {
            "index": self.index,
            "label": _plain(self.label),
            "loss": _plain(self.loss),
            "flags": list(self.flags),
        }
        x = self.inputs
        if kind == "tokens":
            d["token_ids"] = [int(v) for v in x.reshape(-1)]
            d["length"] = self.length
            if self.decoded is not None:
                d["decoded"] = self.decoded
        elif kind == "table":
            d["values"] = [_plain(float(v)) for v in x.reshape(-1)]
            if self.zscores is not None:
                d["zscores"] = [_plain(round(float(z), 3)) for z in self.zscores]
        else:
            d["shape"] = list(x.shape)
            d["stats"] = value_stats(x)
        return d


@dataclass
class BatchReport:
    """The snapshot's batch, flags and the grad norms leading up to it."""

    path: Path
    step: int
    reason: str
    run: str
    kind: str  # "image", "tokens", "table" or "other"
    input_desc: str  # "float32 [64, 16]"
    target_desc: str
    num_classes: int | None
    samples: list[SampleView]
    batch_flags: list[str]
    recorded_loss: float | None
    recorded_grad_norm: float | None
    grad_steps: np.ndarray  # the steps before the snapshot (and its own), oldest first
    grad_norms: np.ndarray  # NaN where the norm was not measured
    notes: list[str] = field(default_factory=list)  # what could not be done, in plain words
    loss_source: str = ""  # how the per-sample losses were computed, "" if they were not

    @property
    def flagged(self) -> list[SampleView]:
        return [s for s in self.samples if s.flags]

    def to_dict(self) -> dict[str, Any]:
        return {
            "snapshot": str(self.path),
            "step": self.step,
            "reason": self.reason,
            "run": self.run,
            "kind": self.kind,
            "inputs": self.input_desc,
            "targets": self.target_desc,
            "num_classes": self.num_classes,
            "recorded_loss": _plain(self.recorded_loss),
            "recorded_grad_norm": _plain(self.recorded_grad_norm),
            "batch_flags": list(self.batch_flags),
            "flagged_samples": [s.index for s in self.flagged],
            "loss_source": self.loss_source,
            "grad_norm_before": {
                "steps": [int(s) for s in self.grad_steps],
                "values": [_plain(float(v)) for v in self.grad_norms],
            },
            "notes": list(self.notes),
            "samples": [s.to_dict(self.kind) for s in self.samples],
        }


# ------------------------------------------------------------------------------------------------
# building the report


def build_report(
    snapshot_dir: str | Path,
    *,
    decode: Callable[[list[int]], str] | None = None,
    factory: Callable[[], Any] | None = None,
) -> BatchReport:
    """Read a snapshot (or a run directory's newest one) and describe its batch."""
    try:
        snap = load_snapshot(snapshot_dir)
        batch = snap.batch()
    except ReplayError as exc:
        raise ReportError(str(exc)) from None
    man = snap.manifest
    meta = _read_json(snap.path / "meta.json") or {}
    num_classes = int(k) if (k := man.get("num_classes") or meta.get("num_classes")) else None
    notes: list[str] = [*snap.unverified, *(man.get("batch_notes") or [])]
    inputs, targets, mask = split_batch(batch)
    if inputs is None:
        raise ReportError(
            f"{snap.path}: the batch holds no tensor nnwatch can show "
            f"(it is a {type(batch).__name__}); pass the inputs as a tensor, a tuple "
            "(inputs, targets) or a dict with 'input_ids'/'labels'"
        )
    x = to_host(inputs)
    kind = input_kind(x)
    xs = to_numpy(x)
    ys = to_numpy(to_host(targets)) if targets is not None else None
    if ys is not None and (ys.ndim == 0 or len(ys) != len(xs)):
        notes.append(f"targets of shape {list(ys.shape)} do not match {len(xs)} samples; not shown")
        ys = None
    ms = to_numpy(to_host(mask)) if mask is not None else None
    samples = [
        SampleView(i, xs[i], label_of(ys, i) if ys is not None else None) for i in range(len(xs))
    ]
    if kind == "table":
        _zscores(xs, samples)
    if kind == "tokens":
        _token_samples(samples, xs, ms, decode, notes)
    batch_flags = _flag(samples, kind, xs, ys, num_classes)
    report = BatchReport(
        path=snap.path,
        step=snap.step,
        reason=str(man.get("reason") or ""),
        run=str(man.get("run") or meta.get("name") or ""),
        kind=kind,
        input_desc=describe_tensor(x),
        target_desc=describe_tensor(targets) if targets is not None else "none",
        num_classes=num_classes,
        samples=samples,
        batch_flags=batch_flags,
        recorded_loss=None,
        recorded_grad_norm=None,
        grad_steps=np.zeros(0, dtype=np.int64),
        grad_norms=np.zeros(0),
        notes=notes,
    )
    _add_recorded(report, snap, notes)
    if factory is not None:
        _recompute_losses(report, snap, batch, factory)
    return report


def _token_samples(
    samples: list[SampleView],
    xs: np.ndarray,
    ms: np.ndarray | None,
    decode: Callable[[list[int]], str] | None,
    notes: list[str],
) -> None:
    """Each token sample's length (by its mask when there is one) and its decoded text."""
    for i, s in enumerate(samples):
        if ms is not None and ms.shape[:1] == xs.shape[:1]:
            s.length = int(np.asarray(ms[i]).sum())
        else:
            s.length = int(xs[i].size)
        if decode is not None:
            ids = [int(v) for v in xs[i].reshape(-1)[: s.length]]
            try:
                s.decoded = str(decode(ids))
            except Exception as exc:  # noqa: BLE001 - the user's decoder; say so once
                notes.append(f"the decoder failed on sample {i}: {exc!r}")
                decode = None


def _add_recorded(report: BatchReport, snap: Snapshot, notes: list[str]) -> None:
    """What the run recorded of the step (its loss and norm) and the grad norms before it."""
    original = None
    try:
        original = snap.original()
    except Exception as exc:  # noqa: BLE001 - a damaged record must not hide the batch
        notes.append(f"the step's recorded loss could not be read: {exc}")
    if original:
        report.recorded_loss = float(original[FieldName.LOSS])
        report.recorded_grad_norm = float(original[FieldName.GRAD_NORM])
    report.grad_steps, report.grad_norms = grad_norms_before(snap.path, snap.step, snap.manifest)
    if not len(report.grad_steps):
        notes.append("no grad-norm history: neither the run log nor the snapshot's metrics hold it")


# ------------------------------------------------------------------------------------------------
# flags


def _flag_target(s: SampleView, y: np.ndarray, num_classes: int | None) -> None:
    """Class indices out of range, or a sequence whose every target is ignored."""
    if not np.issubdtype(y.dtype, np.integer):
        return
    valid = y != IGNORE_INDEX
    out = valid & ((y < 0) | (y >= (num_classes or np.iinfo(np.int64).max)))
    if out.any():
        first, top = int(y[out].reshape(-1)[0]), num_classes - 1 if num_classes else "∞"
        s.flags.append(
            f"target out of range ({first} not in 0..{top})" if y.ndim == 0
            else f"{int(out.sum())} target(s) out of range (e.g. {first}, num_classes {num_classes})"
        )  # fmt: skip
    if y.ndim >= 1 and y.size and not valid.any():
        s.flags.append(f"no target tokens (all {IGNORE_INDEX})")


def _flag_conflicts(samples: list[SampleView], ys: np.ndarray) -> None:
    """Samples with the same input and different labels, each flagged with the other."""
    first_with: dict[bytes, int] = {}  # the first sample of each input, by its hash
    for s in samples:
        key = hashlib.blake2b(np.ascontiguousarray(s.inputs).tobytes(), digest_size=16).digest()
        j = first_with.setdefault(key, s.index)
        if j != s.index and not np.array_equal(ys[j], ys[s.index]):
            lab, other = _label_text(ys[s.index]), _label_text(ys[j])
            s.flags.append(f"same input as #{j}, different label ({lab} vs {other})")
            mate = f"same input as #{s.index}"
            if not any(f.startswith(mate) for f in samples[j].flags):
                samples[j].flags.append(f"{mate}, different label ({other} vs {lab})")


def _flag(
    samples: list[SampleView],
    kind: str,
    xs: np.ndarray,
    ys: np.ndarray | None,
    num_classes: int | None,
) -> list[str]:
    floating = np.issubdtype(xs.dtype, np.floating)
    robust = _robust_distance(xs) if kind == "table" else None
    for s in samples:
        x = s.inputs
        if floating:
            bad = int(np.count_nonzero(~np.isfinite(x)))
            if bad:
                s.flags.append(f"non-finite input ({bad} of {x.size} values NaN/Inf)")
            elif x.size and not np.any(x):
                s.flags.append("all-zero input")
        if kind == "tokens" and s.length == 0:
            s.flags.append("empty sequence")
        if robust is not None and np.isfinite(robust[s.index]).any():
            j = int(np.nanargmax(robust[s.index]))
            if robust[s.index][j] >= ROBUST_FLAG:
                z = s.zscores[j] if s.zscores is not None else math.nan
                s.flags.append(
                    f"extreme value: feature {j} = {fmt_value(x.reshape(-1)[j])} (z {z:+.1f})"
                )
        if ys is not None:
            _flag_target(s, np.asarray(ys[s.index]), num_classes)
    flags: list[str] = []
    if ys is not None and len(samples):
        _flag_conflicts(samples, ys)
        y1 = np.asarray(ys)
        if y1.ndim == 1 and len(y1) > 1 and np.issubdtype(y1.dtype, np.integer):
            uniq = np.unique(y1[y1 != IGNORE_INDEX])
            if len(uniq) == 1 and (num_classes is None or num_classes > 1):
                flags.append(f"single-class batch: every label is {int(uniq[0])}")
    n = sum(1 for s in samples if s.flags)
    if n:
        flags.append(f"{n} of {len(samples)} sample(s) flagged")
    return flags


def _robust_distance(xs: np.ndarray) -> np.ndarray:
    """|x - median| / (1.4826 MAD) per value: how far from the batch's bulk, in robust standard
    deviations. Plain z-scores cannot flag one wild row in a small batch (with n samples no z
    exceeds (n-1)/sqrt(n): 3.75 for 16), so the flag uses this; the screen shows the z-score."""
    x = xs.astype(np.float64)
    with np.errstate(invalid="ignore"):
        x = np.where(np.isfinite(x), x, np.nan)
        import warnings

        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)
            med = np.nanmedian(x, axis=0)
            mad = np.nanmedian(np.abs(x - med), axis=0) * 1.4826
        d = np.where(mad > 0, np.abs(x - med) / np.where(mad > 0, mad, 1.0), np.nan)
    return d


def _zscores(xs: np.ndarray, samples: list[SampleView]) -> None:
    """Per-feature z-scores against the batch (finite values only; a constant feature is 0)."""
    x = xs.astype(np.float64)
    ok = np.isfinite(x)
    with np.errstate(invalid="ignore", divide="ignore"):
        count = ok.sum(axis=0)
        mean = np.where(ok, x, 0.0).sum(axis=0) / np.maximum(count, 1)
        var = (np.where(ok, x - mean, 0.0) ** 2).sum(axis=0) / np.maximum(count - 1, 1)
        std = np.sqrt(var)
        z = np.where(std > 0, (x - mean) / np.where(std > 0, std, 1.0), 0.0)
    z = np.where(ok, z, np.nan)
    for i, s in enumerate(samples):
        s.zscores = z[i]


# ------------------------------------------------------------------------------------------------
# per-sample loss


def _recompute_losses(
    report: BatchReport, snap: Any, batch: Any, factory: Callable[[], Any]
) -> None:
    """Per-sample losses from the user's model factory and the snapshot's weights (no_grad)."""
    import torch

    try:
        made = factory()
        model, loss_fn = (
            (made.get("model"), made.get("loss_fn")) if isinstance(made, dict) else (made, None)
        )
        if model is None:
            report.notes.append("per-sample loss skipped: the factory gave no model")
            return
        state = snap.state()
        if "model" in state:
            model.load_state_dict(match_prefix(state["model"], model))
        model.train(bool(snap.manifest.get("model_training", True)))
        n = min(len(report.samples), MAX_LOSS_SAMPLES)
        with torch.no_grad():
            if loss_fn is None:
                if not (
                    isinstance(batch, (tuple, list)) and len(batch) >= 2 and report.num_classes
                ):
                    report.notes.append(
                        "per-sample loss skipped: the factory gives no loss_fn and the batch is not "
                        "(inputs, class labels)"
                    )
                    return
                out = model(batch[0][:n])
                losses = torch.nn.functional.cross_entropy(
                    out.float(), batch[1][:n], reduction="none", ignore_index=IGNORE_INDEX
                )
                values = [float(v) for v in losses]
                report.loss_source = "cross-entropy per sample (no loss_fn given)"
            else:
                values = [float(loss_fn(model, _slice(batch, i))) for i in range(n)]
                report.loss_source = "the factory's loss_fn, one sample at a time"
    except Exception as exc:  # noqa: BLE001 - the user's factory or model; say what happened
        report.notes.append(f"per-sample loss could not be recomputed: {exc!r}")
        return
    for s, v in zip(report.samples, values, strict=False):
        s.loss = v
    if len(report.samples) > n:
        report.notes.append(f"per-sample loss computed for the first {n} samples only")


def _slice(batch: Any, i: int) -> Any:
    import torch

    if isinstance(batch, torch.Tensor):
        return batch[i : i + 1]
    if isinstance(batch, dict):
        return {k: _slice(v, i) for k, v in batch.items()}
    if isinstance(batch, (list, tuple)):
        return type(batch)(_slice(v, i) for v in batch)
    return batch


# ------------------------------------------------------------------------------------------------
# small helpers


def value_stats(x: np.ndarray) -> dict[str, Any]:
    xf = x.astype(np.float64).reshape(-1)
    ok = xf[np.isfinite(xf)]
    return {
        "min": _plain(float(ok.min())) if ok.size else None,
        "max": _plain(float(ok.max())) if ok.size else None,
        "mean": _plain(float(ok.mean())) if ok.size else None,
        "nonfinite": int(xf.size - ok.size),
    }


def fmt_value(v: Any) -> str:
    f = float(v)
    if math.isnan(f):
        return "nan"
    if math.isinf(f):
        return "inf" if f > 0 else "-inf"
    return f"{f:.4g}"


def _label_text(y: Any) -> str:
    a = np.asarray(y)
    return str(a.item()) if a.ndim == 0 else f"[{', '.join(str(v) for v in a.reshape(-1)[:6])}…]"


def label_text(label: Any) -> str:
    """A label index as it is shown: 3, or the first target ids of a sequence."""
    if label is None:
        return "–"
    if isinstance(label, list):
        shown = [str(v) for v in label[:8]]
        return "[" + ", ".join(shown) + (", …]" if len(label) > 8 else "]")
    return str(label)


def _plain(v: Any) -> Any:
    if isinstance(v, float):
        if math.isnan(v):
            return None
        if math.isinf(v):
            return "inf" if v > 0 else "-inf"
    if isinstance(v, list):
        return [_plain(x) for x in v]
    return v


def _read_json(p: Path) -> dict[str, Any] | None:
    try:
        data = loads(read_small_file(p))
    except (OSError, ValueError, RecursionError):
        return None
    return data if isinstance(data, dict) else None


def load_decoder(spec: str) -> Callable[[list[int]], str]:
    """``module:function`` or ``file.py:function`` -> a decoder of token ids into text."""
    try:
        return cast(Callable[[list[int]], str], load_factory(spec))
    except ReplayError as exc:
        raise ReportError(str(exc).replace("--model", "--decode")) from None


def load_model_factory(spec: str) -> Callable[[], Any]:
    try:
        return load_factory(spec)
    except ReplayError as exc:
        raise ReportError(str(exc)) from None
