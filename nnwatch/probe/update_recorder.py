"""What each measured update did to the weights: the step's most direct evidence.

A loss curve shows that a run does not learn; the update shows why. For each parameter-owning
layer the recorder keeps the weight norm, the norm of the change the optimizer made and the share
of elements with a non-zero gradient that it left bit for bit unchanged (an update that rounded
away); for the run, the optimizer's trainable parameters that have never had a gradient at a
measured update and the model's parameters that had one but belong to no parameter group. Bugs that
live in the update (weights that never move, decay that pins them, updates that round away in
bf16, a layer whose weight is rebuilt from ``.data``) show here and nowhere else.

On a measured step, right before the update, a fixed prefix of each parameter (all of it for a
small one, at most ``cap`` elements, and at most ``total`` for the whole model) is gathered into
one flat buffer, and the signs of its gradient into a second (one ``cat`` each); after the update
the parameters are gathered again and a handful of whole-buffer ops (difference, squares, sign
products, one segment sum per quantity) give every parameter's numbers at once, whatever the
parameter count. Everything stays on the device: the numbers reach the host with the step's
record, a step late on a GPU. The update norm of a parameter larger than its sample is the
sample's scaled by sqrt(size / sample), an estimate of the same quantity.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

import numpy as np
import torch

from nnwatch.probe.buffers import DEV_INDEX, StepBuffers
from nnwatch.store.schema import FieldName
from nnwatch.tensors.grad_norms import F32_MAX
from nnwatch.tensors.layers import LayerPlan

SAMPLE_CAP = 65536  # elements of one parameter compared before and after an update
SAMPLE_TOTAL = 1 << 22  # elements compared over the whole model (16 MiB of float32)
#: On the CPU, where the samples are read with the step's own cores, smaller ones: a ratio and an
#: unchanged share are estimated as well from a few hundred elements per parameter
CPU_SAMPLE_CAP, CPU_SAMPLE_TOTAL = 4096, 1 << 15
_NO_SHARES = (math.nan, math.nan)
_FROZEN = DEV_INDEX[FieldName.UPDATE_FROZEN]
_DRIFT = DEV_INDEX[FieldName.WEIGHT_DRIFT]


def local_tensor(t: torch.Tensor) -> torch.Tensor:
    """A plain tensor of ``t``'s own elements: a DTensor's local shard, else ``t`` detached."""
    local = getattr(t, "to_local", None)
    return (local() if callable(local) else t).detach()


class _Layout(NamedTuple):
    """Parameters sampled together (one device, one float width): where each one's sample lies in
    the flat buffers, and the constants of the segment sums, made once per parameter set."""

    key: tuple[Any, ...]
    params: list[torch.Tensor]
    sizes: list[int]
    views: list[torch.Tensor]  # each parameter's sample: a view of its storage
    segment: torch.Tensor  # (S,) the parameter each element belongs to
    offsets: Any  # numpy (P,): where each parameter's sample starts (the CPU's segment sums)
    scale: torch.Tensor  # (P,) float64: size over sample size
    before: torch.Tensor  # (S,) the samples before the update, then their change
    signs: torch.Tensor  # (S,) the signs of the gradient's samples
    now: torch.Tensor  # (S,) scratch: the samples after the update
    start: torch.Tensor  # (S,) the samples as the first measured update found them
    fold: tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None  # (layer, columns, absent)


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
        self._layouts: list[_Layout] = []  # of the last parameter set sampled
        self._pending = False  # samples taken before this step's update
        #: the parameters seen with a gradient at some measured update (``params_no_grad`` counts
        #: the trainable ones never seen so: a layer that backward never reaches)
        self._had_grad: set[int] = set()
        #: the version counter of each model parameter outside the optimizer at the last measured
        #: update: one that changes is updated by someone (another optimizer: a GAN's other side)
        self._versions: dict[int, int] = {}
        self._numel: dict[int, int] = {}  # each parameter's size, read once
        #: (optimizer's trainable elements never given a gradient, model's elements with a
        #: gradient in no group), as shares, on the step measured last; NaN when not measured
        self.shares = _NO_SHARES
        self._shares_taken = False  # before() ran on this step: its shares belong to the record
        #: told each measured update's per-parameter weight and update squares (a sharded
        #: model's reduce makes them whole)
        self.on_sums: Callable[[list[torch.Tensor], Any, Any], None] | None = None

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
        self.shares = (self._share(trainable, never), self._unoptimized(held))
        self._shares_taken = True
        self._pending = bool(with_grad)
        if not with_grad:
            return
        self._layouts = self._layouts_for(with_grad)
        for lay in self._layouts:
            torch.cat(lay.views, out=lay.before)
            torch.cat([_prefix(p.grad, k) for p, k in zip(lay.params, lay.sizes, strict=True)], out=lay.signs)  # type: ignore[arg-type]
            lay.signs.sign_()

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
        return self._share(with_grad, outside)

    def _share(self, whole: Sequence[torch.Tensor], part: Sequence[torch.Tensor]) -> float:
        """``part``'s elements as a share of ``whole``'s (a DTensor counts its whole size)."""
        sizes = self._numel
        if len(sizes) > 4 * len(self._layer_of) + 1024:  # parameters that come and go
            sizes.clear()
        n = m = 0
        for p in whole:
            k = sizes.get(id(p))
            if k is None:
                k = sizes[id(p)] = p.numel()
            n += k
        for p in part:
            m += sizes.get(id(p)) or p.numel()
        return m / n if n else math.nan

    def _layouts_for(self, params: list[torch.Tensor]) -> list[_Layout]:
        """The layouts of this parameter set: the last ones when nothing changed (same
        parameters, same storage), else made anew (a first step, a model moved or rebuilt)."""
        key = tuple((id(p), p.data_ptr()) for p in params)
        if self._layouts and self._layouts[0].key[0] == key:
            return self._layouts
        sizes = self._sample_sizes(params)
        groups: dict[tuple[torch.device, bool], list[int]] = {}
        for i, p in enumerate(params):
            groups.setdefault((p.device, p.dtype == torch.float64), []).append(i)
        return [
            self._layout(key, [params[i] for i in idx], [sizes[i] for i in idx], dev, wide)
            for (dev, wide), idx in groups.items()
        ]

    def _layout(
        self, key: Any, params: list[torch.Tensor], sizes: list[int], dev: torch.device, wide: bool
    ) -> _Layout:
        dtype = torch.float64 if wide else torch.float32
        n = sum(sizes)
        seg = torch.repeat_interleave(torch.arange(len(params)), torch.tensor(sizes))
        offsets = np.concatenate(([0], np.cumsum(sizes)[:-1])).astype(np.intp)
        numel = torch.tensor([float(local_tensor(p).numel()) for p in params], dtype=torch.float64)
        scale = numel / torch.tensor([float(k) for k in sizes], dtype=torch.float64)
        views = [local_tensor(p).reshape(-1)[:k] for p, k in zip(params, sizes, strict=True)]
        owners = [self._layer_of.get(id(p), -1) for p in params]
        keep = [i for i, j in enumerate(owners) if j >= 0]
        fold = None
        if keep and self._num_layers:
            absent = torch.ones(self._num_layers, dtype=torch.bool)
            absent[[owners[i] for i in keep]] = False
            fold = (
                torch.tensor([owners[i] for i in keep], dtype=torch.long).to(dev),
                torch.tensor(keep, dtype=torch.long).to(dev),
                absent.to(dev),
            )
        start = torch.cat(views).to(dtype)  # where the first measured update found the weights
        return _Layout(
            (key,), params, sizes, views, seg.to(dev), offsets, scale.to(dev),
            torch.empty(n, dtype=dtype, device=dev), torch.empty(n, dtype=dtype, device=dev),
            torch.empty(n, dtype=dtype, device=dev), start, fold,
        )  # fmt: skip

    def _sample_sizes(self, params: list[torch.Tensor]) -> list[int]:
        on_cpu = all(p.device.type == "cpu" for p in params)
        cap = min(self.cap, CPU_SAMPLE_CAP) if on_cpu else self.cap
        total = min(self.total, CPU_SAMPLE_TOTAL) if on_cpu else self.total
        sizes = [min(int(local_tensor(p).numel()), cap) for p in params]
        over = sum(sizes)
        if over > total:  # a big model: every sample shrinks by the same factor
            f = total / over
            sizes = [max(1, min(s, int(s * f))) for s in sizes]
        return sizes

    def take_shares(self) -> tuple[float, float]:
        """This step's shares (without a gradient, outside the optimizer), once: NaN when the
        step took none (not measured), even when nothing could be sampled (no gradient at all)."""
        taken, self._shares_taken = self._shares_taken, False
        return self.shares if taken else _NO_SHARES

    def cancel(self) -> None:
        """The update will not happen (a skipped step): nothing to compare."""
        self._pending = False

    # -- after the update ------------------------------------------------------------------------
    def after(self) -> bool:
        """After the update: the update fields into the step record. False when none was taken."""
        if not self._pending:
            return False
        self._pending = False
        if self.buf.dev_np is not None and all(lay.before.is_cpu for lay in self._layouts):
            self._after_host()  # numpy: a microsecond a call where torch's are five to ten
            return True
        dev = self.buf.dev.device
        parts = [self._sums(lay) for lay in self._layouts]
        per_param = torch.cat([p.to(dev) for p, _, _ in parts], dim=1)
        if self.on_sums is not None:
            self.on_sums([p for lay in self._layouts for p in lay.params], per_param[0], per_param[1])
        drift = sum(d.to(dev) for _, d, _ in parts)
        self._write_run(per_param, torch.as_tensor(drift, device=dev).sqrt())
        for lay, (pp, _, _) in zip(self._layouts, parts, strict=True):
            if lay.fold is not None:
                self._write_layers(lay.fold, pp)
        return True

    def _after_host(self) -> None:
        """:meth:`after` for a CPU run: the same numbers, in numpy, into the record's numpy
        views (the per-layer fold in Python for a model of a few parameters)."""
        per = [_host_sums(lay) for lay in self._layouts]
        sums = np.concatenate([p for p, _ in per], axis=1) if len(per) > 1 else per[0][0]
        if self.on_sums is not None:
            self.on_sums([p for lay in self._layouts for p in lay.params], sums[0], sums[1])
        drift = math.sqrt(sum(d for _, d in per))
        host = self.buf.dev_np
        assert host is not None
        pushed = float(sums[3].sum())
        host[_FROZEN] = 1.0 - float(sums[2].sum()) / pushed if pushed else math.nan
        host[_DRIFT] = drift
        owners = [self._layer_of.get(id(p), -1) for lay in self._layouts for p in lay.params]
        acc = np.zeros((4, self._num_layers + 1))  # the last column: parameters of no layer
        for k in range(4):
            np.add.at(acc[k], owners, sums[k])
        absent = acc[3, :-1] == 0.0
        absent[[j for j in owners if j >= 0]] = False
        with np.errstate(divide="ignore", invalid="ignore"):
            rows = (np.sqrt(acc[0, :-1]), np.sqrt(acc[1, :-1]), 1.0 - acc[2, :-1] / acc[3, :-1])
        b = self.buf
        for out, row in zip((b.weight_layer, b.update_layer, b.frozen_layer), rows, strict=True):
            row[absent] = math.nan
            out.numpy()[:] = np.clip(row, -F32_MAX, F32_MAX)  # NaN stays NaN, never Inf

    def _sums(self, lay: _Layout) -> tuple[torch.Tensor, torch.Tensor, None]:
        """Per parameter of one layout: (weight^2, scaled update^2, moved, pushed), and the
        squared distance from the start."""
        now, diff = lay.now, lay.before
        torch.cat(lay.views, out=now)
        diff.sub_(now)  # before - after: the update, its sign flipped
        drift = lay.start.sub(now)
        signs = lay.signs
        pushed = signs.abs()
        moved = signs.mul_(diff.sign()).abs_()  # a gradient and a change: both non-zero
        sums = _segment_sums(lay.segment, len(lay.params), diff, moved, pushed, drift)
        weights = torch._foreach_norm([local_tensor(q) for q in lay.params])
        out = sums[:4].clone()
        if len({w.dtype for w in weights}) == 1:
            out[0] = torch.stack(weights).to(sums.device, torch.float64).square_()
        else:
            out[0] = torch.stack([w.to(sums.device, torch.float64) for w in weights]).square_()
        out[1] *= lay.scale
        return out, (sums[4] * lay.scale).sum(), None

    def _write_run(self, per_param: torch.Tensor, drift: torch.Tensor) -> None:
        moved, pushed = per_param[2].sum(), per_param[3].sum()
        frozen = 1.0 - moved / pushed  # NaN when no sampled element had a gradient
        host = self.buf.dev_np
        if host is not None:
            host[_FROZEN] = float(frozen)  # CPU tensors: no sync
            host[_DRIFT] = float(drift)
        else:
            self.buf.slot(FieldName.UPDATE_FROZEN).copy_(frozen)
            self.buf.slot(FieldName.WEIGHT_DRIFT).copy_(drift)

    def _write_layers(
        self, fold: tuple[torch.Tensor, torch.Tensor, torch.Tensor], per_param: torch.Tensor
    ) -> None:
        """Fold the per-parameter sums into the layers' rows (one index_add_)."""
        index, columns, absent = fold
        acc = torch.zeros(4, self._num_layers, dtype=torch.float64, device=per_param.device)
        acc.index_add_(1, index, per_param.index_select(1, columns))
        rows = (acc[0].sqrt(), acc[1].sqrt(), 1.0 - acc[2] / acc[3])
        b = self.buf
        for out, row in zip((b.weight_layer, b.update_layer, b.frozen_layer), rows, strict=True):
            row = row.masked_fill(absent, math.nan)
            out.copy_(torch.where(torch.isfinite(row), row.clamp(-F32_MAX, F32_MAX), row))


