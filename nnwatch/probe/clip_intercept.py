"""Seeing torch's own gradient clipping: the norm it computed, the threshold it was given.

Nearly every training script clips with ``torch.nn.utils.clip_grad_norm_`` (so do Lightning and
the Hugging Face Trainer, through it). That call computes the global gradient norm *before*
clipping and returns it; after it, the gradients hold only the clipped norm. To record the true
pre-clip norm at no extra cost, the probe wraps the two helpers ``clip_grad_norm_`` is built
from, ``torch.nn.utils.clip_grad._get_total_norm`` and ``_clip_grads_with_norm_``. They are looked
up as module globals every time ``clip_grad_norm_`` runs, so the wrap is seen however the user
imported ``clip_grad_norm_`` (``from torch.nn.utils import clip_grad_norm_`` at the top of a
script included). The public names ``torch.nn.utils.get_total_norm``,
``clip_grads_with_norm_`` and ``clip_grad_value_`` are wrapped too; a reference to one of those
taken before ``watch()`` is not seen (the norm is then measured when backward ends instead).

The wrappers call torch's own functions and return their result unchanged: the value a user gets
is torch's, bit for bit. Listeners (one per live watch) are told afterwards, never raise into the
caller, and are skipped while ``torch.compile`` traces. The wrap is installed while at least one
watch is open and removed, if nobody replaced it meanwhile, when the last one closes.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from typing import Any, Protocol

import torch
import torch.nn.utils as nn_utils
from torch.nn.utils import clip_grad as clip_module

from nnwatch.probe.hook_hiding import compiling

log = logging.getLogger("nnwatch")


class ClipListener(Protocol):
    """What a watch implements to hear about torch's clipping."""

    def on_total_norm(self, grads: list[torch.Tensor], norm_type: float, total: torch.Tensor) -> None:
        """torch computed the global norm of ``grads`` (not yet clipped)."""

    def clip_limit(self, params: list[torch.Tensor], max_norm: float) -> float:
        """The threshold to clip ``params`` with: ``max_norm``, or a monitor's override."""

    def on_clip(self, params: list[torch.Tensor], max_norm: float, total: torch.Tensor) -> None:
        """torch scaled the gradients of ``params`` by ``min(max_norm / (total + 1e-6), 1)``."""

    def on_value_clip(self, params: list[torch.Tensor], clip_value: float) -> None:
        """torch clamped the gradients of ``params`` to ``[-clip_value, clip_value]``."""


_lock = threading.Lock()
_listeners: list[ClipListener] = []
_originals: dict[tuple[Any, str], Callable[..., Any]] = {}
_wrappers: dict[tuple[Any, str], Callable[..., Any]] = {}


def _tell(fn: Callable[[ClipListener], None]) -> None:
    for listener in list(_listeners):
        try:
            fn(listener)
        except Exception as exc:  # noqa: BLE001 - the user's clip already happened: never raise
            log.warning("nnwatch: could not record torch's clip: %r", exc)


def _as_list(tensors: Any) -> list[torch.Tensor]:
    return [tensors] if isinstance(tensors, torch.Tensor) else list(tensors)


def _wrap_total_norm(original: Callable[..., torch.Tensor]) -> Callable[..., torch.Tensor]:
    def get_total_norm(
        tensors: Any, norm_type: float = 2.0, error_if_nonfinite: bool = False,
        foreach: bool | None = None,
    ) -> torch.Tensor:
        if compiling() or not _listeners:
            return original(tensors, norm_type, error_if_nonfinite, foreach)
        grads = _as_list(tensors)
        total = original(grads, norm_type, error_if_nonfinite, foreach)
        _tell(lambda lst: lst.on_total_norm(grads, float(norm_type), total))
        return total

    get_total_norm.__wrapped__ = original  # type: ignore[attr-defined]
    get_total_norm.__doc__ = original.__doc__
    return get_total_norm


def _wrap_clip_with_norm(original: Callable[..., None]) -> Callable[..., None]:
    def clip_grads_with_norm_(
        parameters: Any, max_norm: float, total_norm: torch.Tensor, foreach: bool | None = None
    ) -> None:
        if compiling() or not _listeners:
            return original(parameters, max_norm, total_norm, foreach)
        params = _as_list(parameters)
        limit = float(max_norm)
        for listener in list(_listeners):
            try:
                limit = listener.clip_limit(params, limit)
            except Exception:  # noqa: BLE001
                pass
        original(params, limit, total_norm, foreach)
        _tell(lambda lst: lst.on_clip(params, limit, total_norm))
        return None

    clip_grads_with_norm_.__wrapped__ = original  # type: ignore[attr-defined]
    clip_grads_with_norm_.__doc__ = original.__doc__
    return clip_grads_with_norm_


def _wrap_clip_value(original: Callable[..., None]) -> Callable[..., None]:
    def clip_grad_value_(parameters: Any, clip_value: float, foreach: bool | None = None) -> None:
        if compiling() or not _listeners:
            return original(parameters, clip_value, foreach)
        params = _as_list(parameters)
        original(params, clip_value, foreach)
        _tell(lambda lst: lst.on_value_clip(params, float(clip_value)))
        return None

    clip_grad_value_.__wrapped__ = original  # type: ignore[attr-defined]
    clip_grad_value_.__doc__ = original.__doc__
    return clip_grad_value_


#: (module, attribute, wrapper factory): the private helpers first, which catch every call of
#: ``clip_grad_norm_``; then the public aliases of the same functions.
_TARGETS: tuple[tuple[Any, str, Callable[[Any], Callable[..., Any]]], ...] = (
    (clip_module, "_get_total_norm", _wrap_total_norm),
    (clip_module, "_clip_grads_with_norm_", _wrap_clip_with_norm),
    (clip_module, "clip_grad_value_", _wrap_clip_value),
    (nn_utils, "get_total_norm", _wrap_total_norm),
    (nn_utils, "clip_grads_with_norm_", _wrap_clip_with_norm),
    (nn_utils, "clip_grad_value_", _wrap_clip_value),
)


def _install() -> None:
    for module, attr, factory in _TARGETS:
        original = getattr(module, attr, None)
        if original is None or (module, attr) in _wrappers:
            continue
        wrapper = factory(original)
        _originals[(module, attr)] = original
        _wrappers[(module, attr)] = wrapper
        setattr(module, attr, wrapper)


def _uninstall() -> None:
    for key, wrapper in list(_wrappers.items()):
        module, attr = key
        if getattr(module, attr, None) is wrapper:  # somebody wrapped it after us: leave both
            setattr(module, attr, _originals[key])
        del _wrappers[key]
        del _originals[key]


def listen(listener: ClipListener) -> None:
    """Start telling ``listener`` about torch's clipping (installs the wrappers on first use)."""
    with _lock:
        if listener not in _listeners:
            _listeners.append(listener)
        _install()


def unlisten(listener: ClipListener) -> None:
    """Stop telling ``listener``; the last one to leave puts torch's functions back."""
    with _lock:
        if listener in _listeners:
            _listeners.remove(listener)
        if not _listeners:
            _uninstall()


def installed() -> bool:
    """Whether torch's clip helpers are wrapped right now (for tests and diagnostics)."""
    return bool(_wrappers)
