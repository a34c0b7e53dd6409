"""The one de-duplication of a run's events: a source drops a line it has already delivered.

Only a source knows when a line can come twice: a resumed stream (:class:`ConnectedSource`, and
the :class:`SummarisedSource` built on it) may send lines it sent before, when the far end
starts ``events.jsonl`` over (an older helper that ignores ``events_offset``, or a file that
shrank). The sources that read a file themselves never repeat a line (``events.jsonl`` is
appended to only, and :class:`~nnwatch.store.event_tail.EventTail` reads each byte once), so a
consumer of :class:`~nnwatch.sources.base.SourceUpdate` (the TUI's model, the job monitor) takes
every event it is handed as new.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from typing import Any

from nnwatch.store.events import Event

#: Events remembered (far more than a run emits; bounds a pathological one): the oldest is
#: forgotten first, so a line repeated after this many newer ones would be delivered again.
MAX_SEEN = 100_000


def event_key(line: Mapping[str, Any]) -> str:
    """An event's identity: its whole line as written (events carry their step and time)."""
    return json.dumps(dict(line), sort_keys=True, default=str)


class SeenEvents:
    """The lines delivered so far (at most ``limit``, oldest forgotten first)."""

    def __init__(self, limit: int = MAX_SEEN) -> None:
        self.limit = limit
        self._keys: dict[str, None] = {}  # insertion order: the oldest first

    def __len__(self) -> int:
        return len(self._keys)

    def fresh(self, lines: Iterable[object]) -> list[Event]:
        """The lines (JSON objects; anything else is skipped) not delivered before, typed, in
        order; they count as delivered from now on."""
        out: list[Event] = []
        for line in lines:
            if not isinstance(line, dict):
                continue
            key = event_key(line)
            if key in self._keys:
                continue  # sent again by a resumed stream: delivered once
            self._keys[key] = None
            if len(self._keys) > self.limit:
                del self._keys[next(iter(self._keys))]
            out.append(Event.from_json(line))  # the wire carries the lines as written
        return out
