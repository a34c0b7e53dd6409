"""nnwatch: a live monitor and debugger for PyTorch training runs.

``watch()`` attaches the probe to a model; ``load_run()`` reads a run's history back as arrays.
This module imports no UI library, and torch only when the probe is first used, so that monitor
commands (``nnwatch ls``, ``nnwatch open``) start fast.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from nnwatch._version import __version__
from nnwatch.store.run_reader import Run, load_run
from nnwatch.store.runlog import RunLogError

if TYPE_CHECKING:
    from nnwatch.probe.watch import Watch, watch

__all__ = ["Run", "RunLogError", "Watch", "__version__", "load_run", "watch"]


def __getattr__(name: str) -> Any:
    if name in ("watch", "Watch"):
        from nnwatch.probe import watch as _watch_module

        return getattr(_watch_module, name)
    raise AttributeError(f"module 'nnwatch' has no attribute {name!r}")
