"""Keeping nnwatch's hooks out of everything the user saves or copies.

PyTorch keeps a module's forward hooks in its ``__dict__``, so ``torch.save(model)``,
``pickle.dumps(model)`` and ``copy.deepcopy(model)`` carry them along: a closure cannot be
pickled (the save fails), and a deep copy (an EMA model, a copy kept for evaluation) would keep
reporting into the watch that hooked the original. Both go through ``nn.Module.__getstate__``.
While a watch is open, that method is wrapped to leave out the hooks nnwatch registered (they are
:class:`ProbeHook` objects), so a saved or copied model is exactly what it would have been without
nnwatch. The wrap is removed when the last watch closes, unless someone wrapped it after us.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Callable
from typing import Any

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
        return self.fn(*args, **kwargs)


_lock = threading.Lock()
_users = 0
_original: Callable[[nn.Module], dict[str, Any]] | None = None
_wrapper: Callable[[nn.Module], dict[str, Any]] | None = None


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


def hide_hooks() -> None:
    """Leave nnwatch's hooks out of pickled and copied modules from now on (counted per watch)."""
    global _users, _original, _wrapper
    with _lock:
        _users += 1
        if _wrapper is not None:
            return
        original = nn.Module.__getstate__

        def __getstate__(self: nn.Module) -> dict[str, Any]:
            state = original(self)
            if state is self.__dict__:
                state = dict(state)
            return _without_probe_hooks(state)

        __getstate__.__wrapped__ = original  # type: ignore[attr-defined]
        _original, _wrapper = original, __getstate__
        nn.Module.__getstate__ = __getstate__  # type: ignore[method-assign]


def release_hooks() -> None:
    """One watch fewer; the last one puts ``nn.Module.__getstate__`` back."""
    global _users, _original, _wrapper
    with _lock:
        _users = max(0, _users - 1)
        if _users or _wrapper is None:
            return
        if nn.Module.__dict__.get("__getstate__") is _wrapper:
            nn.Module.__getstate__ = _original  # type: ignore[method-assign,assignment]
        _original = _wrapper = None
