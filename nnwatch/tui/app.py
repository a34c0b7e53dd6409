"""``NNWatchApp``: the dashboard for one run, whatever its source (live, recorded, fixture).

The source is passed in, so a demo, a test or another program can embed the monitor:
``NNWatchApp(source, fps=3).run()`` returns 0 when the user presses ``q``; ``compare=other``
overlays a second run on the charts from the start. The class only puts the parts together:

- ``monitor.py``: sources and their threads (``feeds.py``), redraws at ``fps``, what the threads
  report;
- ``steering.py``: the keys that steer training (they ask first, and say what happened);
- ``navigation.py``: zoom, log scale, the step cursor, the layer filter, events, the inspector;
- ``rank_switch.py``: ``[``/``]`` for the ranks of a distributed job;
- ``overlay.py``: ``o``/``x``/``O``, another run side by side on the charts;
- ``bindings.py`` and ``keymap.py``: the keys, each with an id a user can remap (see ``?``).
"""

from __future__ import annotations

from typing import ClassVar

from textual.binding import Binding

from nnwatch.tui.bindings import BINDINGS, NOT_LIVE, OVERLAY_ACTIONS, RANK_ACTIONS, STEERING
from nnwatch.tui.feeds import HardwareOption
from nnwatch.tui.keymap import KEYS_ENV, KEYS_FILE, load_keymap, parse_keymap
from nnwatch.tui.monitor import DEFAULT_FPS
from nnwatch.tui.navigation import ViewActions
from nnwatch.tui.overlay import OverlayActions
from nnwatch.tui.rank_switch import RankActions
from nnwatch.tui.steering import SteeringActions

__all__ = [
    "DEFAULT_FPS",
    "KEYS_ENV",
    "KEYS_FILE",
    "NOT_LIVE",
    "OVERLAY_ACTIONS",
    "RANK_ACTIONS",
    "STEERING",
    "HardwareOption",
    "NNWatchApp",
    "load_keymap",
    "parse_keymap",
]


class NNWatchApp(SteeringActions, ViewActions, RankActions, OverlayActions):
    """The live dashboard. ``run()`` returns 0 on ``q``."""

    CSS_PATH = "app.tcss"
    TITLE = "nnwatch"
    BINDINGS: ClassVar[list[Binding]] = BINDINGS  # type: ignore[assignment]  # only Bindings here