def _prefix(g: torch.Tensor, k: int) -> torch.Tensor:
    """The first ``k`` elements of a gradient (a DTensor's local shard): a view where it can be."""
    if g.is_sparse:
        return _sparse_prefix(g, k)
    if type(g) is torch.Tensor and g.is_contiguous():
        return g.view(-1)[:k]
    return local_tensor(g).reshape(-1)[:k]


def _sparse_prefix(g: torch.Tensor, k: int) -> torch.Tensor:
    """The first ``k`` elements of a sparse gradient (an ``Embedding(sparse=True)``'s), dense:
    only the rows the batch touched are non-zero, as in the dense gradient."""
    g = g.coalesce()
    idx, vals = g.indices(), g.values()
    dense = vals[0].numel() if vals.shape[0] else int(torch.Size(g.shape[g.sparse_dim():]).numel())
    strides = torch.ones(g.sparse_dim(), dtype=torch.long, device=idx.device)
    for d in range(g.sparse_dim() - 2, -1, -1):
        strides[d] = strides[d + 1] * g.shape[d + 1]
    flat = ((idx * strides[:, None]).sum(0)[:, None] * dense + torch.arange(dense, device=idx.device)).reshape(-1)
    keep = flat < k
    out = torch.zeros(k, dtype=vals.dtype, device=vals.device)
    out[flat[keep]] = vals.reshape(-1)[keep]
    return out


