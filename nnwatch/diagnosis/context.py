"""What detectors know about a run beyond its records: layer names and kinds in forward order,
which parameter-owning layer comes where, their sizes, the optimizer family and ``num_classes``.

The same context can be built from a live :class:`~nnwatch.probe.watch.Watch` (with the model at
hand) or from a recorded run's ``meta.json`` (offline diagnosis), where the sizes are unknown and
the rules that need them switch off.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from functools import cached_property
from typing import Any

import numpy as np

from nnwatch.store.schema import RunMeta

#: Activation modules whose outputs are exactly zero where the unit is inactive.
RECTIFIER_KINDS = frozenset({"ReLU", "ReLU6", "Threshold"})
#: Layers whose gradient is sparse by design (only the rows looked up get one); the gradient
#: ratio rules skip them.
SPARSE_GRAD_KINDS = frozenset({"Embedding", "EmbeddingBag"})
#: Optimizers whose step is lr * (normalized direction): the update size is about lr per element.
ADAPTIVE_OPTIMIZERS = frozenset(
    {
        "Adam",
        "AdamW",
        "Adamax",
        "NAdam",
        "RAdam",
        "RMSprop",
        "Adagrad",
        "Adadelta",
        "SparseAdam",
        "Adafactor",
        "Lion",
    }
)


@dataclass(frozen=True)
class RunContext:
    layer_names: tuple[str, ...]
    """Watched layers in forward order (the order of the per-layer arrays in each record)."""
    layer_kinds: tuple[str, ...]
    param_layer_names: tuple[str, ...]
    param_layer_kinds: tuple[str, ...]
    param_order: np.ndarray
    """Indices of the parameter-owning layers sorted from input to output (forward order)."""
    param_numel: np.ndarray | None
    """Elements per parameter-owning layer, or None when unknown (offline)."""
    num_classes: int | None = None
    optimizer: str | None = None
    """Optimizer class name, or None."""
    resumed: bool = False
    """The optimizer held state when the watch began: the model has trained already."""
    clip_before_unscale: bool = False
    """The probe saw torch's clip on gradients still holding the AMP loss scale (and said so):
    the clip-ratio rule would blame the threshold instead."""
    micro_batches: int = 1
    """Backward passes in the first step (gradient accumulation): a loss passed to ``w.step()``
    may be divided by it, as accumulation loops scale each micro-batch's loss."""
    param_norm: float = math.nan
    """L2 norm of all trainable parameters when diagnosis started (NaN when unknown)."""
    total_numel: int = 0
    optimizer_on_copy: bool = False
    """The optimizer holds parameters shaped exactly like the model's but none of the model's own
    (it was built on a copy): no update ever reaches the model. False when unknown (offline)."""
    unwatched_before: dict[int, tuple[str, ...]] | None = None
    """For watched layer i: leaf modules nnwatch does not hook that are registered between layer
    i-1 and layer i (custom modules, functional wrappers): suspects when layer i's output is the
    first non-finite one. None when unknown (offline)."""
    loss_form: str = ""
    """What the first loss's graph showed: ``cross_entropy`` (plain or label-smoothed),
    ``terms`` (other parts added: a distillation KL, an auxiliary loss), ``other``, or ``""``
    when unknown (a float was passed, an older run)."""
    loss_broadcast: str = ""
    """A prediction broadcast against a target of another shape in the loss, in words."""
    weight_decay: float = 0.0
    """The largest weight decay of the optimizer's parameter groups."""
    half_precision_share: float = 0.0
    """The share of trainable elements held in float16/bfloat16."""
    loss_outside: int = 0
    """Trainable elements in the first loss's graph that neither the model nor its optimizer
    holds: another network trained elsewhere (a GAN's other side)."""
    loss_detached: bool = False
    """The first loss's graph reaches none of the model's outputs: no gradient of it can."""
    loss_squashed: str = ""
    """The loss squashes an output already squashed (a sigmoid, a softmax), in words."""
    output_layers: tuple[str, ...] = ()
    """Sigmoid layers the first loss reads with BCE: near 0 and 1 there means sure predictions,
    and the loss undoes the sigmoid's derivative."""

    @property
    def num_layers(self) -> int:
        return len(self.layer_names)

    @property
    def num_param_layers(self) -> int:
        return len(self.param_layer_names)

    @cached_property
    def dense_param_order(self) -> np.ndarray:
        """Parameter-owning layers in forward order, without embeddings (sparse gradients)."""
        return np.array(
            [j for j in self.param_order if self.param_layer_kinds[j] not in SPARSE_GRAD_KINDS],
            dtype=np.int64,
        )

    def layer_label(self, i: int) -> str:
        return f"{self.layer_names[i]} ({self.layer_kinds[i]})"

    def param_label(self, j: int) -> str:
        kind = self.param_layer_kinds[j]
        return self.param_layer_names[j] if kind == "?" else f"{self.param_layer_names[j]} ({kind})"

    # ----------------------------------------------------------------------------------------------
    @classmethod
    def from_meta(cls, meta: RunMeta) -> RunContext:
        s = meta.schema
        kinds = dict(zip(s.layer_names, s.layer_kinds, strict=True))
        pk = tuple(kinds.get(n, "?") for n in s.param_layer_names)
        return cls(
            layer_names=tuple(s.layer_names),
            layer_kinds=tuple(s.layer_kinds),
            param_layer_names=tuple(s.param_layer_names),
            param_layer_kinds=pk,
            param_order=forward_order(s.layer_names, s.param_layer_names),
            param_numel=None,
            num_classes=meta.num_classes,
            resumed=bool(meta.extra.get("resumed", False)),
            micro_batches=_count(meta.extra.get("micro_batches")),
            **_setup(meta.extra),
        )

    @classmethod
    def from_live(
        cls,
        meta: RunMeta,
        model: Any,
        params: Sequence[Any],
        param_layer_index: Sequence[int],
        *,
        optimizer: Any,
        num_classes: int | None,
        resumed: bool,
        clip_before_unscale: bool,
    ) -> RunContext:
        """The context of a live run, from its model (an ``nn.Module``), its watched parameters
        (``params``, each in the parameter layer ``param_layer_index`` names) and its optimizer."""
        base = cls.from_meta(meta)
        from nnwatch.tensors.layers import strip_wrapper_prefixes  # the names the probe recorded

        modules = {strip_wrapper_prefixes(n, model): m for n, m in model.named_modules()}
        root = type(model).__name__
        kinds = []
        for name in base.param_layer_names:
            mod = modules.get(name) if name in modules else (model if name == root else None)
            kinds.append(type(mod).__name__ if mod is not None else "?")
        numel = np.zeros(base.num_param_layers)
        for p, j in zip(params, param_layer_index, strict=True):
            numel[j] += p.numel()
        sq = _squared_norm(params)
        return cls(
            layer_names=base.layer_names,
            layer_kinds=base.layer_kinds,
            param_layer_names=base.param_layer_names,
            param_layer_kinds=tuple(kinds),
            param_order=base.param_order,
            param_numel=numel,
            num_classes=num_classes or base.num_classes,
            optimizer=type(optimizer).__name__ if optimizer is not None else None,
            resumed=bool(resumed),
            micro_batches=base.micro_batches,
            clip_before_unscale=bool(clip_before_unscale),
            param_norm=math.sqrt(sq) if math.isfinite(sq) else math.nan,
            total_numel=int(numel.sum()),
            optimizer_on_copy=_optimizer_on_copy(optimizer, tuple(params)),
            unwatched_before=_unwatched_before(model, base.layer_names),
            loss_form=base.loss_form,
            loss_broadcast=base.loss_broadcast,
            weight_decay=base.weight_decay,
            half_precision_share=base.half_precision_share,
            loss_outside=base.loss_outside,
            loss_detached=base.loss_detached,
            loss_squashed=base.loss_squashed,
            output_layers=base.output_layers,
        )


