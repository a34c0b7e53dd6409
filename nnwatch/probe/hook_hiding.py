"""Keeping nnwatch's hooks out of everything the user saves or copies.

PyTorch keeps a module's forward hooks in its ``__dict__``, so ``torch.save(model)``,
``pickle.dumps(model)`` and ``copy.deepcopy(model)`` carry them along: a closure cannot be
pickled (the save fails), and a deep copy (an EMA model, a copy kept for evaluation) would keep
reporting into the watch that hooked the original. Both go through the module's ``__getstate__``:
``nn.Module``'s, or a class's own (``nn.LSTM`` and user modules may define one). While a watch is
open, each of those methods in the watched model is wrapped to leave out the hooks nnwatch
registered (they are :class:`ProbeHook` objects), so a saved or copied model is exactly what it
would have been without nnwatch. A wrap is removed when the last watch that needs it closes,
unless someone wrapped the method after us.

Under ``torch.compile`` the hooks do nothing while dynamo traces (they would break the graph);
the compiled region then has no per-layer statistics, and the loss and gradient norms are still
recorded, since they are taken outside the forward pass.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Callable
from typing import Any

import torch
from torch import nn

#: ``nn.Module`` attributes that hold hooks (dicts keyed by handle id), and the dicts of flags
#: keyed by the same ids.
_HOOK_DICTS = ("_forward_hooks", "_forward_pre_hooks")
_FLAG_DICTS = ("_forward_hooks_with_kwargs", "_forward_hooks_always_called", "_forward_pre_hooks_with_kwargs")


class ProbeHook:
    """A hook function marked as nnwatch's, so that it can be left out of saved modules."""

    __slots__ = ("fn",)

    def __init__(self, fn: Callable[..., Any]) -> None:
        self.fn = fn

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        if _is_compiling():
            return None
        return self.fn(*args, **kwargs)


#: torch.compile's "am I tracing?", looked up once (a torch without torch.compiler never compiles)
_is_compiling: Callable[[], bool] = getattr(
    getattr(torch, "compiler", None), "is_compiling", None
) or (lambda: False)


def compiling() -> bool:
    """Whether torch.compile is tracing right now: nnwatch's hooks and wrappers then stand aside."""
    return bool(_is_compiling())


_lock = threading.Lock()
#: class -> (its own __getstate__, our wrapper, number of watches that need it)
_wrapped: dict[type, tuple[Callable[[Any], Any], Callable[[Any], Any], int]] = {}


def _without_probe_hooks(state: dict[str, Any]) -> dict[str, Any]:
    ours: set[int] = set()
    for attr in _HOOK_DICTS:
        hooks = state.get(attr)
        if hooks and any(isinstance(h, ProbeHook) for h in hooks.values()):
            kept = OrderedDict()
            for key, h in hooks.items():
                if isinstance(h, ProbeHook):
                    ours.add(key)
                else:
                    kept[key] = h
            state[attr] = kept
    if ours:
        for attr in _FLAG_DICTS:
            flags = state.get(attr)
            if flags is not None and any(k in ours for k in flags):
                state[attr] = type(flags)((k, v) for k, v in flags.items() if k not in ours)
    return state


def _classes_to_wrap(model: nn.Module) -> set[type]:
    """``nn.Module`` and every class in the model that defines ``__getstate__`` itself
    (``nn.LSTM`` does, and so may a user's module): each of them builds the pickled state."""
    found: set[type] = {nn.Module}
    for module in model.modules():
        for cls in type(module).__mro__:
            if isinstance(cls, type) and issubclass(cls, nn.Module) and "__getstate__" in vars(cls):
                found.add(cls)
    return found


def _wrap(original: Callable[[Any], Any]) -> Callable[[Any], Any]:
    def __getstate__(self: nn.Module) -> Any:
        state = original(self)
        if not isinstance(state, dict):
            return state
        if state is self.__dict__:
            state = dict(state)
        return _without_probe_hooks(state)

    __getstate__.__wrapped__ = original  # type: ignore[attr-defined]
    return __getstate__


def hide_hooks(model: nn.Module) -> list[type]:
    """Leave nnwatch's hooks out of pickled and copied modules of ``model`` from now on.

    Returns the classes wrapped for it, to hand back to :func:`release_hooks` at close.
    """
    with _lock:
        classes = sorted(_classes_to_wrap(model), key=lambda c: c.__qualname__)
        for cls in classes:
            entry = _wrapped.get(cls)
            if entry is not None:
                _wrapped[cls] = (entry[0], entry[1], entry[2] + 1)
                continue
            original = vars(cls)["__getstate__"]
            wrapper = _wrap(original)
            _wrapped[cls] = (original, wrapper, 1)
            setattr(cls, "__getstate__", wrapper)  # noqa: B010 - a class attribute mypy cannot see on 3.10
        return classes


def release_hooks(classes: list[type]) -> None:
    """One watch fewer; a class that no watch needs any more gets its own method back."""
    with _lock:
        for cls in classes:
            entry = _wrapped.get(cls)
            if entry is None:
                continue
            original, wrapper, users = entry
            if users > 1:
                _wrapped[cls] = (original, wrapper, users - 1)
                continue
            del _wrapped[cls]
            if vars(cls).get("__getstate__") is wrapper:  # nobody wrapped it after us
                setattr(cls, "__getstate__", original)  # noqa: B010 - a class attribute mypy cannot see on 3.10


def wrapped_classes() -> list[type]:
    """Classes whose ``__getstate__`` is wrapped right now (for tests and diagnostics)."""
    return list(_wrapped)
