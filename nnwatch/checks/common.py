"""What every pre-flight check shares: batch handling, safe copies, seeding and the result base.

The checks promise two things a user relies on: they never touch the user's model or optimizer
(everything runs on a deep copy), and the same seed gives the same numbers. Both promises are kept
here, in one place, so no check can forget them.
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import math
from collections.abc import Callable, Iterator, Mapping
from typing import Any, ClassVar, cast

import torch
from torch import Tensor, nn

LossFn = Callable[..., Tensor]

_INPUT_KEYS = ("x", "input", "inputs", "image", "images", "data", "features")
_TARGET_KEYS = ("y", "target", "targets", "label", "labels")


class CheckError(ValueError):
    """Raised when a check cannot run on what it was given; the message says what to fix."""


# ----------------------------------------------------------------------------------------------
# results


def _json_safe(value: Any) -> Any:
    if isinstance(value, float):
        if math.isnan(value):
            return None
        if math.isinf(value):
            return "inf" if value > 0 else "-inf"
        return value
    if isinstance(value, Mapping):
        return {str(k): _json_safe(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_json_safe(v) for v in value]
    if isinstance(value, Tensor):
        return _json_safe(value.tolist())
    return value


class CheckResult:
    """Mixin for the frozen result dataclasses: a name, a one-line summary and ``to_dict``.

    Every result carries ``passed``, ``verdict`` (the word(s) shown at the end of the report line),
    ``causes`` (likely reasons, most specific first; empty when it passed), ``warnings`` (worth a
    look even when it passed) and ``skipped`` (the check does not apply, e.g. ln(K) for regression).
    """

    check_name: ClassVar[str] = "check"
    passed: bool
    verdict: str
    causes: list[str]
    warnings: list[str]
    skipped: bool

    def summary(self) -> str:  # pragma: no cover - every result overrides it
        return ""

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"check": self.check_name, "summary": self.summary()}
        for f in dataclasses.fields(self):  # type: ignore[arg-type]
            out[f.name] = _json_safe(getattr(self, f.name))
        return out


def with_generic_causes(evidence: list[str], generic: tuple[tuple[str, str], ...]) -> list[str]:
    """Specific evidence first; the usual suspects it does not already cover come after.

    With no evidence, every usual suspect is listed in full. With evidence, the rest are folded
    into one "also check" line, so the report leads with what was actually observed.
    """
    rest = [(key, text) for key, text in generic if not any(key in e for e in evidence)]
    if not evidence:
        return [text for _, text in rest]
    if not rest:
        return list(evidence)
    return [*evidence, "also check: " + "; ".join(text.split(" (")[0] for _, text in rest)]


# ----------------------------------------------------------------------------------------------
# batches


def split_batch(batch: Any) -> tuple[Any, Tensor | None]:
    """``(inputs, targets)`` from a tuple/list ``(x, y, ...)``, a dict, or a bare input tensor."""
    if isinstance(batch, Tensor):
        return batch, None
    if isinstance(batch, Mapping):
        x = next((batch[k] for k in _INPUT_KEYS if k in batch), None)
        y = next((batch[k] for k in _TARGET_KEYS if k in batch), None)
        if x is None:
            raise CheckError(
                f"the batch is a dict with keys {sorted(batch)}; name the inputs one of "
                f"{', '.join(_INPUT_KEYS)} and the targets one of {', '.join(_TARGET_KEYS)}"
            )
        return x, y
    if isinstance(batch, (tuple, list)) and len(batch) >= 2:
        return batch[0], batch[1]
    if isinstance(batch, (tuple, list)) and len(batch) == 1:
        return batch[0], None
    raise CheckError(
        f"cannot read a batch of type {type(batch).__name__}: pass (inputs, targets), "
        "a dict with inputs/targets keys, or an input tensor"
    )


def map_tensors(obj: Any, fn: Callable[[Tensor], Tensor]) -> Any:
    if isinstance(obj, Tensor):
        return fn(obj)
    if isinstance(obj, Mapping):
        return {k: map_tensors(v, fn) for k, v in obj.items()}
    if isinstance(obj, (tuple, list)):
        return type(obj)(map_tensors(v, fn) for v in obj)
    return obj


def first_tensor(obj: Any) -> Tensor | None:
    if isinstance(obj, Tensor):
        return obj
    values = (
        obj.values() if isinstance(obj, Mapping) else obj if isinstance(obj, (tuple, list)) else ()
    )
    for v in values:
        t = first_tensor(v)
        if t is not None:
            return t
    return None


def batch_size(inputs: Any) -> int:
    t = first_tensor(inputs)
    if t is None or t.dim() == 0:
        raise CheckError("the batch holds no tensor with a batch dimension")
    return int(t.shape[0])


def take(obj: Any, n: int) -> Any:
    """The first ``n`` samples of every tensor in ``obj`` (dim 0)."""
    return map_tensors(obj, lambda t: t[:n] if t.dim() > 0 else t)


def model_device(model: nn.Module) -> torch.device:
    for p in model.parameters():
        return p.device
    for b in model.buffers():
        return b.device
    return torch.device("cpu")


def to_device(obj: Any, device: torch.device) -> Any:
    return map_tensors(obj, lambda t: t.to(device))


def call_model(model: nn.Module, inputs: Any) -> Tensor:
    """``model(x)``; a tuple of inputs is splatted and a dict is passed as keywords."""
    if isinstance(inputs, Mapping):
        return cast("torch.Tensor", model(**inputs))
    if isinstance(inputs, tuple):
        return cast("torch.Tensor", model(*inputs))
    return cast("torch.Tensor", model(inputs))


def compute_loss(loss_fn: LossFn, output: Tensor, targets: Tensor | None) -> Tensor:
    loss = loss_fn(output) if targets is None else loss_fn(output, targets)
    if not isinstance(loss, Tensor):
        raise CheckError(f"loss_fn returned {type(loss).__name__}, expected a tensor")
    if loss.numel() != 1:
        raise CheckError(
            f"loss_fn returned a tensor of shape {tuple(loss.shape)}; it must return one number "
            "(use reduction='mean')"
        )
    return loss.reshape(())


def is_classification(output: Tensor, targets: Tensor | None) -> bool:
    """Integer targets with one fewer dim than the output (logits over dim 1): classification."""
    return (
        targets is not None
        and isinstance(targets, Tensor)
        and not targets.is_floating_point()
        and not targets.is_complex()
        and targets.dtype != torch.bool
        and output.dim() == targets.dim() + 1
        and output.shape[0] == targets.shape[0]
    )


def looks_like_probabilities(output: Tensor) -> bool:
    """Rows over dim 1 in [0, 1] that sum to 1: a softmax already ran (CE would apply another)."""
    if output.dim() < 2 or output.shape[1] < 2 or not output.is_floating_point():
        return False
    out = output.detach().float()
    if float(out.min()) < 0.0 or float(out.max()) > 1.0:
        return False
    return bool(torch.allclose(out.sum(dim=1), torch.ones((), dtype=out.dtype), atol=1e-3))


def accuracy(output: Tensor, targets: Tensor) -> float:
    return float((output.detach().argmax(dim=1) == targets).float().mean())


def conflicting_labels(inputs: Any, targets: Tensor) -> int:
    """How many samples share their exact input with a sample that has a different label."""
    if not isinstance(inputs, Tensor) or inputs.shape[0] != targets.shape[0]:
        return 0
    rows = inputs.detach().reshape(inputs.shape[0], -1).float().cpu()
    _, inverse = torch.unique(rows, dim=0, return_inverse=True)
    labels = targets.detach().reshape(targets.shape[0], -1).cpu()
    bad = 0
    for g in inverse.unique():
        members = (inverse == g).nonzero().flatten()
        if len(members) > 1 and not bool((labels[members] == labels[members[0]]).all()):
            bad += len(members)
    return bad


# ----------------------------------------------------------------------------------------------
# models


_MODULE_HOOK_DICTS = (
    "_forward_pre_hooks",
    "_forward_hooks",
    "_backward_pre_hooks",
    "_backward_hooks",
)


def _owned_by_nnwatch(fn: Any) -> bool:
    target = getattr(fn, "func", fn)  # unwrap functools.partial
    module = getattr(target, "__module__", None) or ""
    return module == "nnwatch" or module.startswith("nnwatch.")


@contextlib.contextmanager
def _without_nnwatch_hooks(model: nn.Module) -> Iterator[None]:
    """Lift the live probe's hooks off ``model`` while it is copied, then put them back in order.

    A model under ``nnwatch.watch()`` carries hooks bound to the probe (locks, sockets, buffers):
    deep-copying them fails, and a copy that kept them would report the checks' forward passes to
    the live monitor as if they were training steps. User hooks (weight norm...) are kept.
    Call the checks from the training thread, between steps.
    """
    saved: list[tuple[dict[Any, Any], list[tuple[Any, Any]]]] = []
    try:
        for m in model.modules():
            for attr in _MODULE_HOOK_DICTS:
                hooks = getattr(m, attr, None)
                if isinstance(hooks, dict) and any(_owned_by_nnwatch(f) for f in hooks.values()):
                    saved.append((hooks, list(hooks.items())))
                    for key in [k for k, f in hooks.items() if _owned_by_nnwatch(f)]:
                        del hooks[key]
        yield
    finally:
        for hooks, items in saved:
            hooks.clear()
            hooks.update(items)


_DROPOUT = (nn.Dropout, nn.Dropout1d, nn.Dropout2d, nn.Dropout3d, nn.AlphaDropout)


def prepared_copy(model: nn.Module) -> nn.Module:
    """A deep copy in train mode with dropout off (the checks test learning, not regularization).

    BatchNorm stays in train mode: it behaves as in the user's training loop, and its running
    statistics only change on the copy.
    """
    if not isinstance(model, nn.Module):
        raise CheckError(f"model must be a torch.nn.Module, got {type(model).__name__}")
    with _without_nnwatch_hooks(model):
        clone = copy.deepcopy(model)
    clone.train()
    for m in clone.modules():
        if isinstance(m, _DROPOUT):
            m.eval()
    return clone


def trainable_named_params(model: nn.Module) -> list[tuple[str, nn.Parameter]]:
    return [(n, p) for n, p in model.named_parameters() if p.requires_grad]


def layer_of(param_name: str) -> str:
    """``"encoder.0.weight"`` -> ``"encoder.0"``: per-layer views group a module's parameters."""
    return param_name.rsplit(".", 1)[0] if "." in param_name else param_name