def _setup(extra: dict[str, Any]) -> dict[str, Any]:
    """The loss's form and the update set-up from meta.json's extra, checked (a hand edit or an
    older run gives the defaults)."""
    out: dict[str, Any] = {}
    for key in ("loss_form", "loss_broadcast", "loss_squashed"):
        if isinstance(extra.get(key), str):
            out[key] = extra[key][:500]
    for key in ("weight_decay", "half_precision_share"):
        v = extra.get(key)
        if isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) and v >= 0:
            out[key] = float(v)
    v = extra.get("loss_outside")
    if type(v) is int and v >= 0:
        out["loss_outside"] = v
    if extra.get("loss_detached") is True:
        out["loss_detached"] = True
    names = extra.get("output_layers")
    if isinstance(names, list):
        out["output_layers"] = tuple(n for n in names[:1000] if isinstance(n, str))
    return out


def _count(value: Any) -> int:
    """A positive count from meta.json, 1 when absent or malformed (an older run, a hand edit)."""
    return value if type(value) is int and value > 0 else 1


def _norm_estimate(p: Any, torch: Any) -> Any:
    """A parameter's L2 norm, read on this rank alone: a sharded one's (a DTensor's) is its
    local piece's scaled to the whole size, an estimate taken with no collective (a norm of the
    DTensor itself would be one, which a rank without nnwatch never joins)."""
    local = getattr(p, "_local_tensor", None)
    if not isinstance(local, torch.Tensor):
        return torch.linalg.vector_norm(p.detach().float())
    norm = torch.linalg.vector_norm(local.detach().float())
    n = local.numel()
    return norm * math.sqrt(p.numel() / n) if n else norm


