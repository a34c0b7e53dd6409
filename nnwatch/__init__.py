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


#: What ``watch()`` says where torch is missing: the monitor side runs without it (a laptop that
#: only watches), the training side needs the torch the training script itself uses.
NO_TORCH = (
    "nnwatch.watch() needs PyTorch, and this Python ({python}) has none. Install the torch your "
    "training script uses in this environment (`pip install torch`, or the build for your CUDA "
    "from https://pytorch.org/get-started). The monitor commands (nnwatch ls, attach, open, pull, "
    "show) run without torch."
)


def __getattr__(name: str) -> Any:
    if name in ("watch", "Watch"):
        try:
            import torch  # noqa: F401 - checked here, so that the message names what to install
        except ModuleNotFoundError as exc:
            if exc.name != "torch":
                raise
            import sys

            raise ModuleNotFoundError(NO_TORCH.format(python=sys.executable), name="torch") from None
        from nnwatch.probe import watch as _watch_module

        return getattr(_watch_module, name)
    raise AttributeError(f"module 'nnwatch' has no attribute {name!r}")
