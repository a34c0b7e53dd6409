"""The terminal dashboard (Textual). Only the monitor imports this; the training side never does.

``NNWatchApp(source)`` is the entry point; ``source`` is any ``nnwatch.sources.RunSource``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from nnwatch.tui.app import NNWatchApp

__all__ = ["NNWatchApp"]


def __getattr__(name: str) -> Any:
    if name == "NNWatchApp":
        from nnwatch.tui.app import NNWatchApp  # lazy: pulls textual

        return NNWatchApp
    raise AttributeError(name)
