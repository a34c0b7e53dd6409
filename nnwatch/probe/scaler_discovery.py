"""Finding the AMP ``GradScaler`` a loop uses when it was not passed to ``watch()``.

A script adds the README's two lines and keeps its ``scaler.scale(loss).backward()``: without the
scaler, every gradient nnwatch measures when backward ends is multiplied by the loss scale
(65536 at the start), and the grad-norm pane shows that. So while a watch without a scaler is
open, ``torch.amp.GradScaler.scale`` (the base of the CUDA, CPU and sharded scalers) is wrapped:
its first call, before the backward it scales, hands the scaler to the waiting watches. The
wrapper returns torch's result unchanged and, once no watch is waiting, costs one list check.
The class is put back when the last waiting watch adopts a scaler or closes (unless somebody
replaced the method meanwhile).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from typing import Any

import torch

from nnwatch.probe.hook_hiding import compiling

log = logging.getLogger("nnwatch")

_lock = threading.Lock()
_waiting: list[Callable[[Any], None]] = []
_original: Callable[..., Any] | None = None
_wrapper: Callable[..., Any] | None = None


def _scaler_class() -> Any:
    amp = getattr(torch, "amp", None)
    return getattr(amp, "GradScaler", None)


def _enabled(scaler: Any) -> bool:
    try:
        return bool(scaler.is_enabled())
    except Exception:  # noqa: BLE001 - a subclass of another make
        return False


def _tell(scaler: Any) -> None:
    with _lock:
        adopters = list(_waiting)
        _waiting.clear()
        _uninstall()
    for adopt in adopters:
        try:
            adopt(scaler)
        except Exception as exc:  # noqa: BLE001 - the user's scale() already happened
            log.warning("nnwatch: could not take up the GradScaler: %r", exc)


def _install() -> None:
    global _original, _wrapper
    cls = _scaler_class()
    if cls is None or _wrapper is not None:
        return
    original = cls.scale

    def scale(self: Any, outputs: Any) -> Any:
        result = original(self, outputs)
        if _waiting and not compiling() and _enabled(self):
            _tell(self)  # a disabled scaler (GradScaler(enabled=False)) scales nothing: not it
        return result

    scale.__wrapped__ = original  # type: ignore[attr-defined]
    scale.__doc__ = original.__doc__
    _original, _wrapper = original, scale
    cls.scale = scale


def _uninstall() -> None:
    global _original, _wrapper
    cls = _scaler_class()
    if cls is not None and _wrapper is not None and cls.__dict__.get("scale") is _wrapper:
        cls.scale = _original  # somebody wrapped it after us: leave both
    _original = _wrapper = None


def wait_for(adopt: Callable[[Any], None]) -> None:
    """Call ``adopt(scaler)`` at the next ``GradScaler.scale()`` call, once."""
    with _lock:
        if adopt not in _waiting:
            _waiting.append(adopt)
        _install()


def stop_waiting(adopt: Callable[[Any], None]) -> None:
    """No longer wait (the watch closed); the last one to leave puts the method back."""
    with _lock:
        if adopt in _waiting:
            _waiting.remove(adopt)
        if not _waiting:
            _uninstall()


def installed() -> bool:
    """Whether ``GradScaler.scale`` is wrapped right now (for tests)."""
    return _wrapper is not None
