"""Replay a snapshot: rebuild the model, restore the step's state and RNG, re-run forward and backward.

On the CPU a replay must reproduce the recorded loss and pre-clip gradient norm bit for bit (same
weights, same batch, same RNG, same thread count). Then the step can be examined at leisure:
``anomaly=True`` re-runs it under ``torch.autograd.detect_anomaly()`` to name the backward op that
produced the NaN (e.g. ``LogBackward0``) and the user's source line that created it, and watches every
forward op for the first one that turned finite inputs into NaN/Inf.

No code is unpickled: every file is read with ``torch.load(weights_only=True)``. The model comes from
the user's own factory, ``module:function`` or ``path/to/file.py:function``, which returns either the
model or a dict ``{"model": model, "loss_fn": loss_fn}`` where ``loss_fn(model, batch)`` returns the
loss exactly as the training loop computes it (forward included). Without ``loss_fn`` the batch must
be ``(inputs, targets)`` of a run with ``num_classes``, and the loss is ``F.cross_entropy(model(inputs), targets)``.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from nnwatch.diagnosis.anomaly_trace import (
    AnomalyReport,
    SourceLine,
    anomaly_mode,
    forward_watch,
)
from nnwatch.diagnosis.float_bits import bits_of, same_bits
from nnwatch.diagnosis.replay_result import ReplayResult
from nnwatch.diagnosis.snapshot_files import ReplayError, Snapshot, load_factory, load_snapshot
from nnwatch.diagnosis.snapshot_rng import restore_rng
from nnwatch.store.schema import FieldName

__all__ = [
    "AnomalyReport",
    "ReplayError",
    "ReplayResult",
    "Snapshot",
    "SourceLine",
    "load_factory",
    "load_snapshot",
    "replay",
]


def replay(
    snapshot: str | Path | Snapshot,
    factory: Callable[[], Any] | str | None = None,
    *,
    model: Any = None,
    loss_fn: Callable[[Any, Any], Any] | None = None,
    anomaly: bool = False,
    device: str = "cpu",
) -> ReplayResult:
    """Re-run the snapshot's step. Give ``factory`` (callable or ``"module:function"``) or ``model``."""
    import torch

    snp = snapshot if isinstance(snapshot, Snapshot) else load_snapshot(snapshot)
    man = snp.manifest
    if model is None:
        model, loss_fn = _built_model(factory, loss_fn)
    if not isinstance(model, torch.nn.Module):
        raise ReplayError(
            f"the factory returned {type(model).__name__}, not a torch.nn.Module (or a dict with 'model')"
        )
    weights = _load_weights(snp, model)
    batch = snp.batch()
    if loss_fn is None:
        loss_fn = _default_loss(batch, man)
    dev = torch.device(device)
    batch, notes = _placed(model, batch, man, dev)
    rng = snp.rng()
    threads = int(man.get("num_threads") or torch.get_num_threads())
    from nnwatch.tensors.layers import plan_layers  # lazy: pulls torch; diagnosis stays torch-free

    plan = plan_layers(model)
    first_bad: list[str] = []
    loss = _run_once(model, plan.params, batch, rng, loss_fn, threads, dev, first_bad, None)
    report = None
    if anomaly:
        report = _anomaly_pass(model, weights, plan.params, batch, rng, loss_fn, threads, dev)
    value = loss.detach().float().mean() if loss.numel() != 1 else loss.detach().float().reshape(())
    loss32 = np.float32(value.cpu().item())
    orig = snp.original()
    gn, method = _grad_norm_as_recorded(plan.params, dev, orig)
    bwd = _last_nonfinite_layer(plan)
    notes += _comparison_notes(orig, gn, report, float(loss32), bwd)
    return ReplayResult(
        step=snp.step,
        loss=float(loss32),
        grad_norm=float(gn),
        original_loss=None if orig is None else float(orig[FieldName.LOSS]),
        original_grad_norm=None if orig is None else float(orig[FieldName.GRAD_NORM]),
        loss_bits=bits_of(loss32),
        grad_norm_bits=bits_of(gn),
        original_loss_bits=None if orig is None else bits_of(orig[FieldName.LOSS]),
        original_grad_norm_bits=None if orig is None else bits_of(orig[FieldName.GRAD_NORM]),
        grad_norm_method=method,
        forward_nonfinite_module=first_bad[0] if first_bad else None,
        backward_nonfinite_module=bwd,
        anomaly=report,
        original_source=None if orig is None else orig.get("source"),
        notes=notes,
    )


