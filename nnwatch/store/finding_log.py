"""The run's findings: one list, and each finding's line in ``events.jsonl``, written once.

Findings come from the detectors (on the run log's writer thread, or from their own process
through the judge link), the cross-rank check and the probe (on the training thread). Each is
kept here and appended straight to the run's event file (the
:class:`~nnwatch.store.event_appender.EventAppender`, not the run log that fed the detectors), so
a finding goes from the detector that made it to the file monitors read without passing back
through the probe or the log. One that comes before the run's files open (a clip seen before the
first ``w.step()``) waits here until they do.
"""

from __future__ import annotations

import logging
import threading
from typing import Protocol

from nnwatch.store.events import Event, FindingEvent
from nnwatch.store.finding import Finding

log = logging.getLogger("nnwatch")

#: Findings held before the run log opens; past this a run whose log never opens stops holding.
EARLY_LIMIT = 1000


class EventWriter(Protocol):
    """Where a finding's line goes (the run's ``EventAppender``)."""

    def event(self, event: Event) -> None: ...


class FindingLog:
    """Owns the run's list of findings and writes each to the run's events, once."""

    def __init__(self) -> None:
        self.items: list[Finding] = []
        self._writer: EventWriter | None = None
        self._early: list[Event] = []
        #: the detectors' thread and the training thread both add. Held only around the list and
        #: the switch to the writer, never around a write: the writer takes its own lock to
        #: write, and a write that fails (a full disk) reports itself through :meth:`keep`, so
        #: no write may wait on this lock while another thread holds it and waits to write.
        self._lock = threading.Lock()

    def add(self, finding: Finding) -> None:
        """Keep ``finding``, say it once in the log, and write it to ``events.jsonl``."""
        event = FindingEvent(finding=finding)
        log.warning("nnwatch: %s", finding.message)
        with self._lock:
            self.items.append(finding)
            writer = self._writer
            if writer is None and len(self._early) < EARLY_LIMIT:
                self._early.append(event)
        if writer is not None:
            writer.event(event)

    def keep(self, finding: Finding) -> None:
        """Keep ``finding`` without a line: it tells why the event file cannot be written."""
        with self._lock:
            self.items.append(finding)

    def write_to(self, writer: EventWriter) -> None:
        """The run log is open: the findings that came before it go there now, the rest as they
        come (one added meanwhile by another thread may land just before them)."""
        with self._lock:
            early, self._early = self._early, []
            self._writer = writer
        for event in early:
            writer.event(event)
