"""What the dashboard's controllers (``steering.py``, ``navigation.py``, ``overlay.py``,
``rank_switch.py``) may ask of the app that composes them. Each controller declares the narrow
Protocol it needs beside itself, built from these parts; ``NNWatchApp`` satisfies them all, and a
test can hand a controller something smaller."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol

from textual.notifications import SeverityLevel
from textual.screen import Screen


class Notifier(Protocol):
    """Tells the user something in a toast."""

    def notify(
        self,
        message: str,
        *,
        title: str = "",
        severity: SeverityLevel = "information",
        timeout: float | None = None,
        markup: bool = True,
    ) -> None: ...


class ScreenPusher(Protocol):
    """Opens a screen (a dialog, the inspector, a list) over the dashboard."""

    def push_screen(
        self, screen: Screen[Any], callback: Callable[[Any], None] | None = None
    ) -> Any: ...