def _placed(model: Any, batch: Any, man: dict[str, Any], dev: Any) -> tuple[Any, list[str]]:
    """The model and the batch on ``dev``, the model in the mode the step ran in; a note when
    the device type differs from the step's."""
    notes: list[str] = []
    model.to(dev)
    batch = _to_device(batch, dev)
    model.train(bool(man.get("model_training", True)))
    if str(man.get("device", "cpu")).split(":")[0] != dev.type:
        notes.append(
            f"the step ran on {man.get('device')} and is replayed on {dev}: bitwise equality is only expected on the same device type"
        )
    return batch, notes


def _built_model(
    factory: Callable[[], Any] | str | None, loss_fn: Callable[[Any, Any], Any] | None
) -> tuple[Any, Callable[[Any, Any], Any] | None]:
    """The model the user's factory builds (and its loss, when it returns a dict)."""
    if factory is None:
        raise ReplayError("give the model factory (--model module:function)")
    fn = load_factory(factory) if isinstance(factory, str) else factory
    try:
        built = fn()
    except Exception as exc:  # noqa: BLE001 - the user's factory failed
        raise ReplayError(f"the model factory raised {exc!r}") from exc
    if isinstance(built, dict):
        return built.get("model"), loss_fn or built.get("loss_fn")
    return built, loss_fn


def _load_weights(snp: Snapshot, model: Any) -> dict[str, Any]:
    """Load the snapshot's weights into ``model`` (prefixes matched); returns them for a reload."""
    state = snp.state()
    if "model" not in state:
        raise ReplayError("the snapshot holds no model state_dict")
    weights = match_prefix(state["model"], model)
    try:
        model.load_state_dict(weights)
    except RuntimeError as exc:
        raise ReplayError(
            "the factory builds a different model than the one snapshotted "
            f"({snp.manifest.get('model_class')}): {str(exc).splitlines()[0]}"
        ) from exc
    return weights


def _anomaly_pass(
    model: Any, weights: Any, params: Sequence[Any], batch: Any, rng: Any, loss_fn: Any, threads: int, dev: Any
) -> AnomalyReport:
    """A second pass, under anomaly mode: its backward stops at the first NaN, so the bitwise
    check uses the plain pass. Reload the state in case the forward updated buffers."""
    grads_plain = [None if p.grad is None else p.grad.clone() for p in params]
    model.load_state_dict(weights)
    report = AnomalyReport()
    _run_once(model, params, batch, rng, loss_fn, threads, dev, [], report)
    for p, g in zip(params, grads_plain, strict=True):
        p.grad = g
    return report


def _grad_norm_as_recorded(params: Sequence[Any], dev: Any, orig: dict[str, Any] | None) -> tuple[Any, str]:
    """The replayed gradient norm measured the way the recorded one was: the probe's, or torch's
    clip's when that is what the record holds (a clip was set, or only its bits match)."""
    grads = [p.grad for p in params if p.grad is not None]
    gn_probe, gn_torch = _grad_norms(grads, params, dev)
    clip = orig.get(FieldName.CLIP_THRESHOLD) if orig else None
    if (
        orig is not None
        and not same_bits(bits_of(gn_probe), bits_of(orig[FieldName.GRAD_NORM]))
        and same_bits(bits_of(gn_torch), bits_of(orig[FieldName.GRAD_NORM]))
    ):
        return gn_torch, "clip_grad_norm_ (w.clip_grad_norm_)"
    if clip is not None and math.isfinite(clip):
        return gn_torch, "clip_grad_norm_ (w.clip_grad_norm_)"
    return gn_probe, "probe (measured before optimizer.step)"


def _last_nonfinite_layer(plan: Any) -> str | None:
    """The layer nearest the output whose gradient holds a NaN or Inf (backward's first)."""
    import torch

    for j in range(len(plan.param_layer_names) - 1, -1, -1):
        own = [
            p
            for p, k in zip(plan.params, plan.param_layer_index, strict=True)
            if k == j and p.grad is not None
        ]
        if any(g.grad is not None and not bool(torch.isfinite(g.grad).all()) for g in own):
            return str(plan.param_layer_names[j])
    return None


