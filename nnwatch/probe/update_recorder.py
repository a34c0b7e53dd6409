"""What each measured update did to the weights: the step's most direct evidence.

A loss curve shows that a run does not learn; the update shows why. For each parameter-owning
layer the recorder keeps the weight norm, the norm of the change the optimizer made and the share
of elements with a non-zero gradient that it left bit for bit unchanged (an update that rounded
away); for the run, the optimizer's trainable parameters that have never had a gradient at a
measured update and the model's parameters that had one but belong to no parameter group. Bugs that live in the update (weights that never move, decay that pins them, updates that
round away in bf16, a layer whose weight is rebuilt from ``.data``) show here and nowhere else.

On a measured step, right before the update, a fixed prefix of each parameter (all of it for a
small one, at most ``cap`` elements, and at most ``total`` for the whole model) and the signs of
its gradient are copied into float32 buffers made once (fused copies); after the update the
difference, its norm and the count of elements whose gradient and change are both non-zero are
taken with fused ops and folded per layer with one ``index_add_``. Everything
stays on the device: the numbers reach the host with the step's record, a step late on a GPU.
The update norm of a parameter larger than its sample is the sample's scaled by
sqrt(size / sample), an estimate of the same quantity.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any, NamedTuple

import torch

from nnwatch.probe.buffers import DEV_INDEX, StepBuffers
from nnwatch.tensors.grad_norms import F32_MAX
from nnwatch.tensors.layers import LayerPlan

SAMPLE_CAP = 65536  # elements of one parameter compared before and after an update
SAMPLE_TOTAL = 1 << 22  # elements compared over the whole model (16 MiB of float32)
_NO_SHARES = (math.nan, math.nan)
_FROZEN = DEV_INDEX["update_frozen"]
_DRIFT = DEV_INDEX["weight_drift"]


def local_tensor(t: torch.Tensor) -> torch.Tensor:
    """A plain tensor of ``t``'s own elements: a DTensor's local shard, else ``t`` detached."""
    local = getattr(t, "to_local", None)
    return (local() if callable(local) else t).detach()


def _numel(t: torch.Tensor) -> int:
    return int(local_tensor(t).numel())


class UpdateRecorder:
    """Owns the before-update samples and writes the update fields of the step record."""

    def __init__(
        self,
        plan: LayerPlan,
        buffers: StepBuffers,
        optimizer: Any,
        cap: int = SAMPLE_CAP,
        total: int = SAMPLE_TOTAL,
    ) -> None:
        self.plan = plan
        self.buf = buffers
        self.optimizer = optimizer  # where the parameter groups are read (None: the model's)
        self.cap = max(1, int(cap))
        self.total = max(1, int(total))
        self._layer_of = {id(p): j for p, j in zip(plan.params, plan.param_layer_index, strict=True)}
        self._num_layers = len(plan.param_layer_names)
        #: the parameters sampled before this step's update, their samples' sizes, copies of
        #: the samples and the signs of their gradients
        self._pending: tuple[list[torch.Tensor], list[int], list[torch.Tensor], list[torch.Tensor]] | None = None
        self._buffers: dict[tuple[int, int, int, torch.dtype, torch.device], torch.Tensor] = {}
        #: the parameters seen with a gradient at some measured update (``params_no_grad`` counts
        #: the trainable ones never seen so: a layer that backward never reaches)
        self._had_grad: set[int] = set()
        #: the version counter of each model parameter outside the optimizer at the last measured
        #: update: one that changes is updated by someone (another optimizer: a GAN's other side)
        self._versions: dict[int, int] = {}
        #: (optimizer's trainable elements without a gradient, model's elements with a gradient
        #: in no group), as shares, on the step measured last; NaN when not measured
        self.shares = _NO_SHARES
        self._fold_cache: tuple[Any, _Fold] | None = None
        #: the samples as the first measured update found them (``weight_drift``), for the
        #: parameter set of that fold
        self._start: tuple[Any, list[torch.Tensor]] | None = None

    # -- before the update -----------------------------------------------------------------------
    def held(self) -> list[torch.Tensor]:
        """The parameters the update acts on: every group's, or the model's without an optimizer."""
        groups = getattr(self.optimizer, "param_groups", None) if self.optimizer is not None else None
        if not groups:
            return list(self.plan.params)
        out: list[torch.Tensor] = []
        for g in groups:
            ps = g.get("params", ()) if isinstance(g, dict) else ()
            out.extend(p for p in ps if isinstance(p, torch.Tensor))
        return out

    def before(self) -> None:
        """Right before the update of a measured step: the shares and the samples."""
        held = self.held()
        trainable = [p for p in held if p.requires_grad]
        with_grad = [p for p in trainable if p.grad is not None]
        self._had_grad.update(id(p) for p in with_grad)
        never = [p for p in trainable if id(p) not in self._had_grad]
        self.shares = (_share(trainable, never, absent=False), self._unoptimized(held))
        if not with_grad:
            self._pending = None
            return
        sizes = self._sample_sizes(with_grad)
        samples = [local_tensor(p).reshape(-1)[:k] for p, k in zip(with_grad, sizes, strict=True)]
        copies = [self._buffer(p, k, s, 0) for p, k, s in zip(with_grad, sizes, samples, strict=True)]
        torch._foreach_copy_(copies, samples)
        grads = [local_tensor(p.grad).reshape(-1)[:k] for p, k in zip(with_grad, sizes, strict=True)]  # type: ignore[arg-type]
        signs = [self._buffer(p, k, g, 1) for p, k, g in zip(with_grad, sizes, grads, strict=True)]
        torch._foreach_copy_(signs, grads)
        torch._foreach_sign_(signs)
        self._pending = (with_grad, sizes, copies, signs)

    def _unoptimized(self, held: list[torch.Tensor]) -> float:
        """The share of the model's gradient-carrying elements that no parameter group holds and
        nothing else updates either: another optimizer (a GAN's other side, a second optimizer
        with its own LR) updates its parameters in place, which moves their version counter."""
        if self.optimizer is None or not hasattr(self.optimizer, "param_groups"):
            return math.nan
        ids = {id(p) for p in held}
        with_grad = [p for p in self.plan.params if p.grad is not None]
        outside: list[torch.Tensor] = []
        versions = self._versions
        for p in with_grad:
            if id(p) in ids:
                continue
            now = _version(p)
            seen = versions.get(id(p))
            versions[id(p)] = now
            if seen is not None and seen == now:
                outside.append(p)  # not in a group, and not changed since the last look
        return _share(with_grad, outside, absent=False)

    def _sample_sizes(self, params: list[torch.Tensor]) -> list[int]:
        sizes = [min(_numel(p), self.cap) for p in params]
        over = sum(sizes)
        if over > self.total:  # a big model: every sample shrinks by the same factor
            f = self.total / over
            sizes = [max(1, min(s, int(s * f))) for s in sizes]
        return sizes

    def _buffer(self, p: torch.Tensor, k: int, sample: torch.Tensor, role: int) -> torch.Tensor:
        """The float32 (float64 for a float64 parameter) buffer of ``p``'s sample, made once:
        ``role`` 0 for the weights, 1 for the signs of their gradient."""
        dtype = torch.float64 if sample.dtype == torch.float64 else torch.float32
        key = (id(p), k, role, dtype, sample.device)
        buf = self._buffers.get(key)
        if buf is None:
            if len(self._buffers) > 4 * len(self._layer_of) + 64:  # parameters that come and go
                self._buffers.clear()
            buf = self._buffers[key] = torch.empty(k, dtype=dtype, device=sample.device)
        return buf

    def cancel(self) -> None:
        """The update will not happen (a skipped step): nothing to compare."""
        self._pending = None

    # -- after the update ------------------------------------------------------------------------
    def after(self) -> bool:
        """After the update: the update fields into the step record. False when none was taken."""
        pending, self._pending = self._pending, None
        if pending is None:
            return False
        params, sizes, diffs, signs = pending
        now = [local_tensor(p).reshape(-1)[:k] for p, k in zip(params, sizes, strict=True)]
        torch._foreach_sub_(diffs, now)  # before - after: the update, with its sign flipped
        dev = self.buf.dev.device
        fold = self._fold(params, sizes, dev)
        upd = _stack(torch._foreach_norm(diffs), dev)
        weights = _stack(torch._foreach_norm([local_tensor(p) for p in params]), dev)
        drift = self._drift(fold, params, copies=diffs, now=now)
        pushed = _stack(torch._foreach_norm(signs, 0), dev)  # elements with a gradient
        torch._foreach_sign_(diffs)
        torch._foreach_mul_(signs, diffs)
        moved = _stack(torch._foreach_norm(signs, 0), dev)  # ... that the update moved
        per_param = torch.stack((weights.square(), upd.square() * fold.scale, moved, pushed))
        self._write_run(per_param, drift)
        if fold.index is not None:
            self._write_layers(fold, per_param)
        return True

    def _fold(self, params: list[torch.Tensor], sizes: list[int], dev: torch.device) -> _Fold:
        """The constant tensors of this set of parameters, on the device, made once: building
        one from a Python list on a GPU is a blocking copy (a host sync)."""
        key = (tuple(id(p) for p in params), tuple(sizes), dev)
        if self._fold_cache is not None and self._fold_cache[0] == key:
            return self._fold_cache[1]
        numel = torch.tensor([float(_numel(p)) for p in params], dtype=torch.float64)
        sampled = torch.tensor([float(k) for k in sizes], dtype=torch.float64)
        scale = (numel / sampled).to(dev)
        owners = [self._layer_of.get(id(p), -1) for p in params]
        keep = [i for i, j in enumerate(owners) if j >= 0]
        index = columns = absent = None
        if keep and self._num_layers:
            index = torch.tensor([owners[i] for i in keep], dtype=torch.long).to(dev)
            columns = torch.tensor(keep, dtype=torch.long).to(dev)
            mask = torch.ones(self._num_layers, dtype=torch.bool)
            mask[[owners[i] for i in keep]] = False
            absent = mask.to(dev)
        fold = _Fold(key, scale, index, columns, absent)
        self._fold_cache = (key, fold)
        return fold

    def _drift(
        self, fold: _Fold, params: list[torch.Tensor], copies: list[torch.Tensor],
        now: list[torch.Tensor],
    ) -> torch.Tensor:
        """||w - w_start|| over the samples, scaled like the update norm. The start is where the
        first measured update found the weights (``copies`` hold before - after by now, so the
        start is taken as after + that), taken again when the parameter set changes."""
        key = fold.key
        if self._start is None or self._start[0] != key:
            start = [c.clone() for c in copies]
            torch._foreach_add_(start, now)  # before = (before - after) + after
            self._start = (key, start)
        dist = torch._foreach_sub(self._start[1], now)
        sq = _stack(torch._foreach_norm(dist), self.buf.dev.device).square() * fold.scale
        return sq.sum().sqrt()

    def _write_run(self, per_param: torch.Tensor, drift: torch.Tensor) -> None:
        moved, pushed = per_param[2].sum(), per_param[3].sum()
        frozen = 1.0 - moved / pushed  # NaN when no sampled element had a gradient
        host = self.buf.dev_np
        if host is not None:
            host[_FROZEN] = float(frozen)  # CPU tensors: no sync
            host[_DRIFT] = float(drift)
        else:
            self.buf.slot("update_frozen").copy_(frozen)
            self.buf.slot("weight_drift").copy_(drift)

    def _write_layers(self, fold: _Fold, per_param: torch.Tensor) -> None:
        """Fold the per-parameter sums into the layers' rows (one index_add_)."""
        assert fold.index is not None and fold.columns is not None and fold.absent is not None
        acc = torch.zeros(4, self._num_layers, dtype=torch.float64, device=per_param.device)
        acc.index_add_(1, fold.index, per_param.index_select(1, fold.columns))
        rows = (acc[0].sqrt(), acc[1].sqrt(), 1.0 - acc[2] / acc[3])
        b = self.buf
        for out, row in zip((b.weight_layer, b.update_layer, b.frozen_layer), rows, strict=True):
            row = row.masked_fill(fold.absent, math.nan)
            out.copy_(torch.where(torch.isfinite(row), row.clamp(-F32_MAX, F32_MAX), row))


