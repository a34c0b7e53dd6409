"""What ``watch()`` can be told, declared once: :class:`WatchOptions`.

``watch(model, optimizer, scaler, **options)`` builds one of these (its keywords are typed by
:class:`WatchOptionsDict`, the same fields for editors and mypy); the builder
(:mod:`nnwatch.probe._builder`) reads it and hands each part only the options it uses. It is
frozen: an option is fixed when the watch starts (what a monitor changes live, such as the clip
threshold or the layer interval, is state of the part it steers, not an option).

This module imports neither torch nor anything else of nnwatch.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any, TypedDict


@dataclass(frozen=True)
class WatchOptions:
    """The options of :func:`nnwatch.watch` (see its docstring for what each one does)."""

    num_classes: int | None = None
    """Classes of a classifier's output: the first loss is then expected near ln K."""
    name: str | None = None
    """The run's name (default: the model's class name)."""
    run_dir: str | os.PathLike[str] | None = None
    """The run's directory (default: a fresh one under the private root)."""
    layer_interval: int | None = None
    """Full per-layer activation statistics every this many steps (default 10, stretched by the budget)."""
    stat_cap: int = 65536
    """Elements of each activation used for its statistics."""
    guard: bool | None = None
    """One non-finite check before ``optimizer.step()`` (default: on on the CPU, where it is free)."""
    skip_nonfinite: bool = False
    """Skip an update whose gradients are not finite."""
    channel: bool = True
    """Live monitoring: the ring file and the command socket."""
    detectors: bool = True
    """The detectors, fed from the run log's thread."""
    tensorboard: Any = None
    """A directory (or :class:`nnwatch.export.TensorBoard`) for a live TensorBoard export."""
    consistency_every: int | None = None
    """Under torch.distributed: compare a parameter checksum across ranks every N steps (0 = off)."""
    job_summary_every: int | None = None
    """Under torch.distributed: send each rank's summary row to rank 0 every N steps."""
    budget: float | None = 0.01
    """The share of the step time nnwatch may spend on its own work (None: measure every step)."""
    max_interval: int = 32
    """The budget never leaves more than this many steps between measured ones."""
    batch_size: int | None = None
    """Samples per step, when the batch's layout is unusual."""
    start_step: int | None = None
    """The first recorded step's number (default 0, or a resumed optimizer's step count)."""
    resume: bool = False
    """Go on in the run of the earlier, still open watch of the same model (or name)."""

    def continuing(self, name: str, step: int, run_dir: os.PathLike[str]) -> WatchOptions:
        """These options for a watch that goes on in an earlier run (``resume=True``)."""
        from dataclasses import replace

        return replace(
            self,
            name=self.name or name,
            start_step=step if self.start_step is None else self.start_step,
            run_dir=run_dir,
        )


class WatchOptionsDict(TypedDict, total=False):
    """The keywords of ``watch(**options)``: :class:`WatchOptions`' fields with their types, so
    that editors complete them and mypy checks a caller's spelling and values
    (``tests/unit/test_watch_typing.py`` keeps the two declarations the same)."""

    num_classes: int | None
    name: str | None
    run_dir: str | os.PathLike[str] | None
    layer_interval: int | None
    stat_cap: int
    guard: bool | None
    skip_nonfinite: bool
    channel: bool
    detectors: bool
    tensorboard: Any
    consistency_every: int | None
    job_summary_every: int | None
    budget: float | None
    max_interval: int
    batch_size: int | None
    start_step: int | None
    resume: bool
