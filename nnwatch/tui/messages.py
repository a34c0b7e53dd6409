"""What the collector threads tell the UI, as messages named after what happened.

Collectors run in threads and hand over facts with ``post_message`` (thread-safe); the UI thread
reacts. Textual updates a message's private bookkeeping while it is dispatched, so a dataclass
``frozen=True`` cannot be used; ``Fact`` gives the same guarantee for the public fields instead:
they are set once, in the constructor, and assigning one afterwards raises.
"""

from __future__ import annotations

from dataclasses import FrozenInstanceError, dataclass
from typing import Any

from textual.message import Message

from nnwatch.sources.base import CommandReply
from nnwatch.sources.hardware import HardwareReading


class Fact(Message):
    """A message whose dataclass fields cannot change once posted."""

    def __post_init__(self) -> None:
        super().__post_init__()
        object.__setattr__(self, "_sealed", True)

    def __setattr__(self, name: str, value: Any) -> None:
        if name in getattr(self, "__dataclass_fields__", {}) and getattr(self, "_sealed", False):
            raise FrozenInstanceError(f"cannot assign to field {name!r}")
        super().__setattr__(name, value)


@dataclass
class RecordsArrived(Fact):
    """A poll brought new data; ``panes`` names the panes whose picture changed."""

    rows: int
    last_step: int
    panes: frozenset[str]
    more_waiting: bool = False  # the source has more queued (a recorded run still loading)


@dataclass
class RunStateChanged(Fact):
    """The run's state (live, paused, hung, finished, crashed, lost) is not what it was."""

    state: str
    previous: str
    message: str


@dataclass
class RunLost(Fact):
    """Polling the source failed; the history stays on screen and ``r`` tries again."""

    message: str


@dataclass
class ReaderFailed(Fact):
    """A monitor-side thread (the run reader, the hardware sampler, the ranks reader) hit an
    unexpected error. The app shows it on screen: a monitor that silently stops reading would
    sit on its last picture (or on CONNECTING) for ever."""

    what: str  # "reader", "hardware reader", "ranks reader"
    message: str  # "IndexError: index 0 is out of bounds ..."


@dataclass
class ReaderRecovered(Fact):
    """The thread that failed (``what``) has done a clean round again."""

    what: str


@dataclass
class HardwareSampled(Fact):
    reading: HardwareReading


@dataclass
class CommandFinished(Fact):
    """The trainer answered (or could not be reached for) a command the user gave."""

    name: str
    args: tuple[tuple[str, Any], ...]
    reply: CommandReply


@dataclass
class SnapshotWritten(Fact):
    """The run logged a snapshot (asked for with ``s``, or taken by a detector)."""

    step: int
    path: str
    reason: str


@dataclass
class Reconnected(Fact):
    ok: bool
    message: str


@dataclass
class RanksUpdated(Fact):
    """A fresh per-rank summary of the distributed job this run belongs to (``JobMonitor.poll``)."""

    view: Any  # nnwatch.sources.job_monitor.JobView


@dataclass
class OverlayUpdated(Fact):
    """The collector of the overlaid run (``o``) reported ``message`` (records, a state change,
    a failure). Wrapped so that it is never taken for news of the main run."""

    message: Any  # the collector's own message (RecordsArrived, RunStateChanged, ...)
    overlay: Any  # the Overlay it is about: a message about one already dropped is ignored
