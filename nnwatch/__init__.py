"""nnwatch: a live monitor and debugger for PyTorch training runs.

``watch()`` attaches the probe to a model; ``load_run()`` reads a run's history back as arrays.
This module imports no UI library, so importing it inside a training script costs nothing extra.
"""

from __future__ import annotations

from nnwatch._version import __version__
from nnwatch.probe.watch import Watch, watch
from nnwatch.runlog import Run, load_run

__all__ = ["Run", "Watch", "__version__", "load_run", "watch"]