class _Fold(NamedTuple):
    """Per parameter set: each parameter's size over its sample's, and the layer fold's indices."""

    key: Any
    scale: torch.Tensor
    index: torch.Tensor | None
    columns: torch.Tensor | None
    absent: torch.Tensor | None


def update_setup(plan: LayerPlan, optimizer: Any) -> dict[str, float]:
    """What a judge of the updates needs to know of the set-up (``meta.json``'s ``extra``): the
    largest weight decay of the optimizer's groups, and the share of the model's trainable
    elements held in half precision (whose updates round away first)."""
    decay = 0.0
    for g in getattr(optimizer, "param_groups", None) or ():
        try:
            decay = max(decay, float(g.get("weight_decay", 0.0) or 0.0))
        except (TypeError, ValueError, AttributeError):
            continue
    total = sum(_numel(p) for p in plan.params)
    half = sum(_numel(p) for p in plan.params if p.dtype in (torch.float16, torch.bfloat16))
    return {"weight_decay": decay, "half_precision_share": half / total if total else 0.0}


def _version(p: torch.Tensor) -> int:
    """The parameter's in-place version counter (host metadata: no sync); -1 when it has none."""
    try:
        return int(local_tensor(p)._version)
    except (AttributeError, RuntimeError):
        return -1


def _share(whole: list[torch.Tensor], part: list[torch.Tensor], *, absent: bool) -> float:
    """``part``'s elements as a share of ``whole``'s (``absent``: of those ``part`` leaves out)."""
    n = sum(_numel(p) for p in whole)
    if n == 0:
        return math.nan
    m = sum(_numel(p) for p in part)
    return (n - m) / n if absent else m / n


def _stack(values: Sequence[torch.Tensor], device: torch.device) -> torch.Tensor:
    return torch.stack([v.to(device=device, dtype=torch.float64) for v in values])