def _host_sums(lay: _Layout) -> tuple[np.ndarray, float]:
    """Per parameter of one CPU layout, in numpy: rows (weight^2, scaled update^2, moved,
    pushed), and the squared distance from the start."""
    torch.cat(lay.views, out=lay.now)
    now, d, s = lay.now.numpy(), lay.before.numpy(), lay.signs.numpy()
    d -= now  # before - after: the update, its sign flipped
    e = lay.start.numpy() - now
    offsets, scale = lay.offsets, lay.scale.numpy()
    out = np.empty((4, len(offsets)))
    out[1] = np.add.reduceat(np.square(d, dtype=np.float64), offsets) * scale
    pushed = np.abs(s)
    out[3] = np.add.reduceat(pushed, offsets)
    out[2] = np.add.reduceat(np.abs(s * np.sign(d)), offsets)
    weights = torch._foreach_norm([local_tensor(q) for q in lay.params])
    out[0] = [float(w) ** 2 for w in weights]
    far = np.add.reduceat(np.square(e, dtype=np.float64), offsets)
    return out, float(np.dot(far, scale))


def _segment_sums(
    segment: torch.Tensor, n: int, diff: torch.Tensor, moved: torch.Tensor, pushed: torch.Tensor,
    drift: torch.Tensor,
) -> torch.Tensor:
    """(P,) sums per parameter as rows: _, update^2, moved, pushed, drift^2 (float64), with
    ``index_add_`` (atomic adds on a GPU)."""
    out = torch.zeros(5, n, dtype=torch.float64, device=diff.device)
    out[1].index_add_(0, segment, diff.double().square_())
    out[2].index_add_(0, segment, moved.double())
    out[3].index_add_(0, segment, pushed.double())
    out[4].index_add_(0, segment, drift.double().square_())
    return out


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
    total = sum(p.numel() for p in plan.params)
    half = sum(p.numel() for p in plan.params if p.dtype in (torch.float16, torch.bfloat16))
    return {"weight_decay": decay, "half_precision_share": half / total if total else 0.0}


def _version(p: torch.Tensor) -> int:
    """The parameter's in-place version counter (host metadata: no sync); -1 when it has none."""
    try:
        return int(local_tensor(p)._version)
    except (AttributeError, RuntimeError):
        return -1