def _comparison_notes(
    orig: dict[str, Any] | None, gn: Any, report: AnomalyReport | None, loss: float, bwd: str | None
) -> list[str]:
    """What a reader of the result must know: nothing recorded to compare, a norm that differs,
    or an anomaly trace with nothing to trace."""
    notes: list[str] = []
    if orig is None:
        notes.append(
            "the original loss and gradient norm were not found (no record.json, no run log next to the snapshot)"
        )
    elif orig is not None and not same_bits(bits_of(gn), bits_of(orig[FieldName.GRAD_NORM])):
        notes.append(
            "the replayed gradient norm differs from the recorded one: the recorded norm is taken "
            "before any clip (torch's own clip_grad_norm_ is seen directly), so a difference means "
            "the step did not reproduce exactly (a data-dependent op, another thread count or "
            "device, or a model changed since the snapshot)"
        )
    if (
        report is not None
        and report.backward_op is None
        and report.forward_op is None
        and math.isfinite(loss)
        and math.isfinite(float(gn))
        and bwd is None
    ):
        notes.append("the loss and gradients are finite: this step holds no NaN to trace")
    return notes


def _run_once(
    model: Any,
    params: Any,
    batch: Any,
    rng: dict[str, Any],
    loss_fn: Callable[[Any, Any], Any],
    threads: int,
    dev: Any,
    first_bad: list[str],
    report: AnomalyReport | None,
) -> Any:
    """Restore the RNG, run forward and backward once; gradients are left in ``p.grad``."""
    import torch

    for p in params:
        p.grad = None
    prev_threads = torch.get_num_threads()
    torch.set_num_threads(threads)
    hooks = forward_watch(model, first_bad)
    try:
        restore_rng(rng, cuda=dev.type == "cuda")
        with anomaly_mode(report):
            loss = loss_fn(model, batch)
            if not isinstance(loss, torch.Tensor):
                raise ReplayError(f"loss_fn returned {type(loss).__name__}, not a tensor")
            try:
                (loss if loss.numel() == 1 else loss.float().mean()).backward()
            except RuntimeError as exc:
                if report is None:
                    raise
                report.backward_error = str(exc).splitlines()[0]
                m = re.search(r"Function '(\w+)'", str(exc))
                if m and not report.backward_op:
                    report.backward_op = m.group(1)
    finally:
        for h in hooks:
            h.remove()
        torch.set_num_threads(prev_threads)
    return loss


def match_prefix(weights: dict[str, Any], model: Any) -> dict[str, Any]:
    """Strip the ``module.`` / ``_orig_mod.`` prefix that DDP / torch.compile wrappers add, when
    the factory builds the bare model."""
    want = set(model.state_dict())
    for prefix in ("module.", "_orig_mod."):
        if (
            weights
            and all(k.startswith(prefix) for k in weights)
            and not any(k.startswith(prefix) for k in want)
        ):
            weights = {k[len(prefix) :]: v for k, v in weights.items()}
    return weights


def _default_loss(batch: Any, man: dict[str, Any]) -> Callable[[Any, Any], Any]:
    if isinstance(batch, (tuple, list)) and len(batch) == 2 and man.get("num_classes"):
        import torch.nn.functional as F

        def ce(model: Any, b: Any) -> Any:
            return F.cross_entropy(model(b[0]), b[1])

        return ce
    raise ReplayError(
        "cannot tell how the loss was computed: let the factory return "
        "{'model': model, 'loss_fn': loss_fn} with loss_fn(model, batch) -> loss, computed exactly "
        "as in the training loop"
    )


def _grad_norms(grads: list[Any], params: Any, dev: Any) -> tuple[np.float32, np.float32]:
    """The global norm as the probe measures it, and as clip_grad_norm_ does (float32 each)."""
    import torch

    from nnwatch.tensors import torch_clip as gradmath  # lazy: pulls torch
    from nnwatch.tensors.grad_norms import recorded_squares  # lazy: pulls torch

    if not grads:
        return np.float32(np.nan), np.float32(np.nan)
    probe = float(recorded_squares(grads, dev)[1])
    with_grad = [p for p in params if p.grad is not None]
    total = gradmath.global_norm(with_grad, 2.0)
    return (
        np.float32(probe),
        np.float32(total.to(torch.float32).cpu().item()),
    )


def _to_device(obj: Any, dev: Any) -> Any:
    import torch

    if isinstance(obj, torch.Tensor):
        return obj.to(dev)
    if isinstance(obj, dict):
        return {k: _to_device(v, dev) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        items = [_to_device(v, dev) for v in obj]
        return items if isinstance(obj, list) else tuple(items)
    return obj