def _optimizer_on_copy(opt: Any, params: tuple[Any, ...]) -> bool:
    """The optimizer's parameters are none of ``params`` yet match them in shape and dtype.

    The shape test keeps setups whose optimizer legitimately holds other tensors (fp32 master
    weights, flattened shards) out: those differ in dtype or shape from the model's parameters.
    """
    groups = getattr(opt, "param_groups", None)
    if not groups or not params:
        return False
    try:
        held = [p for g in groups for p in g.get("params", ())]
        own = {id(q) for q in params}
        if not held or any(id(p) in own for p in held):
            return False
        return sorted(map(_shape_key, held)) == sorted(map(_shape_key, params))
    except Exception:  # noqa: BLE001 - an optimizer of an unusual kind: say nothing
        return False


def _shape_key(p: Any) -> tuple[tuple[int, ...], str]:
    return tuple(p.shape), str(p.dtype)


def _squared_norm(params: Sequence[Any]) -> float:
    """The squared norm of all the watched weights (NaN where it cannot be read)."""
    try:
        import torch

        with torch.no_grad():  # one host sync per device, once per run
            by_device: dict[Any, list[Any]] = {}
            for p in params:
                by_device.setdefault(p.device, []).append(_norm_estimate(p, torch))
            return float(sum(float(torch.stack(n).square().sum()) for n in by_device.values()))
    except Exception:  # noqa: BLE001 - a parameter on an odd device: the ratio rule stays off
        return math.nan


def _unwatched_before(model: Any, layer_names: tuple[str, ...]) -> dict[int, tuple[str, ...]]:
    """Leaf modules without hooks that sit (in registration order) just before each watched layer."""
    from nnwatch.tensors.layers import strip_wrapper_prefixes  # the names the probe recorded

    watched = {n: i for i, n in enumerate(layer_names)}
    out: dict[int, tuple[str, ...]] = {}
    pending: list[str] = []
    for raw, mod in model.named_modules():
        name = strip_wrapper_prefixes(raw, model)
        if not name:
            continue
        if name in watched:
            if pending:
                out[watched[name]] = tuple(pending)
            pending = []
        elif not any(True for _ in mod.children()):
            pending.append(f"{name} ({type(mod).__name__})")
    return out


def forward_order(layer_names: tuple[str, ...], param_layers: tuple[str, ...]) -> np.ndarray:
    """Parameter-owning layers sorted from input to output.

    A layer that is also a watched layer takes its forward position; a container that owns
    parameters itself takes the position of its first watched child; any other keeps its place
    relative to its registration-order neighbours.
    """
    pos = {n: i for i, n in enumerate(layer_names)}
    keys: list[float] = []
    prev = -1.0
    for name in param_layers:
        if name in pos:
            k = float(pos[name])
        else:
            child = next((i for i, n in enumerate(layer_names) if n.startswith(name + ".")), None)
            k = float(child) - 0.25 if child is not None else prev + 0.5
        keys.append(k)
        prev = k
    return np.argsort(np.asarray(keys), kind="stable")