def count_params(model: nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())


def format_count(n: int) -> str:
    if n >= 1e9:
        return f"{n / 1e9:.2f}B"
    if n >= 1e5:  # 190_000 -> "0.19M", as in the report header
        return f"{n / 1e6:.2f}M"
    if n >= 1e3:
        return f"{n / 1e3:.1f}K"
    return str(n)


def group_lr(group: dict[str, Any]) -> float:
    lr = group.get("lr", float("nan"))
    return float(lr) if not isinstance(lr, Tensor) else float(lr.detach())


def copy_user_optimizer(
    user_opt: torch.optim.Optimizer, model: nn.Module, clone: nn.Module
) -> tuple[torch.optim.Optimizer, list[str]]:
    """Same class, hyper-parameters and parameter membership, pointed at the clone's parameters."""
    name_of = {id(p): n for n, p in model.named_parameters()}
    clone_params = dict(clone.named_parameters())
    groups: list[dict[str, Any]] = []
    foreign = 0
    for g in user_opt.param_groups:
        params = []
        for p in g["params"]:
            n = name_of.get(id(p))
            if n is None:
                foreign += 1
            else:
                params.append(clone_params[n])
        if params:
            groups.append({**{k: v for k, v in g.items() if k != "params"}, "params": params})
    warnings = []
    if foreign:
        warnings.append(
            f"the optimizer holds {foreign} tensor(s) that are not parameters of the model"
        )
    if not groups:
        raise CheckError("the optimizer holds none of the model's parameters")
    cls = type(user_opt)
    try:
        opt = cls(groups)  # type: ignore[call-arg]
    except TypeError:
        opt = cls(groups, lr=groups[0].get("lr", 1e-3))  # type: ignore[call-arg]
    return opt, warnings


@contextlib.contextmanager
def seeded(seed: int) -> Iterator[None]:
    """Run a block with a fixed torch seed and give the caller's RNG state back afterwards."""
    devices: list[int] = []
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        devices = [torch.cuda.current_device()]
    with torch.random.fork_rng(devices=devices):
        torch.manual_seed(seed)
        yield


def loss_value(loss: Tensor) -> float:
    return float(loss.detach())
