"""The one interface between the monitor and where its data comes from."""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from nnwatch.channel.commands import CommandReply as CommandReply  # part of the source API
from nnwatch.store.events import Event
from nnwatch.store.schema import RunMeta

#: Run states a source can report. "recorded" is a finished run read from disk.
STATES = ("live", "paused", "hung", "finished", "interrupted", "crashed", "lost", "recorded")


class SourceError(RuntimeError):
    """A source cannot deliver (run unreachable, log corrupt); the message is meant for the user."""


@dataclass(frozen=True)
class SourceStatus:
    state: str
    heartbeat_age: float | None = None  # seconds since the trainer last wrote its heartbeat
    dropped: int = 0  # records lost because this reader fell behind the ring
    torn: int = 0  # slots caught mid-write and skipped
    message: str = ""  # plain words for the header, e.g. "trainer pid 123 is gone"
    #: (last step held, the trainer's latest step) while a monitor is still catching up
    catching_up: tuple[float, float] | None = None


@dataclass(frozen=True)
class SourceUpdate:
    """What arrived since the previous poll. Arrays may be empty, never None."""

    scalars: np.ndarray  # rows of meta.schema.scalar_dtype(), in step order
    layers: np.ndarray  # rows of meta.schema.layer_row_dtype() (sampled or non-finite steps)
    #: findings, snapshots, commands... typed (:mod:`nnwatch.store.events`), each delivered once
    #: (:mod:`nnwatch.sources.seen_events`): a consumer takes every one as new
    events: list[Event] = field(default_factory=list)
    status: SourceStatus = SourceStatus("live")
    #: pre-reduced buckets of rows this update stands for (nnwatch.store.overview records, whose
    #: series are ``summary_fields``), before ``scalars``: a remote run's overview, or live
    #: aggregates; ``scalars`` at or before their last step then only fill the raw tail
    summary: np.ndarray | None = None
    summary_fields: tuple[str, ...] = ()


class RunSource(ABC):
    """A run the monitor can follow. ``poll`` never blocks for long; ``command`` may fail cleanly."""

    @property
    @abstractmethod
    def meta(self) -> RunMeta: ...

    @property
    def can_command(self) -> bool:
        """False for recorded runs and fixtures: the UI then greys out keys that steer training."""
        return False

    @abstractmethod
    def poll(self) -> SourceUpdate: ...

    def command(self, name: str, **args: Any) -> CommandReply:
        return CommandReply(False, error="this run is not live; it cannot be steered")

    @property
    def files_host(self) -> str | None:
        """The host whose disk holds this run's snapshots when that is not this machine."""
        return None

    def pulled_snapshot(self, step: int, name: str = "") -> Path | None:
        """Where an earlier ``pull_snapshot`` put this snapshot, if it did."""
        return None

    def pull_snapshot(self, step: int, name: str = "") -> Path:
        """Copy the snapshot of ``step`` (directory ``name`` when known) from ``files_host`` to
        this machine and say where it now lies; SourceError when it cannot."""
        raise SourceError("this run's snapshots are on this machine; there is nothing to pull")

    def reconnect(self) -> None:  # noqa: B027 - optional hook, a no-op by default
        """Try to reach the run again after it was lost. Recorded sources have nothing to do."""

    def close(self) -> None:  # noqa: B027 - optional hook, a no-op by default
        """Release files and sockets. Safe to call twice."""
