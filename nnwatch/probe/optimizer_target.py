"""Which object the probe hooks when the user hands ``watch()`` an optimizer.

Real code passes more than a plain ``torch.optim.Optimizer``: a wrapper that is not one
(Lookahead, a sharded or offloading optimizer, a framework's own class) holding the torch
optimizer as an attribute, or a subclass that never ran ``Optimizer.__init__`` (so its
``step`` carries no hooks), or an optimizer-like object of its own. The update boundary is the
torch optimizer's step pre-hook when there is one to find; otherwise it is ``w.step()``, as for a
hand-written update, and the LRs are still read from ``param_groups`` when the object has them.
Never a reason for ``watch()`` to fail.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

_SEARCH_DEPTH = 3  # wrappers of wrappers: Accelerate around ZeRO around torch, at most


def hookable(obj: Any) -> bool:
    """A torch optimizer whose ``step()`` runs its step pre-hooks: ``Optimizer.__init__`` ran
    (it patches the class's ``step`` and makes the hook dict)."""
    return (
        isinstance(obj, torch.optim.Optimizer)
        and "_optimizer_step_pre_hooks" in vars(obj)
        and bool(getattr(type(obj).step, "hooked", False))
    )


def _wrapped(obj: Any, depth: int) -> torch.optim.Optimizer | None:
    """The first hookable optimizer among the attributes of ``obj``, breadth first."""
    level = [obj]
    seen = {id(obj)}
    for _ in range(depth):
        nxt = []
        for holder in level:
            try:
                values = list(vars(holder).values())
            except TypeError:  # no __dict__ (slots, builtins)
                continue
            for value in values:
                if id(value) in seen or isinstance(value, (str, bytes, int, float, torch.Tensor)):
                    continue
                seen.add(id(value))
                if hookable(value):
                    return value  # type: ignore[no-any-return]
                nxt.append(value)
        level = nxt
    return None


def _has_param_groups(obj: Any) -> bool:
    try:
        groups = obj.param_groups
    except Exception:  # noqa: BLE001 - a property that fails is as good as none
        return False
    return isinstance(groups, list) and all(isinstance(g, dict) for g in groups)


@dataclass(frozen=True)
class OptimizerTarget:
    """What the probe does with the optimizer it was given."""

    #: the torch optimizer whose step pre-hook marks the update; None: ``w.step()`` marks it
    hook: torch.optim.Optimizer | None
    #: where the LRs, state (snapshots) and step count are read; None: nowhere
    source: Any
    #: a sentence for the user when the object was not used as given, else None
    note: str | None = None


def resolve(optimizer: Any) -> OptimizerTarget:
    """Find the torch optimizer to hook in what the user passed (see the module docstring)."""
    if optimizer is None:
        return OptimizerTarget(None, None)
    if hookable(optimizer):
        return OptimizerTarget(optimizer, optimizer)
    kind = type(optimizer).__name__
    inner = _wrapped(optimizer, _SEARCH_DEPTH)
    if inner is not None:
        source = optimizer if _has_param_groups(optimizer) else inner
        return OptimizerTarget(
            inner, source,
            f"the optimizer passed ({kind}) wraps {type(inner).__name__}: gradients are read "
            f"right before the {type(inner).__name__}'s step()",
        )
    source = optimizer if _has_param_groups(optimizer) else None
    return OptimizerTarget(
        None, source,
        f"the optimizer passed ({kind}) is not a torch.optim.Optimizer nor wraps one: w.step() "
        "marks the update, as for a hand-written one (call it after the update); "
        + ("the LRs are read from its param_groups" if source is not None else "no LR is recorded"),
    )
