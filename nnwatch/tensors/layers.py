"""Which modules the probe watches, and how parameters map to the layers that own them."""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

_STAT_TYPES: tuple[type[nn.Module], ...] = (
    nn.Linear,
    nn.Bilinear,
    nn.modules.conv._ConvNd,
    nn.modules.batchnorm._NormBase,  # BatchNorm*, InstanceNorm*
    nn.LayerNorm,
    nn.GroupNorm,
    nn.MultiheadAttention,
    nn.Embedding,
    nn.RNNBase,  # RNN, LSTM, GRU: the output sequence (the first of ``(output, hidden)``)
    nn.RNNCellBase,
)
if hasattr(nn, "RMSNorm"):
    _STAT_TYPES = (*_STAT_TYPES, nn.RMSNorm)
_ACTIVATION_TYPES: tuple[type[nn.Module], ...] = tuple(
    cls
    for cls in vars(nn.modules.activation).values()
    if isinstance(cls, type)
    and issubclass(cls, nn.Module)
    and cls.__module__ == nn.modules.activation.__name__
)


def is_stat_layer(module: nn.Module) -> bool:
    """Activation modules (ReLU, GELU, ...) and Linear, Conv, Norm, Embedding, RNN and attention
    outputs, and any other module that owns parameters itself (a hand-written LayerNorm)."""
    if isinstance(module, _STAT_TYPES + _ACTIVATION_TYPES):
        return True
    return any(True for _ in module.parameters(recurse=False))


def sequence_first(model: nn.Module) -> bool:
    """Whether the model's recurrent layers take ``(T, B, ...)`` input (PyTorch's RNN default).

    Then the batch dimension of its input is the second one, which samples/s must count.
    """
    rnns = [m for m in model.modules() if isinstance(m, nn.RNNBase)]
    return bool(rnns) and not any(getattr(m, "batch_first", False) for m in rnns)


@dataclass(frozen=True)
class LayerPlan:
    """The modules to hook (registration order) and the parameter-to-layer map for grad norms."""

    stat_names: tuple[str, ...]
    stat_kinds: tuple[str, ...]
    stat_modules: tuple[nn.Module, ...]
    param_layer_names: tuple[str, ...]
    params: tuple[torch.nn.Parameter, ...]  # trainable parameters, in model.parameters() order
    param_layer_index: tuple[int, ...]  # for each of ``params``, its index in param_layer_names
    #: layers that share parameters with an earlier layer (tied weights: a language model's output
    #: head sharing the embedding), by name -> the layer whose row holds the shared gradient; a
    #: tied layer has a row of its own only for what it owns alone (its bias, say)
    tied: dict[str, str]


#: Wrapper classes and the attribute under which each holds the module it wraps.
_WRAPS = {
    "DistributedDataParallel": "module",
    "DataParallel": "module",
    "OptimizedModule": "_orig_mod",  # torch.compile
    "FullyShardedDataParallel": "_fsdp_wrapped_module",  # FSDP1
    "CheckpointWrapper": "_checkpoint_wrapped_module",
    "OffloadWrapper": "_checkpoint_wrapped_module",
}
_WRAPPER_SEGMENTS = frozenset(_WRAPS.values()) - {"module"}


def strip_wrapper_prefixes(name: str, root: nn.Module | None = None) -> str:
    """The layer's name as the model itself knows it (its ``state_dict`` keys without wrappers).

    Each path segment that only leads from a wrapper (DDP, DataParallel, torch.compile, FSDP,
    activation checkpointing) to the module it wraps is dropped, at any depth and in any nesting
    (``torch.compile(DDP(m))`` included): ``module.encoder.0`` under DDP becomes ``encoder.0``.
    Without ``root``, the unambiguous segments go and a leading ``module.`` stays (it may be a
    layer of the model's own).
    """
    parts = name.split(".") if name else []
    if root is None:
        return ".".join(p for p in parts if p not in _WRAPPER_SEGMENTS)
    out: list[str] = []
    mod: nn.Module | None = root
    for p in parts:
        if mod is None or _WRAPS.get(type(mod).__name__) != p:
            out.append(p)
        mod = mod._modules.get(p) if mod is not None else None
    return ".".join(out)


def plan_layers(model: nn.Module) -> LayerPlan:
    root_name = type(model).__name__
    stat_names: list[str] = []
    stat_kinds: list[str] = []
    stat_modules: list[nn.Module] = []
    param_layers: list[str] = []
    owner: dict[int, int] = {}
    tied: dict[str, str] = {}
    seen: set[int] = set()
    for name, module in model.named_modules():
        if id(module) in seen:
            continue
        seen.add(id(module))
        label = strip_wrapper_prefixes(name, model) or root_name
        if is_stat_layer(module):
            stat_names.append(label)
            stat_kinds.append(type(module).__name__)
            stat_modules.append(module)
        own = [p for p in module.parameters(recurse=False) if p.requires_grad]
        shared = [p for p in own if id(p) in owner]
        if shared:
            tied[label] = param_layers[owner[id(shared[0])]]
        fresh = [p for p in own if id(p) not in owner]
        if fresh:  # a row for what the module owns alone (a tied head's own bias)
            idx = len(param_layers)
            param_layers.append(label)
            for p in fresh:
                owner[id(p)] = idx
    params = tuple(p for p in model.parameters() if p.requires_grad)
    return LayerPlan(
        stat_names=tuple(stat_names),
        stat_kinds=tuple(stat_kinds),
        stat_modules=tuple(stat_modules),
        param_layer_names=tuple(param_layers),
        params=params,
        param_layer_index=tuple(owner[id(p)] for p in params),
        tied=tied,
    )


def first_tensor(output: object) -> torch.Tensor | None:
    """The tensor a module 'produced': itself, the first of a tuple/list, or the first dict value.

    Attention returns ``(output, weights)``; Hugging Face models return dict-like outputs; some
    modules return None. Only floating tensors carry activation statistics.
    """
    for _ in range(4):  # nested containers, a few levels deep at most
        if isinstance(output, torch.Tensor):
            return output if output.is_floating_point() else None
        if isinstance(output, (tuple, list)):
            output = output[0] if output else None
        elif isinstance(output, dict):
            output = next((v for v in output.values() if isinstance(v, torch.Tensor)), None)
        else:
            return None
    return None
